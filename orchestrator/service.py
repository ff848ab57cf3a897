"""The session orchestrator: the operations behind ``session.*`` and ``acp.capabilities``.

Turns run in the orchestrator's own task group, not in the request's task: a client that
disconnects does not kill its turn (the update log keeps what it missed), and ``session.cancel``
from any connection of the same token reaches it. Every wait is bounded.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from anyio.abc import TaskGroup

from bridge.rpc.errors import InvalidParams, LimitReached, NotFound
from bridge.rpc.redact import redact
from compat.base import Attachment, TurnError, TurnOutcome, TurnRequest
from compat.pacing import turn_ends
from compat.settings import Limits, Timeouts
from orchestrator import updates
from orchestrator.registry import ProviderRegistry
from orchestrator.routing import Resolution, RoutingInput, resolve
from orchestrator.session import Session, Ticket
from orchestrator.turn import TurnRunner

if TYPE_CHECKING:  # pydantic: the handlers import the params models on first use (compat.settings)
    from orchestrator.models import PermissionParams, ResolveParams, TurnParams

log = logging.getLogger(__name__)
Notify = Callable[[str, Any], None]
SUMMARY_CHARS = 280


def _resolve(path: str, field: str) -> Path:
    """``realpath`` of a client path; NUL bytes and over-long paths are -32602, not crashes."""
    try:
        return Path(os.path.expanduser(path)).resolve()
    except (ValueError, OSError) as exc:
        raise InvalidParams(f"{field} is not a usable path", field=field) from exc


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)


class Orchestrator:
    """Owns sessions and runs turns on providers.

    Use as ``async with Orchestrator(...) as orch:``; leaving it cancels running turns and ends
    every provider process (bounded).

    Args:
        registry: the configured providers.
        roots: workspace roots (resolved); every workingDirectory and attachment must lie inside.
        limits / timeouts: the named settings of docs/api.md.
        gateway_configured: whether a gateway is configured (routing and capabilities).
        bridge_info: ``{name, version, contractVersion}`` for ``acp.capabilities``.
    """

    def __init__(
        self,
        registry: ProviderRegistry,
        roots: list[Path],
        limits: Limits,
        timeouts: Timeouts,
        *,
        gateway_configured: bool = False,
        bridge_info: dict[str, Any] | None = None,
        methods: list[str] | None = None,
        knowledge: Any = None,
    ) -> None:
        self.registry = registry
        self.roots = roots
        self.limits = limits
        self.timeouts = timeouts
        self.gateway_configured = gateway_configured
        self.bridge_info = bridge_info or {}
        self.methods = methods or []
        self.knowledge = knowledge  # the knowledge service (an async context manager), if any
        self._sessions: dict[str, Session] = {}
        self._tg: TaskGroup | None = None
        self._running = anyio.Semaphore(limits.max_running_turns, fast_acquire=True)  # no extra loop pass per turn
        self._capabilities: tuple[Any, dict[str, Any]] | None = None

    @property
    def idle(self) -> bool:
        """No turn is running."""
        return self._running.value == self.limits.max_running_turns

    async def __aenter__(self) -> Orchestrator:
        if self.knowledge is not None:
            await self.knowledge.__aenter__()
        self._tg = await anyio.create_task_group().__aenter__()
        await self.registry.start(self._tg)
        self._tg.start_soon(self._sweep_sessions)
        self._log_start()
        self._tg.start_soon(self.registry.probe_all)
        return self

    def _log_start(self) -> None:
        for root in self.roots:
            if not root.is_dir():
                log.warning("workspace root %s does not exist: turns cannot run there", root)
        for provider_id in self.registry.ids:
            probe = self.registry.status(provider_id)
            log.info("provider %s: %s%s", provider_id, probe.status, "" if probe.available else f" ({probe.detail})")

    async def __aexit__(self, *exc_info: Any) -> None:
        assert self._tg is not None
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(self.timeouts.cancel_grace + 10):
                for session in list(self._sessions.values()):
                    await self._end_provider_session(session)
            await self.registry.aclose()
        self._tg.cancel_scope.cancel()
        try:
            await self._tg.__aexit__(*exc_info)
        finally:
            if self.knowledge is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                    await self.knowledge.__aexit__(None, None, None)

    # ---- capabilities and routing ---------------------------------------------------------------

    def capabilities(self) -> dict[str, Any]:
        """``acp.capabilities``; rebuilt only when a probe result changed (it is the hottest call
        of a polling client, and building it walks every provider and pydantic model)."""
        key = self.registry.snapshot_key()
        if self._capabilities is None or self._capabilities[0] != key:
            self._capabilities = (key, self._build_capabilities())
        return self._capabilities[1]

    def _build_capabilities(self) -> dict[str, Any]:
        catalog = self.registry.catalog()
        targets = ["agent", "gateway"] if self.gateway_configured else ["agent"]
        gateways = (
            [
                {
                    "providerId": "openclaw",
                    "label": "OpenClaw",
                    "targets": ["gateway"],
                    "providerDisplay": {"logoEmoji": "🦞"},
                }
            ]
            if self.gateway_configured
            else []
        )
        single = any(entry["enabled"] for entry in catalog)
        return {
            "singleAgent": single,
            "multiAgent": False,
            "availableExecutionTargets": targets,
            "providerCatalog": catalog,
            "gatewayProviders": gateways,
            "providerProbeSummary": self.registry.probe_summary(),
            "capabilities": {
                "single_agent": single,
                "multi_agent": False,
                "providerCatalog": catalog,
                "gatewayProviders": gateways,
                "availableExecutionTargets": targets,
            },
            "bridge": self.bridge_info,
            "methods": self.methods,
            "limits": {**msgspec.to_builtins(self.limits), **msgspec.to_builtins(self.timeouts)},
        }

    def _route(self, prompt: str, routing: dict[str, Any] | None, model: str | None) -> Resolution:
        try:
            inp = RoutingInput.from_params(prompt, routing, model)
        except ValueError as exc:
            raise InvalidParams(f"Invalid params: {exc}", field="routing") from exc
        available = self.registry.available()
        # Auto routing picks a knowledge provider only when it is the only one available, and an
        # agent known to need authentication only when no agent is ready (explicit routing still
        # reaches it, and its turn then says how to authenticate).
        agents = [p for p in available if self.registry.category(p) != "knowledge"]
        agents = [p for p in agents if self.registry.status(p).available] or agents or available
        resolution = resolve(inp, available, self.gateway_configured, auto_available=agents)
        chosen = resolution.resolved_provider_id
        if resolution.unavailable_code == "PROVIDER_UNAVAILABLE" and chosen:
            if chosen not in self.registry.ids:
                resolution.unavailable_message = (
                    f"unknown provider: {chosen[:100]} (configured: {', '.join(self.registry.ids) or 'none'})"
                )
            else:
                reason = self.registry.status(chosen)
                resolution.unavailable_message = f"provider {chosen} is unavailable: {reason.detail or reason.status}"
        return resolution

    def resolve(self, params: ResolveParams) -> dict[str, Any]:
        return self._route(params.task_prompt, params.routing, params.model).to_wire()

    # ---- sessions -------------------------------------------------------------------------------

    def _owned(self, session_id: str, principal: str) -> Session | None:
        session = self._sessions.get(session_id)
        if session is not None and session.owner != principal:
            raise NotFound("unknown session", sessionId=session_id)
        return session

    def _session_for_turn(self, params: TurnParams, principal: str) -> Session:
        session = self._owned(params.session_id, principal)
        thread_id = params.thread_id or params.session_id
        if session is None:
            if len(self._sessions) >= self.limits.max_sessions and not self._evict_idle():
                raise LimitReached("too many sessions", limit="maxSessions", value=self.limits.max_sessions)
            session = Session(params.session_id, principal, thread_id, max_queued=self.limits.max_queued_turns)
            self._sessions[params.session_id] = session
        else:
            session.thread_id = thread_id
        return session

    def _evict_idle(self, older_than: float | None = None) -> int:
        """Forget idle sessions: the least recently used one (making room), or every one idle for
        longer than ``older_than`` seconds. Their agent processes end in the background."""
        idle = sorted((s for s in self._sessions.values() if not s.busy), key=lambda s: s.last_active)
        if older_than is not None:
            limit = time.monotonic() - older_than
            idle = [s for s in idle if s.last_active < limit]
        else:
            idle = idle[:1]
        for session in idle:
            self._sessions.pop(session.session_id, None)
            assert self._tg is not None
            self._tg.start_soon(self._end_provider_session, session)
            log.info("forgot idle session %s", session.session_id[:80])
        return len(idle)

    async def _sweep_sessions(self) -> None:
        interval = min(60.0, self.timeouts.session_idle_timeout / 2)
        while True:
            await anyio.sleep(interval)
            self._evict_idle(self.timeouts.session_idle_timeout)

    def _working_directory(self, requested: str | None) -> str:
        if requested is None:
            for root in self.roots:
                if root.is_dir():
                    return str(root)
            raise InvalidParams("no workspace root exists; create one or fix workspaceRoots", field="workingDirectory")
        real = _resolve(requested, "workingDirectory")
        if not real.is_dir():
            raise InvalidParams(
                f"workingDirectory is not an existing directory: {requested}"[:600], field="workingDirectory"
            )
        if not _inside(real, self.roots):
            raise InvalidParams(
                f"workingDirectory is outside the workspace roots: {requested}"[:600], field="workingDirectory"
            )
        return str(real)

    def _attachments(self, params: TurnParams) -> tuple[Attachment, ...]:
        out = []
        for index, item in enumerate(params.attachments):
            real = _resolve(item.path, f"attachments.{index}.path")
            if not _inside(real, self.roots) or not real.exists():
                raise InvalidParams(
                    "attachment path is missing or outside the workspace roots", field=f"attachments.{index}.path"
                )
            out.append(Attachment(item.name or real.name, str(real), item.description))
        return tuple(out)

    async def run_turn(self, params: TurnParams, principal: str, notify: Notify, *, start: bool) -> dict[str, Any]:
        """``session.start`` (start=True) or ``session.message``: run one turn and return its result.

        Everything before the first ``await`` is synchronous, so turns are queued in the order the
        requests were read.

        Raises:
            InvalidParams: -32602, bad workingDirectory or attachment.
            NotFound: -32004, the session belongs to another token.
            SessionBusy: -32005 (``turn_running`` / ``queue_full``).
            LimitReached: -32006, ``maxSessions`` sessions exist.
        """
        cwd = self._working_directory(params.working_directory)
        attachments = self._attachments(params)
        resolution = self._route(params.task_prompt, params.routing, params.model)
        session = self._session_for_turn(params, principal)
        base = {"sessionId": session.session_id, "threadId": session.thread_id}
        if resolution.unavailable:
            return {**base, "success": False, "status": "unavailable", **resolution.to_wire()}
        ticket = session.admit(start=start)
        try:
            await self._preflight(resolution.resolved_provider_id, params)
        except BaseException:
            session.release(ticket)
            raise
        done = anyio.Event()
        box: dict[str, Any] = {}

        async def execute() -> None:
            try:
                await ticket.ready.wait()
                if ticket.cancelled:
                    box["result"] = self._cancelled_before_start(base, resolution)
                    return
                async with self._running:  # bounds concurrent turns (agent spawns) bridge-wide
                    box["result"] = await self._execute(
                        session, ticket, params, resolution, cwd, attachments, principal, notify, start
                    )
            except BaseException:
                box["result"] = None
                raise
            finally:
                session.release(ticket)
                done.set()

        assert self._tg is not None, "use the Orchestrator as an async context manager"
        self._tg.start_soon(execute)
        await done.wait()
        if box.get("result") is None:
            raise RuntimeError("turn task failed")
        return box["result"]

    async def _preflight(self, provider_id: str, params: TurnParams) -> None:
        """Let the provider reject params before the turn exists (no turnId, no updates).

        Raises:
            InvalidParams: -32602 from the provider (e.g. ``RETRIEVAL_MODE_UNSUPPORTED``).
        """
        preflight = getattr(self.registry.get(provider_id), "preflight", None)
        if preflight is not None:
            await preflight(params.extra_params())

    def _cancelled_before_start(self, base: dict[str, Any], resolution: Resolution) -> dict[str, Any]:
        return {
            **base,
            "success": False,
            "status": "cancelled",
            "turnId": None,
            "output": "",
            "summary": "",
            "stopReason": "cancelled",
            **_resolved(resolution),
            "error": {
                "code": "CANCELLED",
                "message": "cancelled before it started",
                "providerId": resolution.resolved_provider_id,
            },
        }

    async def _prepare_provider(self, session: Session, provider_id: str, start: bool) -> bool:
        """Make sure the session has a provider session for ``provider_id``; True if context was lost."""
        reset = False
        if start:
            session.history.clear()
            await self._end_provider_session(session)
        elif session.provider_id not in (None, provider_id):
            reset = bool(session.history)
            await self._end_provider_session(session)
        if session.provider_session is None:
            adapter = self.registry.get(provider_id)
            assert adapter is not None
            session.provider_session = adapter.open_session(session.session_id)
            session.provider_id = provider_id
        return reset

    async def _execute(
        self,
        session: Session,
        ticket: Ticket,
        params: TurnParams,
        resolution: Resolution,
        cwd: str,
        attachments: tuple[Attachment, ...],
        principal: str,
        notify: Notify,
        start: bool,
    ) -> dict[str, Any]:
        provider_id = resolution.resolved_provider_id
        base = {"sessionId": session.session_id, "threadId": session.thread_id}
        await self.registry.wait_probe(provider_id, self.timeouts.initialize_timeout)
        if ticket.cancelled:  # session.cancel while it waited: it never started
            return self._cancelled_before_start(base, resolution)
        reset = await self._prepare_provider(session, provider_id, start)
        if ticket.cancelled:
            return self._cancelled_before_start(base, resolution)
        provider = session.provider_session
        assert provider is not None and self._tg is not None
        turn_id = f"turn-{time.time_ns()}"
        tg = self._tg
        runner = TurnRunner(
            session, turn_id, notify, self.limits, self.timeouts, on_output_limit=lambda: tg.start_soon(provider.cancel)
        )
        session.current_turn = runner
        request = TurnRequest(
            session_id=session.session_id,
            thread_id=session.thread_id,
            turn_id=turn_id,
            prompt=params.task_prompt,
            working_directory=cwd,
            model=resolution.resolved_model or None,
            attachments=attachments,
            principal=principal,
            extra=params.extra_params(),
        )
        started = time.monotonic()
        runner.publish(updates.started())
        try:
            outcome = await self._bounded_turn(provider, request, runner)
            # Still the running turn meanwhile: a session.cancel read now marks it cancelled.
            with anyio.CancelScope(shield=True):  # bounded: the turn ends that came first
                await turn_ends().wait()  # the done update and the reply: one turn per pass
        finally:
            session.current_turn = None
        outcome = self._final_outcome(outcome, runner)
        self.registry.note_turn(provider_id, outcome)
        output = outcome.output_override if outcome.output_override is not None else runner.output
        error_code = outcome.error.code if outcome.error else None
        runner.finish(
            outcome.status,
            output
            if outcome.status == "completed" or output
            else (outcome.error.message if outcome.error else outcome.status),
            error_code,
        )
        session.working_directory = cwd
        session.record("user", params.task_prompt)
        if output:
            session.record("assistant", output)
        log.info(
            "turn %s on %s ended %s%s in %.2fs",
            turn_id,
            provider_id,
            outcome.status,
            f" ({error_code})" if error_code else "",
            time.monotonic() - started,
        )
        return self._result(session, resolution, turn_id, outcome, output, reset)

    async def _bounded_turn(self, provider: Any, request: TurnRequest, runner: TurnRunner) -> TurnOutcome:
        # Adapters bound their own turns; this outer bound only guards against an adapter bug.
        limit = self.timeouts.turn_timeout + 2 * self.timeouts.cancel_grace + 15
        with anyio.move_on_after(limit):
            try:
                return await provider.run_turn(request, runner)
            except Exception as exc:
                log.exception("adapter failed")
                return TurnOutcome("failed", error=TurnError("INTERNAL_ERROR", f"adapter failed: {type(exc).__name__}"))
        return TurnOutcome("timeout", error=TurnError("TURN_TIMEOUT", "the turn did not end in time"))

    def _final_outcome(self, outcome: TurnOutcome, runner: TurnRunner) -> TurnOutcome:
        if runner.output_exceeded:
            message = f"the turn's output passed maxOutputBytes ({self.limits.max_output_bytes} bytes)"
            return TurnOutcome(
                "failed",
                stop_reason=outcome.stop_reason,
                usage=outcome.usage,
                error=TurnError("OUTPUT_LIMIT", message),
                upstream_session_id=outcome.upstream_session_id,
                resolved_model=outcome.resolved_model,
                context_reset=outcome.context_reset,
            )
        if runner.cancel_requested and outcome.status in ("completed", "failed"):
            return TurnOutcome(
                "cancelled",
                stop_reason="cancelled",
                usage=outcome.usage,
                upstream_session_id=outcome.upstream_session_id,
                resolved_model=outcome.resolved_model,
                context_reset=outcome.context_reset,
            )
        return outcome

    def _result(
        self, session: Session, resolution: Resolution, turn_id: str, outcome: TurnOutcome, output: str, reset: bool
    ) -> dict[str, Any]:
        result: dict[str, Any] = {
            "success": outcome.status == "completed",
            "status": outcome.status,
            "turnId": turn_id,
            "sessionId": session.session_id,
            "threadId": session.thread_id,
            **_resolved(resolution),
            "resolvedModel": outcome.resolved_model or "",
            "output": output,
            "summary": output.strip()[:SUMMARY_CHARS],
            "stopReason": outcome.stop_reason or ("end_turn" if outcome.status == "completed" else outcome.status),
            "usage": outcome.usage or {},
            "upstreamSessionId": outcome.upstream_session_id,
            "contextReset": bool(reset or outcome.context_reset),
        }
        if outcome.error is not None and outcome.status != "completed":
            error: dict[str, Any] = {
                "code": outcome.error.code,
                "message": redact(outcome.error.message),
                "providerId": resolution.resolved_provider_id,
            }
            if outcome.error.data:
                error["data"] = outcome.error.data
            result["error"] = error
        result.update(outcome.extra)
        return result

    # ---- cancel, close, permission --------------------------------------------------------------

    def cancel(self, session_id: str, principal: str) -> dict[str, Any]:
        """``session.cancel``: ``{accepted: true, cancelled: <a turn was running>}``.

        Raises:
            NotFound: -32004, the session belongs to another token.
        """
        session = self._owned(session_id, principal)
        if session is None:
            return {"accepted": True, "cancelled": False}
        queued = session.cancel_waiting() + int(session.cancel_active())
        runner = session.current_turn
        if runner is not None and not runner.cancel_requested:
            runner.cancel_requested = True  # new permission requests are refused from now on
            assert self._tg is not None
            self._tg.start_soon(self._cancel_turn, session.provider_session, runner)
        return {"accepted": True, "cancelled": runner is not None or queued > 0}

    async def _cancel_turn(self, provider: Any, runner: TurnRunner) -> None:
        # ACP order: session/cancel goes out before pending permission requests are answered
        # "cancelled" (the adapter answers its own); the client-facing ones are released after.
        try:
            if provider is not None:
                await provider.cancel()
        finally:
            runner.cancel_permissions()

    async def close(self, session_id: str, principal: str) -> dict[str, Any]:
        """``session.close``: cancel, end the provider session and its process, forget the session."""
        session = self._owned(session_id, principal)
        if session is None:
            return {"accepted": True, "closed": False}
        self.cancel(session_id, principal)
        self._sessions.pop(session_id, None)
        with anyio.CancelScope(shield=True):
            await self._end_provider_session(session)
        return {"accepted": True, "closed": True}

    async def _end_provider_session(self, session: Session) -> None:
        provider, session.provider_session, session.provider_id = session.provider_session, None, None
        if provider is not None:
            with anyio.move_on_after(self.timeouts.cancel_grace + 10):
                await provider.aclose()

    def permission(self, params: PermissionParams, principal: str) -> dict[str, Any]:
        """``session.permission``: answer a pending ``ask`` permission request.

        Raises:
            NotFound: -32004, unknown session/request, already answered, or another token's session.
            InvalidParams: -32602, ``optionId`` is not one of the request's options.
        """
        session = self._owned(params.session_id, principal)
        pending = session.permissions.get(params.request_id) if session else None
        if pending is None or pending.answered.is_set():
            raise NotFound("unknown or already answered permission request", requestId=params.request_id)
        if pending.option_ids and params.option_id not in pending.option_ids:
            raise InvalidParams("optionId is not one of the request's options", field="optionId")
        pending.answer(params.option_id)
        return {"accepted": True}


def _resolved(resolution: Resolution) -> dict[str, Any]:
    wire = resolution.to_wire()
    return {
        k: wire[k]
        for k in (
            "resolvedExecutionTarget",
            "resolvedProviderId",
            "resolvedGatewayProviderId",
            "resolvedModel",
            "resolvedSkills",
        )
    }
