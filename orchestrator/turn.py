"""One turn of one session: the task that runs it, the one cancel scope that bounds it, the state
machine it drives (``orchestrator.machine``), and the ``TurnSink`` its provider reports to.

Every way a turn can stop is a trigger fed to :meth:`Turn.fire`, and each side effect hangs off a
transition there: a stop asks the provider for a graceful stop (``request_cancel``) and gives it
``cancelGrace`` seconds by moving the scope's deadline, or cuts it off at once by cancelling the
scope; leaving RUNNING answers pending permission requests. ``turnTimeout`` is the scope's
deadline. Nothing a turn raises reaches the orchestrator: an unexpected error is that turn's
failure (``INTERNAL_ERROR``), logged with its traceback.

Publishing never blocks: connections buffer with a bound and drop slow clients, so a stuck client
cannot stall an agent (field-failures #7). The sink outlives the turn: what the provider reports
after the result (a chunk written behind the agent's answer) is still published as part of this
turn, with the next ``seq``.

Must not import: ``bridge`` (except ``bridge.rpc``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol
from uuid import uuid4

import anyio
import msgspec
from msgspec import UNSET

from bridge.rpc import logctx
from bridge.rpc.codec import cut_utf8, utf8_len
from bridge.rpc.redact import redact
from compat import tracing
from compat.base import (
    Attachment,
    ClientLink,
    KeepsHistory,
    PermissionEvent,
    ProviderSession,
    Resumable,
    SessionStateEvent,
    TextDelta,
    ThoughtDelta,
    TurnEvent,
    TurnOutcome,
    TurnRequest,
    WaitingEvent,
)
from compat.settings import Limits, Timeouts
from compat.telemetry import METRICS
from orchestrator import artifacts, updates
from orchestrator.machine import Trigger, TurnMachine, TurnState
from orchestrator.results import TurnErrorInfo, TurnResult
from orchestrator.routing import Resolution
from orchestrator.sessions import PendingPermission, Session
from orchestrator.store import Upstream

if TYPE_CHECKING:
    from orchestrator.registry import ProviderRegistry

log = logging.getLogger(__name__)
Notify = Callable[[str, Any], None]
SUMMARY_CHARS = 280
_LIVE = (TurnState.STARTING, TurnState.RUNNING, TurnState.CANCELLING, TurnState.FINISHING)
_CAN_STOP = (TurnState.QUEUED, TurnState.STARTING, TurnState.RUNNING, TurnState.CANCELLING)


_NO_OUTCOME = TurnOutcome("cancelled")
"""What a turn cut off before its provider answered reports: no usage, no error of its own."""
_last_turn_ns = 0


def new_turn_id() -> str:
    """``turn-<nanoseconds since the epoch>`` (the original bridge's form), never the same twice."""
    global _last_turn_ns
    _last_turn_ns = max(time.time_ns(), _last_turn_ns + 1)
    return f"turn-{_last_turn_ns}"


class TurnHost(Protocol):
    """What a turn needs from the orchestrator."""

    limits: Limits
    timeouts: Timeouts
    registry: ProviderRegistry
    running: anyio.Semaphore  # turns running at once, bridge-wide (``maxRunningTurns``)

    async def provider_for(self, session: Session, provider_id: str, *, start: bool) -> tuple[ProviderSession, bool]:
        """The session's provider session for ``provider_id`` and whether context was lost."""
        ...


class TurnInput:
    """What the orchestrator decided before admitting the turn (all checked already)."""

    __slots__ = (
        "attachments",
        "client",
        "collect_artifacts",
        "config_options",
        "content",
        "cwd",
        "extra",
        "mcp_servers",
        "not_listed",
        "principal",
        "prompt",
        "resolution",
        "start",
        "turn_id",
    )

    def __init__(
        self,
        *,
        prompt: str,
        cwd: str,
        attachments: tuple[Attachment, ...],
        resolution: Resolution,
        principal: str,
        start: bool,
        extra: dict[str, Any],
        turn_id: str = "",
        collect_artifacts: bool = False,
        not_listed: str | None = None,
        editor: EditorInput | None = None,
    ) -> None:
        self.turn_id = turn_id or new_turn_id()  # also names the folder of its inline attachments
        self.collect_artifacts = collect_artifacts  # list cwd before the turn: its new files are artifacts
        self.not_listed = not_listed  # a folder the listing skips (the remote workspaces)
        self.prompt = prompt
        self.cwd = cwd
        self.attachments = attachments
        self.resolution = resolution
        self.principal = principal
        self.start = start
        self.extra = extra
        self.content = editor.content if editor is not None else ()
        self.mcp_servers = editor.mcp_servers if editor is not None else ()
        self.client = editor.client if editor is not None else None
        self.config_options = dict(editor.config_options) if editor is not None else {}


class EditorInput(msgspec.Struct, frozen=True):
    """What an ACP editor adds to a turn (editor mode; ``compat.base.TurnRequest`` has the same
    fields): its prompt's content blocks, its ``mcpServers``, and the link for ``fs/*`` and
    ``terminal/*``."""

    content: tuple[dict[str, Any], ...] = ()
    mcp_servers: tuple[dict[str, Any], ...] = ()
    client: ClientLink | None = None
    config_options: dict[str, str] = msgspec.field(default_factory=dict)


class Turn:
    """One turn: create it, ``session.admit`` it, run :meth:`run` in a task, await :attr:`ended`.

    Args:
        host: the orchestrator.
        session: the bridge session.
        spec: what to run.

    Its updates go to the session's log, which delivers them to every stream listening to the
    session (the requesting one among them, ``Orchestrator.run_turn``).
    """

    def __init__(self, host: TurnHost, session: Session, spec: TurnInput) -> None:
        self.machine = TurnMachine()
        self.turn_id: str | None = None
        self.result: TurnResult | None = None
        self.ended = anyio.Event()
        self.provider: ProviderSession | None = None
        self._host = host
        self._session = session
        self._spec = spec
        self._limits = host.limits
        self.started_at = 0.0  # time.time() when it began (its stored record's startedAt)
        self._context_restored = ""  # "history": the stored conversation was given to a new agent session
        self._scope = anyio.CancelScope()
        self._outcome: TurnOutcome | None = None
        self._context_reset = False
        self._parts: list[str] = []
        self._output_bytes = 0
        self._thought_bytes = 0
        self._started = 0.0
        self._announced = False  # the ``started`` update is out: a ``done`` must follow
        self._history_index: int | None = None  # where this turn's answer sits in the session's history
        self.first_seq: int | None = None  # the seq of its first update, once it published one
        # time.monotonic() of the last update published (or of the wait's start): read on every
        # streamed chunk, where anyio.current_time() (a sniffio lookup) was 6% of bench case 4's CPU
        self._quiet_since = 0.0
        self._waiting_for_slot = False  # waiting for one of maxRunningTurns
        self._provider_wait: str | None = None  # what the provider said it waits for (WaitingEvent)
        self.files_before: artifacts.Listing | None = None  # cwd before the provider ran (collect_artifacts)
        self.artifacts_omitted = ""  # why the files were not listed

    @property
    def state(self) -> TurnState:
        return self.machine.state

    @property
    def stopping(self) -> bool:
        """A stop was asked and the turn is ending (CANCELLING)."""
        return self.machine.state is TurnState.CANCELLING

    @property
    def prompt(self) -> str:
        """What the client asked (its stored record keeps it while the turn runs)."""
        return self._spec.prompt

    @property
    def output(self) -> str:
        """The text streamed so far (a chunk that came after the result included)."""
        return "".join(self._parts)

    # ---- the one place a turn's state changes ----------------------------------------------------

    def fire(self, trigger: Trigger) -> TurnState:
        """Apply ``trigger`` and its side effects.

        Raises:
            orchestrator.machine.TurnStateError: ``trigger`` is not allowed now (a bridge bug).
        """
        old = self.machine.state
        new = self.machine.fire(trigger)
        if new is TurnState.CANCELLING and old is not TurnState.CANCELLING:
            graceful = old is TurnState.RUNNING and trigger in (Trigger.CANCEL, Trigger.OUTPUT_LIMIT)
            self._stop(graceful)
        elif new is TurnState.CANCELLING and trigger in (Trigger.CLOSE, Trigger.SHUTDOWN):
            self._scope.cancel()  # no more grace
        elif new is TurnState.ENDED and old is TurnState.QUEUED:
            self._scope.cancel()  # wake the waiting task: it ends the turn
        if new is TurnState.FINISHING and old is not TurnState.FINISHING:
            self._release_permissions()
        return new

    @property
    def planned_turn_id(self) -> str:
        """The turn's id, before it starts too (:attr:`turn_id` is None until then, and this id
        once it started)."""
        return self._spec.turn_id

    def stop(self, trigger: Trigger) -> bool:
        """A stop from outside (``cancel``, ``close``, ``shutdown``); whether the turn will end
        because of it (False once its outcome is known)."""
        state = self.machine.state
        if state is TurnState.ENDED:
            return False
        self.fire(trigger)
        return state in _CAN_STOP

    def _stop(self, graceful: bool) -> None:
        provider = self.provider
        if graceful and provider is not None and provider.request_cancel():
            # ACP order: session/cancel went out first, then pending permissions are answered.
            self._release_permissions()
            self._scope.deadline = min(self._scope.deadline, anyio.current_time() + self._host.timeouts.cancel_grace)
        else:
            self._release_permissions()
            self._scope.cancel()

    def _release_permissions(self) -> None:
        for pending in tuple(self._session.permissions.values()):
            pending.answer(None)

    # ---- the task --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run the turn to its end; never raises (but for the cancellation of the caller)."""
        logctx.bind(sessionId=self._session.session_id, turnId=self._spec.turn_id)  # this task's own context
        with tracing.span("turn", {"xworkmate.provider": self._spec.resolution.provider_key}) as span:
            try:
                with self._scope:
                    await self._session.wait_turn(self)
                    if self.machine.state is TurnState.ENDED:  # stopped before this task first ran
                        return
                    self.fire(Trigger.ADMIT)
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._report_waits)
                        await self._execute()
                        tg.cancel_scope.cancel()
            except Exception:
                log.exception("turn %s on session %s failed unexpectedly", self.turn_id, self._session.session_id[:80])
                if self.machine.allows(Trigger.CRASH):
                    self.fire(Trigger.CRASH)
            finally:
                self._finish()  # never awaits: a cancelled caller still gets the turn's end
                result = self.result
                tracing.annotate(
                    span,
                    **{
                        "xworkmate.turn_id": self.turn_id,
                        "xworkmate.status": getattr(result, "status", None),
                        "xworkmate.stop_reason": getattr(result, "stop_reason", None) or None,
                    },
                )

    async def _execute(self) -> None:
        spec, host = self._spec, self._host
        provider_id = spec.resolution.provider_key
        self.turn_id = spec.turn_id
        self._started = time.monotonic()
        self._scope.deadline = anyio.current_time() + host.timeouts.turn_timeout
        self._announced = True
        self.started_at = time.time()
        self._session.working_directory = spec.cwd  # session.get shows it while the turn runs
        self._session.save_turn(self)  # recorded as running: a restart finds it (BRIDGE_RESTARTED)
        self.publish(updates.started())
        self._send_unsent_state()
        self._waiting_for_slot = True
        async with host.running:  # bounds the turns running at once (agent spawns), bridge-wide
            self._waiting_for_slot = False
            self._quiet_since = time.monotonic()  # a new wait: for the agent to start
            if spec.collect_artifacts:
                await self._list_files()
            await self._run_provider(provider_id, self.turn_id)

    async def _list_files(self) -> None:
        limit = self._limits.max_artifact_scan_files
        try:
            self.files_before = await anyio.to_thread.run_sync(
                artifacts.listing, self._spec.cwd, limit, self._spec.not_listed
            )
        except artifacts.TooManyFiles:
            self.artifacts_omitted = (
                f"more than {limit} files in the working directory (maxArtifactScanFiles): no artifacts"
            )

    async def _run_provider(self, provider_id: str, turn_id: str) -> None:
        spec, host = self._spec, self._host
        await host.registry.wait_probe(provider_id, host.timeouts.initialize_timeout)
        before = self._session.provider_id
        self.provider, self._context_reset = await host.provider_for(self._session, provider_id, start=spec.start)
        if self._session.provider_id != before:  # readable at once (another process's session.get)
            self._session.save()
        prompt, content, fallback = spec.prompt, spec.content, None
        if self._session.restored:  # a new agent session continues a stored conversation
            self._session.restored = False
            if not spec.start and self._session.history:
                upstream = self._session.upstream
                if isinstance(self.provider, KeepsHistory):
                    self.provider.restore_history(list(self._session.history))
                    self._context_restored = "history"
                elif (
                    upstream is not None
                    and upstream.provider_id == provider_id
                    and upstream.working_directory == spec.cwd
                    and isinstance(self.provider, Resumable)
                    and self.provider.resume(upstream.session_id, spec.cwd)
                ):  # the agent may load its own session: the stored conversation is its fallback
                    fallback = with_history(self._session.history, prompt)
                else:
                    prompt = with_history(self._session.history, prompt)
                    content = ()  # the text, with the history before it, is what the agent gets
                    self._context_restored = "history"
        request = TurnRequest(
            session_id=self._session.session_id,
            thread_id=self._session.thread_id,
            turn_id=turn_id,
            prompt=prompt,
            working_directory=spec.cwd,
            model=spec.resolution.resolved_model or None,
            attachments=spec.attachments,
            principal=spec.principal,
            extra=spec.extra,
            content=content,
            mcp_servers=spec.mcp_servers,
            client=spec.client,
            config_options=spec.config_options,
            fallback_prompt=fallback,
        )
        self._outcome = await self.provider.run_turn(request, self)
        if self._outcome.context_restored:
            self._context_restored = self._outcome.context_restored
        self.fire(Trigger.RESULT)

    def withdraw(self, trigger: Trigger) -> None:
        """End a turn whose task never started: ``refuse`` (its params were refused) or
        ``shutdown`` (the bridge began to stop before it could run). Sets :attr:`ended`."""
        if self.machine.allows(trigger):
            self.fire(trigger)
        self._finish()

    def _finish(self) -> None:
        """After the scope: decide the end, publish ``done``, build the result, give up the slot."""
        state = self.machine.state
        if state in (TurnState.STARTING, TurnState.RUNNING):
            if anyio.current_time() >= self._scope.deadline:
                self.fire(Trigger.TIMEOUT)  # the scope's deadline, turnTimeout, cut the provider off
            else:  # cut off from outside: the task group that runs turns is being cancelled
                self.fire(Trigger.SHUTDOWN)
                self.fire(Trigger.STOPPED)
        elif state is TurnState.CANCELLING:
            self.fire(Trigger.STOPPED)
        try:
            if self._announced:
                self.result = self._ended()
            else:  # stopped (or failed) before it started: no updates, no turnId
                if self.machine.state is TurnState.FINISHING:
                    self.fire(Trigger.FINISHED)
                self.result = self._never_started()
        except Exception:  # a bug here must not reach the orchestrator's task group
            log.exception("turn %s on session %s: ending it failed", self.turn_id, self._session.session_id[:80])
            self.result = self._bare_result("failed", "INTERNAL_ERROR", "the bridge failed unexpectedly; see its log")
        finally:
            self._session.save_turn(self, self.result)
            self._session.save()
            self._session.release(self)
            self.ended.set()

    async def _report_waits(self) -> None:
        """While the turn starts or runs and nothing has been published for ``progressInterval``
        seconds, publish a ``waiting`` status update (and again each interval the silence lasts),
        so a client can tell a wait from a hang. An ordinary update: numbered and logged."""
        interval = self._host.timeouts.progress_interval
        next_at = self._quiet_since + interval
        while True:
            await anyio.sleep(max(0.0, next_at - time.monotonic()))
            now = time.monotonic()
            if now - self._quiet_since < interval:  # something was published meanwhile
                next_at = self._quiet_since + interval
                continue
            reason = self._wait_reason()
            if reason is not None:
                gateway = self._spec.resolution.resolved_execution_target == "gateway"
                self.publish(updates.waiting(reason, int(now - self._quiet_since), gateway=gateway), quiet=True)
            next_at = now + interval

    def _wait_reason(self) -> str | None:
        state = self.machine.state
        if state is TurnState.STARTING:
            return "capacity" if self._waiting_for_slot else (self._provider_wait or "starting")
        if state is TurnState.RUNNING:
            return "permission" if self._session.permissions else "output"
        return None  # stopping or finishing: the end is bounded and near

    # ---- the end ---------------------------------------------------------------------------------

    def _verdict(self) -> tuple[str, str | None, str]:
        """``(status, error code, error message)`` from what happened to the turn."""
        m, outcome = self.machine, self._outcome
        if m.finished_by is Trigger.CRASH:
            return "failed", "INTERNAL_ERROR", "the bridge failed unexpectedly; see its log"
        if m.output_limited:
            return (
                "failed",
                "OUTPUT_LIMIT",
                f"the turn's output passed maxOutputBytes ({self._limits.max_output_bytes} bytes)",
            )
        if m.finished_by is Trigger.TIMEOUT:
            return "timeout", "TURN_TIMEOUT", f"turn exceeded {self._host.timeouts.turn_timeout:g} s"
        if m.cause in (Trigger.CANCEL, Trigger.CLOSE, Trigger.SHUTDOWN) or outcome is None:
            return "cancelled", None, "cancelled"
        if outcome.error is not None and outcome.status != "completed":
            return outcome.status, outcome.error.code, outcome.error.message
        return outcome.status, None, outcome.status

    def _ended(self) -> TurnResult:
        status, code, message = self._verdict()
        outcome = self._outcome or _NO_OUTCOME
        output = self.output
        self._parts = [output]  # one string from here on: a session keeps its last turn
        done_text = output if status == "completed" or output else message
        self.publish(updates.done(status, cut_utf8(done_text, self._limits.done_message_bytes), code))
        self.fire(Trigger.FINISHED)
        resolution = self._spec.resolution
        self._host.registry.note_turn(resolution.provider_key, status, code, message)
        METRICS.turns.inc(resolution.provider_key, status)
        METRICS.turn_seconds.observe(time.monotonic() - self._started, resolution.provider_key)
        self._record(output)
        log.info(
            "turn %s on %s ended %s%s in %.2fs",
            self.turn_id,
            resolution.provider_key,
            status,
            f" ({code})" if code else "",
            time.monotonic() - self._started,
        )
        error: Any = UNSET
        if code is not None:
            data = outcome.error.data if outcome.error is not None and outcome.error.code == code else None
            error = TurnErrorInfo(
                code=code,
                message=redact(message),
                provider_id=resolution.provider_key,
                data=data if data else UNSET,
            )
        provider = self.provider
        upstream = outcome.upstream_session_id or (provider.upstream_session_id if provider is not None else None)
        if upstream and resolution.provider_key:  # for a restart: the agent may load it again
            self._session.upstream = Upstream(resolution.provider_key, upstream, self._spec.cwd)
        stop_reason = outcome.stop_reason if status == outcome.status and outcome.stop_reason else None
        return TurnResult(
            success=status == "completed",
            status=status,
            turn_id=self.turn_id,
            session_id=self._session.session_id,
            thread_id=self._session.thread_id,
            resolved_execution_target=resolution.resolved_execution_target,
            resolved_provider_id=resolution.resolved_provider_id,
            resolved_gateway_provider_id=resolution.resolved_gateway_provider_id,
            resolved_model=outcome.resolved_model or "",
            resolved_skills=list(resolution.resolved_skills),
            resolved_working_directory=self._spec.cwd,
            output=output,
            summary=output.strip()[:SUMMARY_CHARS],
            stop_reason=stop_reason or ("end_turn" if status == "completed" else status),
            usage=outcome.usage or {},
            upstream_session_id=upstream,
            context_reset=self._context_reset or outcome.context_reset,
            context_restored=self._context_restored or UNSET,
            **resolution.preference(),
            error=error,
            artifacts=outcome.artifacts if outcome.artifacts is not None else UNSET,
            mode=outcome.mode or UNSET,
            run_id=outcome.run_id or UNSET,
        )

    def _never_started(self) -> TurnResult:
        if self.machine.finished_by is Trigger.CRASH:
            return self._bare_result("failed", "INTERNAL_ERROR", "the bridge failed unexpectedly; see its log")
        return self._bare_result("cancelled", "CANCELLED", "cancelled before it started")

    def _bare_result(self, status: str, code: str, message: str) -> TurnResult:
        """A result with no output: the turn never started (no ``turnId``), or ending it failed."""
        resolution = self._spec.resolution
        return TurnResult(
            success=False,
            status=status,
            turn_id=self.turn_id if self._announced else None,
            session_id=self._session.session_id,
            thread_id=self._session.thread_id,
            resolved_execution_target=resolution.resolved_execution_target,
            resolved_provider_id=resolution.resolved_provider_id,
            resolved_gateway_provider_id=resolution.resolved_gateway_provider_id,
            resolved_model=resolution.resolved_model,
            resolved_skills=list(resolution.resolved_skills),
            resolved_working_directory=self._spec.cwd,
            output="",
            summary="",
            stop_reason=status,
            **resolution.preference(),
            error=TurnErrorInfo(code=code, message=message, provider_id=resolution.provider_key),
        )

    def _record(self, output: str) -> None:
        session = self._session
        session.record("user", self._spec.prompt)
        if output:
            session.record("assistant", output)
            self._history_index = len(session.history) - 1

    # ---- TurnSink ----------------------------------------------------------------------------------

    def begin(self) -> None:
        """The provider began the work (ACP: its prompt is out)."""
        if self.machine.state in (TurnState.STARTING, TurnState.CANCELLING):
            self.fire(Trigger.BEGIN)
            self._quiet_since = time.monotonic()  # a new wait: for the agent's output

    def emit(self, event: TurnEvent) -> None:
        if isinstance(event, TextDelta):  # the hot one first: every streamed chunk
            self._text(event.text)
        elif isinstance(event, SessionStateEvent):
            self._state(event)
        elif isinstance(event, ThoughtDelta):
            # Reasoning is not output, but it is streamed and logged: the same budget bounds it.
            self._thought_bytes += utf8_len(event.text)
            if self._thought_bytes <= self._limits.max_output_bytes:
                self.publish(updates.from_event(event))
        elif isinstance(event, WaitingEvent):
            self._provider_wait = event.reason or None
            if event.reason:  # said at once, then every progressInterval the wait lasts
                self.publish(updates.waiting(event.reason, 0), quiet=True)
        else:
            self.publish(updates.from_event(event))

    async def ask_permission(self, tool_call: dict[str, Any], options: list[dict[str, Any]]) -> str | None:
        """Policy ``ask``: publish a ``permission`` update and wait for ``session.permission``.

        Returns the chosen optionId, or None after ``permissionTimeout`` seconds, or once the turn
        stops running (cancelled, cut off, ended).
        """
        if self.machine.state is not TurnState.RUNNING:
            return None
        request_id = f"perm-{uuid4().hex}"
        ids = frozenset(str(o.get("optionId")) for o in options if isinstance(o, dict))
        pending = PendingPermission(ids)
        self._session.permissions[request_id] = pending
        try:
            self.emit(PermissionEvent(request_id, tool_call, options))
            with anyio.move_on_after(self._host.timeouts.permission_timeout):
                await pending.answered.wait()
        finally:
            self._session.permissions.pop(request_id, None)
            pending.answer(None)  # timed out or cut off: whoever waits for the answer stops waiting
        return pending.option_id

    def publish(self, params: dict[str, Any], *, quiet: bool = False) -> None:
        """Log ``params`` as this turn's next update (numbered) and send it to its connection.
        ``quiet``: a ``waiting`` update, which does not end the silence it reports."""
        if not quiet:
            self._quiet_since = time.monotonic()
        full = {"sessionId": self._session.session_id, "threadId": self._session.thread_id, "turnId": self.turn_id}
        full.update(params)
        self._session.log.append(full)
        if self.first_seq is None:
            self.first_seq = full["seq"]

    def _text(self, text: str) -> None:
        if not text or (self.machine.output_limited and self.machine.state is not TurnState.ENDED):
            return
        room = self._limits.max_output_bytes - self._output_bytes
        if room <= 0 and self.machine.state is TurnState.ENDED:
            return  # a late chunk past the limit: nothing of it is kept
        size = utf8_len(text)
        passed = size > room
        if passed:
            text = cut_utf8(text, room)
            size = utf8_len(text)
        if not self._parts and self._started:
            METRICS.first_delta_seconds.observe(time.monotonic() - self._started, self._spec.resolution.provider_key)
        self._parts.append(text)
        self._output_bytes += size
        if text:
            # A single update stays under maxUpdateBytes; 4 bytes per character bounds UTF-8 size.
            step = max(1, self._limits.max_update_bytes // 4 - 512)
            if len(text) <= step:
                self.publish(updates.delta(text))
            else:
                for start in range(0, len(text), step):
                    self.publish(updates.delta(text[start : start + step]))
        if self.machine.state is TurnState.ENDED:
            self._session.amend_history(self._late_output)  # joined once, when next read
        elif passed:
            self.fire(Trigger.OUTPUT_LIMIT)

    def _late_output(self, history: deque[tuple[str, str]]) -> None:
        """Chunks came after the result: they are part of this turn's recorded answer too."""
        index = self._history_index
        output = self.output
        self._parts = [output]
        if index is not None and index == len(history) - 1:
            history[index] = ("assistant", output)
        elif output and history and history[-1] == ("user", self._spec.prompt):
            history.append(("assistant", output))
            self._history_index = len(history) - 1

    def _state(self, event: SessionStateEvent) -> None:
        session = self._session
        session.state[event.kind] = event.data
        active = session.active
        if self.machine.state in _LIVE:
            self.publish(updates.from_event(event))
        elif isinstance(active, Turn) and active is not self and active._announced and active.machine.state in _LIVE:
            # Late state of this ended turn while the next one already streams (its unsent
            # state went out at its start): that turn carries it, rather than the one after.
            active.publish(updates.from_event(event))
        else:
            session.state_unsent.add(event.kind)

    def _send_unsent_state(self) -> None:
        session = self._session
        for kind in sorted(session.state_unsent):
            self.publish(updates.from_event(SessionStateEvent(kind, session.state.get(kind))))
        session.state_unsent.clear()


HISTORY_CONTEXT_BYTES = 64 * 1024
"""At most this much of a stored conversation (its latest part) is given to a new agent session."""


def with_history(history: Any, prompt: str) -> str:
    """``prompt`` after the stored conversation, for an agent session that does not know it (the
    bridge restarted, or the session was unloaded): docs/api.md "Durable sessions"."""
    lines: list[str] = []
    size = 0
    for role, text in reversed(list(history)):
        entry = f"{'User' if role == 'user' else 'Assistant'}: {text}"
        size += utf8_len(entry)
        if size > HISTORY_CONTEXT_BYTES:
            break
        lines.append(entry)
    lines.reverse()
    return "Our conversation so far:\n\n" + "\n\n".join(lines) + "\n\nContinue it. My next message:\n\n" + prompt
