"""The session orchestrator: ``acp.capabilities``, routing, and the ``session.*`` methods that run,
cancel and close turns (the reads and ``session.subscribe`` are ``orchestrator.stored``).

Turns run in the orchestrator's own task group, not in the request's task: a client that
disconnects does not kill its turn (the update log keeps what it missed), and ``session.cancel``
from any connection of the same token reaches it. Each turn is an ``orchestrator.turn.Turn``;
sessions are ``orchestrator.sessions``; paths are checked by ``orchestrator.workspace``.

Must not import: ``bridge`` (except ``bridge.rpc``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from anyio.abc import TaskGroup

from bridge.rpc.errors import InvalidParams, LimitReached, NotFound
from compat.base import Attachment, ProviderSession
from compat.llm.gate import Gate
from compat.process import descendants
from compat.settings import Limits, Timeouts
from orchestrator import artifacts, attachments, updates
from orchestrator.foreign import Foreign
from orchestrator.machine import Trigger, TurnState
from orchestrator.registry import ProviderRegistry
from orchestrator.results import (
    AcceptedResult,
    BridgeInfo,
    CancelResult,
    CapabilitiesResult,
    CloseResult,
    NestedCapabilities,
    PrincipalAccess,
    ResolveResult,
    TurnResult,
    UnavailableTurnResult,
)
from orchestrator.routing import Resolution, RoutingInput, resolve
from orchestrator.sessions import Listener, Session, SessionTable, StreamListener
from orchestrator.store import Store
from orchestrator.stored import StoredSessions
from orchestrator.turn import EditorInput, Turn, TurnInput, new_turn_id
from orchestrator.workspace import Workspace

if TYPE_CHECKING:  # pydantic: the handlers import the params models on first use (compat.settings)
    from compat.gateway.runtimes import GatewayRuntimes
    from compat.knowledge.service import KnowledgeService
    from compat.llm.service import LlmService
    from orchestrator.models import PermissionParams, ResolveParams, TurnParams

log = logging.getLogger(__name__)
Notify = Callable[[str, Any], None]
SHUTDOWN_SLACK = 10.0  # seconds, past cancelGrace, that ending everything at shutdown may take
_LIVE_STATES = (TurnState.STARTING, TurnState.RUNNING, TurnState.CANCELLING)


class Orchestrator:
    """Owns sessions and runs turns on providers.

    Use as ``async with Orchestrator(...) as orch:``; leaving it stops running turns and ends every
    provider process (bounded).

    Args:
        registry: the configured providers.
        roots: workspace roots (resolved); every workingDirectory and attachment must lie inside.
        limits / timeouts: the named settings of docs/api.md.
        bridge_info: ``{name, version, contractVersion}`` for ``acp.capabilities``.
        methods: the method names for ``acp.capabilities`` (``bridge.methods``).
        knowledge: the knowledge service (an async context manager), if any.
        background: tasks that run while the orchestrator does and never return (the process
            layer's orphan sweep, ``compat.process.descendants.reap_orphans_forever``).
        admin_principals: the principals that administer this bridge (``adminPrincipals``): they
            may read its logs (``system.logs``).
        remote_root / remote_workspaces: ``remoteWorkspaceRoot`` (resolved) and whether
            ``remoteWorkspaces`` is on (``orchestrator.workspace.Workspace``).
        store: where sessions, turns and update logs are kept across restarts
            (``orchestrator.store``); entered and left with the orchestrator. None: memory only.
    """

    def __init__(
        self,
        registry: ProviderRegistry,
        roots: list[Path],
        limits: Limits,
        timeouts: Timeouts,
        *,
        bridge_info: dict[str, Any] | None = None,
        methods: list[str] | None = None,
        knowledge: KnowledgeService | None = None,
        llm: LlmService | None = None,
        background: Sequence[Callable[[], Coroutine[Any, Any, None]]] = (),
        admin_principals: Sequence[str] = ("local",),
        remote_root: Path | None = None,
        remote_workspaces: bool = False,
        store: Store | None = None,
        gateway: GatewayRuntimes | None = None,
    ) -> None:
        self.registry = registry
        self.gateway = gateway  # the xworkmate.gateway.* runtimes, when a gateway is configured
        self.store = store
        self._background = tuple(background)
        self.admin_principals = frozenset(admin_principals)
        self.workspace = Workspace(
            roots,
            remote_root=remote_root,
            remote=remote_workspaces,
            remote_max_bytes=limits.max_remote_workspace_bytes,
        )
        self.limits = limits
        self.timeouts = timeouts
        info = bridge_info or {}
        self.bridge_info = BridgeInfo(
            name=info.get("name", "xworkmate-bridge"),
            version=info.get("version", ""),
            contract_version=info.get("contractVersion", ""),
        )
        self.methods = methods or []
        self.knowledge = knowledge
        self.llm = llm  # the llm.* methods, when model runtimes are configured
        self.gate = llm.gate if llm is not None else Gate()  # what each principal may use
        self.running = anyio.Semaphore(limits.max_running_turns)
        self.sessions = SessionTable(
            limits.max_sessions, limits.max_queued_turns, self._forgotten, limits.max_sessions_per_token, store=store
        )
        self.stored = StoredSessions(self.sessions, store)  # load, read and follow sessions
        self._unobserve: Callable[[], None] = lambda: None
        self._tg: TaskGroup | None = None
        self._closing = False  # set once __aexit__ began: no new turn runs
        self._capabilities: tuple[Any, CapabilitiesResult, dict[str, CapabilitiesResult]] | None = None

    @property
    def roots(self) -> list[Path]:
        return self.workspace.roots

    @property
    def idle(self) -> bool:
        """No turn is running."""
        return self.running.value == self.limits.max_running_turns

    # ---- lifetime ----------------------------------------------------------------------------------

    async def __aenter__(self) -> Orchestrator:
        if self.store is not None:
            await self.store.__aenter__()
            self._unobserve = descendants.observe(self.store.record_process, self.store.forget_process)
        if self.knowledge is not None:
            await self.knowledge.__aenter__()
        self._tg = await anyio.create_task_group().__aenter__()
        self.stored.start(self._tg)
        if self.store is not None:  # once the database is open: agents a killed bridge left behind
            self._tg.start_soon(self.store.end_left_behind)
        await self.registry.start(self._tg)
        self._tg.start_soon(self._sweep_sessions)
        for task in self._background:
            self._tg.start_soon(task)
        self._log_start()
        self._tg.start_soon(self.registry.probe_all)
        return self

    def _log_start(self) -> None:
        self.workspace.warn_missing()
        for provider_id in self.registry.ids:
            probe = self.registry.status(provider_id)
            log.info("provider %s: %s%s", provider_id, probe.status, "" if probe.available else f" ({probe.detail})")

    async def __aexit__(self, *exc_info: Any) -> None:
        assert self._tg is not None
        self._closing = True  # turns admitted from now on do not run
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(self.timeouts.cancel_grace + SHUTDOWN_SLACK):
                turns = [turn for session in self.sessions for turn in session.turns]
                for turn in turns:
                    turn.stop(Trigger.SHUTDOWN)
                for turn in turns:
                    await turn.ended.wait()
                async with anyio.create_task_group() as ending:  # all at once: each may wait its grace
                    for session in self.sessions:
                        ending.start_soon(self._end_session_at_exit, session)
            await self.registry.aclose()
            for session in self.sessions:
                session.close_log()
        self._tg.cancel_scope.cancel()
        try:
            await self._tg.__aexit__(*exc_info)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_SLACK):
                if self.knowledge is not None:
                    await self.knowledge.__aexit__(None, None, None)
                if self.llm is not None:
                    await self.llm.aclose()
                if self.store is not None:
                    self._unobserve()
                    await self.store.__aexit__(None, None, None)

    async def drain(self, grace: float) -> None:
        """The bridge begins to stop (docs/api.md "Graceful shutdown"): no turn starts from now;
        each running turn's streams get a ``bridge_stopping`` status update; running turns get
        ``grace`` seconds to end, then are stopped (``cancelled``, recorded as such) within
        ``cancelGrace`` plus the kill. Never raises."""
        self._closing = True
        turns = [turn for session in self.sessions for turn in session.turns if isinstance(turn, Turn)]
        message = f"the bridge is stopping; running turns get {grace:g} s to finish"
        log.info("stopping: %d turn(s) running or queued get %g s to finish (shutdownGrace)", len(turns), grace)
        for turn in turns:
            if turn.turn_id is not None and turn.machine.state in _LIVE_STATES:
                turn.publish(updates.status("bridge_stopping", message))
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(grace):
                for turn in turns:
                    await turn.ended.wait()
            with anyio.move_on_after(self.timeouts.cancel_grace + SHUTDOWN_SLACK):
                for turn in turns:
                    turn.stop(Trigger.SHUTDOWN)
                for turn in turns:
                    await turn.ended.wait()

    # ---- capabilities and routing ------------------------------------------------------------------

    def capabilities(self, principal: str | None = None) -> CapabilitiesResult:
        """``acp.capabilities``; rebuilt only when a provider's status changed (the hottest call of
        a polling client, and building it walks every provider). With ``principal``, ``access``
        says what that principal may use (``principals.<name>``); each principal's view is kept
        beside the base until then too (principals are the configured tokens' names, so the table
        is bounded). Both are rebuilt when the model runtime table is replaced as well
        (``knowledge.sources.select {runtime}``: ``access.llm`` reads it). Building the view on
        every call was 4 µs of the 47 µs an HTTP request costs in bench case 2."""
        key = (self.registry.snapshot_key(), self.llm.settings if self.llm is not None else None)
        if self._capabilities is None or self._capabilities[0] != key:
            self._capabilities = (key, self._build_capabilities(), {})
        _, base, views = self._capabilities
        if principal is None:
            return base
        view = views.get(principal)
        if view is None:
            view = views[principal] = msgspec.structs.replace(base, access=self._access(principal, base))
        return view

    def _access(self, principal: str, base: CapabilitiesResult) -> PrincipalAccess:
        turns = self.gate.turns(principal)
        ids = [e.provider_id for e in (*base.provider_catalog, *base.gateway_providers)]
        llm = self.gate.llm_view(self.llm.settings, principal) if self.llm is not None else {"available": False}
        return PrincipalAccess(
            principal=principal,
            allowed_providers=[p for p in ids if self.gate.turn_provider(principal, p)],
            allow_model_override=turns.allow_model_override,
            allowed_models=turns.allowed_models
            if isinstance(turns.allowed_models, str)
            else list(turns.allowed_models),
            llm=llm,
        )

    def _build_capabilities(self) -> CapabilitiesResult:
        catalog = self.registry.catalog()
        # A target is advertised only when a turn routed to it can run.
        gateways = self.registry.catalog(gateways=True)
        targets = [t for t, entries in (("agent", catalog), ("gateway", gateways)) if any(e.enabled for e in entries)]
        single = any(entry.enabled for entry in catalog)
        return CapabilitiesResult(
            single_agent=single,
            multi_agent=False,
            available_execution_targets=targets,
            provider_catalog=catalog,
            gateway_providers=gateways,
            provider_probe_summary=self.registry.probe_summary(),
            capabilities=NestedCapabilities(
                single_agent=single,
                multi_agent=False,
                provider_catalog=catalog,
                gateway_providers=gateways,
                available_execution_targets=targets,
            ),
            bridge=self.bridge_info,
            methods=self.methods,
            limits={**msgspec.to_builtins(self.limits), **msgspec.to_builtins(self.timeouts)},
        )

    def _route(
        self, prompt: str, routing: dict[str, Any] | None, model: str | None, preferred: str, principal: str = "local"
    ) -> Resolution:
        """The route of a turn of ``principal``: only among the providers it may use
        (``principals.<name>.turns``); an explicit choice it may not use is unavailable,
        ``PROVIDER_NOT_ALLOWED`` (``MODEL_NOT_ALLOWED`` for a model).

        Raises:
            InvalidParams: -32602, ``routing`` is malformed.
        """
        try:
            inp = RoutingInput.from_params(prompt, routing, model, preferred)
        except ValueError as exc:
            raise InvalidParams(f"Invalid params: {exc}", field="routing") from exc
        inp = msgspec.structs.replace(  # ids as the app sends them back: normalised (my_agent → my-agent)
            inp,
            explicit_provider_id=inp.explicit_provider_id and self.registry.resolve_id(inp.explicit_provider_id),
            preferred_provider_id=inp.preferred_provider_id and self.registry.resolve_id(inp.preferred_provider_id),
        )
        gateways = self.registry.gateway_ids()
        if inp.explicit_provider_id in gateways or (
            not inp.explicit_provider_id and inp.preferred_provider_id in gateways
        ):
            # `--provider openclaw`: the gateway provider names the gateway target
            inp = msgspec.structs.replace(
                inp,
                routing_mode="explicit",
                explicit_execution_target="gateway",
                explicit_provider_id="",
                preferred_provider_id="",
            )
        allowed = functools.partial(self.gate.turn_provider, principal)
        available = [p for p in self.registry.available() if allowed(p)]
        # Auto routing picks a knowledge provider only when it is the only one available, and an
        # agent known to need authentication only when no agent is ready (explicit routing still
        # reaches it, and its turn then says how to authenticate).
        agents = [p for p in available if self.registry.category(p) != "knowledge"]
        agents = [p for p in agents if self.registry.status(p).available] or agents or available
        gateway_ok = any(allowed(g) for g in gateways)
        resolution = resolve(inp, available, gateway_configured=gateway_ok, auto_available=agents)
        refused = self._refused(resolution, principal, bool(gateways))
        if refused:
            resolution.unavailable_code, resolution.unavailable_message = refused
            return resolution
        chosen = resolution.resolved_provider_id
        if resolution.unavailable_code == "PROVIDER_UNAVAILABLE" and chosen:
            resolution.unavailable_message = self._why_unavailable(chosen)
        if resolution.preferred_provider_unavailable:
            why = self._why_unavailable(resolution.preferred_provider_id)
            instead = f"; auto routing chose {chosen}" if chosen else ""
            resolution.preferred_provider_message = f"preference not used: {why}{instead}"
        return resolution

    def _refused(self, resolution: Resolution, principal: str, gateways: bool) -> tuple[str, str] | None:
        """``(code, message)`` when the gate, not the provider, is why ``resolution`` cannot run."""
        key = f"principals.{principal}.turns"
        gateway_refused = resolution.unavailable_code == "GATEWAY_NOT_CONFIGURED" and gateways
        chosen = resolution.provider_key
        if gateway_refused or (
            resolution.unavailable_code == "PROVIDER_UNAVAILABLE"
            and chosen
            and not self.gate.turn_provider(principal, chosen)
        ):
            return "PROVIDER_NOT_ALLOWED", f"{principal} may not use provider {chosen[:100]} ({key}.allowedProviders)"
        if not resolution.unavailable and not self.gate.turn_model(principal, resolution.resolved_model):
            model = resolution.resolved_model[:100]
            return (
                "MODEL_NOT_ALLOWED",
                f"{principal} may not choose model {model} ({key}.allowModelOverride, allowedModels)",
            )
        return None

    def _why_unavailable(self, provider_id: str) -> str:
        if provider_id not in self.registry.ids:
            configured = ", ".join(self.registry.ids) or "none"
            return f"unknown provider: {provider_id[:100]} (configured: {configured})"
        reason = self.registry.status(provider_id)
        return f"provider {provider_id} is unavailable: {reason.detail or reason.status}"

    def resolve(self, params: ResolveParams, principal: str = "local") -> ResolveResult:
        """``xworkmate.routing.resolve`` for ``principal``.

        Raises:
            InvalidParams: -32602, ``routing`` is malformed.
        """
        route = self._route(params.task_prompt, params.routing, params.model, params.preferred_provider, principal)
        return resolve_result(route)

    # ---- turns -------------------------------------------------------------------------------------

    async def run_turn(
        self,
        params: TurnParams,
        principal: str,
        listener: Listener | Notify,
        *,
        start: bool,
        editor: EditorInput | None = None,
    ) -> TurnResult | UnavailableTurnResult:
        """``session.start`` (start=True) or ``session.message``: run one turn and return its result.

        ``listener`` (the requesting stream) receives the session's updates: for the rest of its
        life when it has ``closers``, else while this turn runs. ``editor`` is what an ACP
        editor adds (editor mode: content blocks, MCP servers, the fs/terminal link). A session known only to the store
        is loaded first; everything from then to the first ``await`` is synchronous, so turns are
        queued in the order the requests were read.

        Raises:
            InvalidParams: -32602, bad workingDirectory, attachment or routing; or the provider
                refused the turn's params (``preflight``).
            SessionBusy: -32005 (``turn_running`` / ``queue_full``). A ``session.start`` that
                finds the session's turn ending after a stop first waits for that end (bounded).
            LimitReached: -32006, ``maxSessions`` sessions exist.
        """
        if not isinstance(listener, StreamListener) and callable(listener):
            listener = StreamListener(listener, f"callable-{id(listener)}", closers=[])  # listens for good
        cwd = self.workspace.working_directory(params.working_directory, principal, params.session_id)
        usable = self.workspace.usable_attachments(params.attachments, principal, params.session_id)
        copies = attachments.match(params.attachments, params.inline_attachments, usable)
        resolution = self._route(params.task_prompt, params.routing, params.model, params.preferred_provider, principal)
        if isinstance(loaded := await self.stored.load(principal, params.session_id, claim=True, create=True), Foreign):
            raise loaded.refuse("a turn")
        thread_id = params.thread_id or params.session_id
        try:
            session = self.sessions.open(params.session_id, principal, thread_id)
        except LimitReached:  # no room for it: it was claimed for nothing
            if self.store is not None:
                self.store.release(principal, params.session_id)
            raise
        if start and session.stopping:  # Stop, then send (the app's next send is a session.start)
            await self._until_stopped(session)
            session = self.sessions.open(params.session_id, principal, thread_id)  # closed meanwhile?
        if resolution.unavailable:
            return unavailable_result(session, resolution, cwd)
        spec = TurnInput(
            prompt=params.task_prompt,
            cwd=cwd,
            attachments=tuple(usable.values()),
            resolution=resolution,
            principal=principal,
            start=start,
            extra=params.extra_params(),
            turn_id=new_turn_id(),
            collect_artifacts=self.workspace.is_remote(cwd)
            or (params.return_artifacts and self.workspace.below_a_root(cwd)),
            not_listed=str(self.workspace.remote_root) if self.workspace.remote_root else None,
            editor=editor,
        )
        turn = Turn(self, session, spec)
        session.admit(turn, start=start)
        transient = self._listen(session, listener)
        if self.timeouts.disconnect_grace > 0 and listener.closers is not None:
            listener.closers.append(lambda: self._orphaned(session, turn))
        try:
            await self._preflight(resolution.resolved_provider_id, spec.extra)
            if self.workspace.is_remote(cwd):  # created here, for an admitted turn only
                await anyio.to_thread.run_sync(self.workspace.prepare_remote, cwd)
            if copies:
                spec.attachments = await self._write_inline(session, spec, params, usable, copies)
        except BaseException:
            turn.withdraw(Trigger.REFUSE)  # close and shutdown wait for every admitted turn's end
            if transient:
                session.log.detach(listener.key, "turn")
            raise
        assert self._tg is not None, "use the Orchestrator as an async context manager"
        if self._closing:  # the bridge began to stop: the turn ends as cancelled before it started
            turn.withdraw(Trigger.SHUTDOWN)
        else:
            self._tg.start_soon(turn.run)
        try:
            await turn.ended.wait()
        finally:
            if transient:
                session.log.detach(listener.key, "turn")
        assert turn.result is not None
        if turn.files_before is not None or turn.artifacts_omitted:
            result = await self._with_artifacts(turn, turn.result)
            session.save_turn(turn, result)
            return result
        return turn.result

    def _listen(self, session: Session, listener: Listener) -> bool:
        """Deliver the session's updates to ``listener``; True when only for this turn (it has
        no ``closers``: a plain HTTP response)."""
        if listener.closers is None:
            session.log.attach(listener.key, listener.deliver, "turn")
            return True
        if session.log.attach(listener.key, listener.deliver, "stream"):
            log_ = session.log
            listener.closers.append(lambda: log_.detach(listener.key))
        return False

    def _orphaned(self, session: Session, turn: Turn) -> None:
        """The stream that started ``turn`` closed (``disconnectGrace`` set): cancel the turn
        when, that many seconds later, it still runs and no stream listens to its session."""
        if turn.ended.is_set() or self._tg is None:
            return

        async def cancel_later() -> None:
            with anyio.move_on_after(self.timeouts.disconnect_grace):
                await turn.ended.wait()
            if not turn.ended.is_set() and not session.log.listened:
                log.info(
                    "turn %s: its client left %gs ago and nobody listens; cancelling it",
                    turn.turn_id,
                    self.timeouts.disconnect_grace,
                )
                turn.stop(Trigger.CANCEL)

        self._tg.start_soon(cancel_later)

    async def _with_artifacts(self, turn: Turn, result: TurnResult) -> TurnResult:
        """``result`` with the files the turn made as ``artifacts`` (after the provider's own)."""
        files, note = [], turn.artifacts_omitted
        if turn.files_before is not None:
            limits = self.limits
            files, note = await anyio.to_thread.run_sync(
                artifacts.changed,
                result.resolved_working_directory,
                turn.files_before,
                limits.max_artifact_scan_files,
                limits.max_artifact_result_bytes,
                str(self.workspace.remote_root) if self.workspace.remote_root else None,
            )
        own = result.artifacts if isinstance(result.artifacts, list) else []
        omitted = note or msgspec.UNSET
        return msgspec.structs.replace(result, artifacts=[*own, *files], artifacts_omitted=omitted)

    async def _until_stopped(self, session: Session) -> None:
        """Wait while the session's turn is ending after a stop, at most the documented cancel
        time (``cancelGrace`` plus the kill, docs/api.md "session.cancel"); admission then
        decides (-32005 if a turn still holds the session)."""
        with anyio.move_on_after(self.timeouts.cancel_grace + SHUTDOWN_SLACK):
            while session.stopping and session.active is not None:
                await session.active.ended.wait()

    async def _write_inline(
        self,
        session: Session,
        spec: TurnInput,
        params: TurnParams,
        usable: dict[int, Attachment],
        copies: list[attachments.InlineCopy],
    ) -> tuple[Attachment, ...]:
        """Decode, check and write the inline copies the turn needs (in a worker thread: up to
        ``maxTurnAttachmentBytes`` of base64 and hashing); the turn's attachments, in order."""
        inline, limits = params.inline_attachments, self.limits

        def decode_and_write() -> list[Attachment]:
            data = attachments.decode_all(
                copies,
                inline,
                max_file_bytes=limits.max_attachment_bytes,
                max_turn_bytes=limits.max_turn_attachment_bytes,
            )
            return attachments.write(spec.cwd, spec.turn_id, copies, data)

        session.attachment_folders.append((spec.cwd, spec.turn_id))  # removed with the session, even half-written
        written = await anyio.to_thread.run_sync(decode_and_write)
        by_index = dict(usable)
        by_index.update((copy.index, item) for copy, item in zip(copies, written, strict=True))
        return tuple(by_index[i] for i in sorted(by_index))

    async def _preflight(self, provider_id: str, extra: dict[str, Any]) -> None:
        """Let the provider refuse params before the turn exists (no turnId, no updates)."""
        adapter = self.registry.get(provider_id)
        if adapter is not None:
            await adapter.preflight(extra)

    async def provider_for(self, session: Session, provider_id: str, *, start: bool) -> tuple[ProviderSession, bool]:
        """The session's provider session for ``provider_id`` (``TurnHost``), and whether the
        conversation's context was lost (the provider changed under a conversation)."""
        reset = False
        if start:
            session.history.clear()
            await self._end_provider_session(session)
        elif session.provider_id not in (None, provider_id):
            reset = bool(session.history)
            await self._end_provider_session(session)
        if session.provider_session is None:
            adapter = self.registry.get(provider_id)
            if adapter is None:
                raise LookupError(f"no adapter for provider {provider_id!r}")
            session.provider_session = adapter.open_session(session.session_id)
            session.provider_id = provider_id
        return session.provider_session, reset

    # ---- cancel, close, permission -----------------------------------------------------------------

    def cancel(self, session_id: str, principal: str) -> CancelResult:
        """``session.cancel``: ``{accepted: true, cancelled: <a running or queued turn will end
        because of it>}``.

        Another principal's session is an unknown one (``cancelled: false``). A turn read just
        before is cancelled too, even while it still loads its session from the store.
        """
        session = self.sessions.get(session_id, principal)
        if session is None and (loaded := self.stored.opening(principal, session_id)) is not None:
            assert self._tg is not None, "use the Orchestrator as an async context manager"
            self._tg.start_soon(self._cancel_once_loaded, session_id, principal, loaded)
            return CancelResult(accepted=True, cancelled=True)
        cancelled = False
        if session is not None:
            for turn in list(session.turns):
                cancelled = turn.stop(Trigger.CANCEL) or cancelled
        return CancelResult(accepted=True, cancelled=cancelled)

    async def _cancel_once_loaded(self, session_id: str, principal: str, loaded: anyio.Event) -> None:
        await loaded.wait()  # the turn that loads the session resumes, and is admitted, first
        self.cancel(session_id, principal)

    async def close(self, session_id: str, principal: str) -> CloseResult:
        """``session.close``: stop its turns at once, end the provider session and its process,
        forget the session. Another principal's session is an unknown one (``closed: false``).
        """
        session = await self.stored.load(principal, session_id, claim=True)
        if isinstance(session, Foreign):
            raise session.refuse("closing it")
        if session is None or session.closed:
            return CloseResult(accepted=True, closed=False)
        self.sessions.pop(session_id, principal)
        session.closed = True
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.timeouts.cancel_grace + SHUTDOWN_SLACK):
            turns = list(session.turns)
            for turn in turns:
                turn.stop(Trigger.CLOSE)
            for turn in turns:
                await turn.ended.wait()
            await self._end_provider_session(session)
            await self._remove_files(session)
        session.save()
        session.close_log()
        if self.store is not None:
            self.store.release(principal, session_id)
        return CloseResult(accepted=True, closed=True)

    def permission_settled(self, session_id: str, principal: str, request_id: str) -> anyio.Event | None:
        """Set once the pending ``ask`` request is answered, timed out or its turn ended (editor
        mode withdraws its question then); None when there is no such request."""
        session = self.sessions.get(session_id, principal)
        pending = session.permissions.get(request_id) if session else None
        return pending.answered if pending is not None else None

    def permission(self, params: PermissionParams, principal: str) -> AcceptedResult:
        """``session.permission``: answer a pending ``ask`` permission request.

        Raises:
            NotFound: -32004, unknown session/request (another principal's is unknown), or already answered.
            InvalidParams: -32602, ``optionId`` is not one of the request's options.
        """
        session = self.sessions.get(params.session_id, principal)
        pending = session.permissions.get(params.request_id) if session else None
        if pending is None or pending.answered.is_set():
            raise NotFound("unknown or already answered permission request", requestId=params.request_id)
        if pending.option_ids and params.option_id not in pending.option_ids:
            raise InvalidParams("optionId is not one of the request's options", field="optionId")
        pending.answer(params.option_id)
        return AcceptedResult(accepted=True)

    # ---- sessions ----------------------------------------------------------------------------------

    def _forgotten(self, session: Session) -> None:
        """The table forgot ``session`` (idle): its agent process ends and its files go, in the
        background."""
        assert self._tg is not None
        session.close_log()  # unloaded, not deleted: loaded again, it continues right after its last seq
        if self.store is not None:
            self.store.release(session.owner, session.session_id)  # another process may own it now
        self._tg.start_soon(self._end_provider_session, session)
        self._tg.start_soon(self._remove_files, session)

    async def _remove_files(self, session: Session, *, remote: bool = True) -> None:
        """Remove the inline attachments written for the session's turns and (``remote``) its
        remote workspace; never raises."""
        folders, session.attachment_folders = session.attachment_folders, []
        with anyio.CancelScope(shield=True):
            if folders:
                await anyio.to_thread.run_sync(attachments.remove, folders)
            if remote and self.workspace.remote_root is not None:  # its folder, if a turn ran there
                await anyio.to_thread.run_sync(self.workspace.remove_remote, session.owner, session.session_id)

    async def _sweep_sessions(self) -> None:
        interval = min(60.0, self.timeouts.session_idle_timeout / 2)
        while True:
            await anyio.sleep(interval)
            self.sessions.evict_idle(self.timeouts.session_idle_timeout)
            if self.store is not None:
                self.store.prune()  # sessionRetention and stateMaxBytes, in the store's writer

    async def _end_session_at_exit(self, session: Session) -> None:
        await self._end_provider_session(session)
        await self._remove_files(session, remote=False)  # kept: the same ids find it again

    async def _end_provider_session(self, session: Session) -> None:
        """End the session's provider session (its agent process); never raises: it runs in the
        orchestrator's task group, where an error would cancel every running turn."""
        if session.provider_id is not None:  # the conversation's provider, for its record and snapshot
            session.provider_id_before = session.provider_id
        provider, session.provider_session, session.provider_id = session.provider_session, None, None
        if provider is None:
            return
        try:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.timeouts.cancel_grace + SHUTDOWN_SLACK):
                await provider.aclose()
        except Exception:
            log.exception("ending the provider session of session %s failed", session.session_id[:80])


def resolve_result(resolution: Resolution) -> ResolveResult:
    return ResolveResult(
        resolved_execution_target=resolution.resolved_execution_target,
        resolved_provider_id=resolution.resolved_provider_id,
        resolved_gateway_provider_id=resolution.resolved_gateway_provider_id,
        resolved_model=resolution.resolved_model,
        resolved_skills=list(resolution.resolved_skills),
        status="unavailable" if resolution.unavailable else "available",
        unavailable=resolution.unavailable,
        unavailable_code=resolution.unavailable_code,
        unavailable_message=resolution.unavailable_message,
        skill_resolution_source=resolution.skill_resolution_source,
        needs_skill_install=resolution.needs_skill_install,
        skill_install_request_id=resolution.skill_install_request_id,
        **resolution.preference(),
        provider_id=resolution.resolved_provider_id,
        agent_id=resolution.resolved_provider_id,
        metadata=_dispatch_metadata(resolution),
    )


def _dispatch_metadata(resolution: Resolution) -> dict[str, Any]:
    """The routing answer's ``metadata``: with it the app sends this as its dispatch metadata
    instead of building its own after a second call."""
    target = "gateway" if resolution.resolved_execution_target == "gateway" else "agent"
    return {
        "dispatch": {"mode": "cooperative", "executionTarget": target},
        "provider": {"id": resolution.resolved_provider_id or resolution.resolved_gateway_provider_id},
        "routing": {"status": "unavailable" if resolution.unavailable else "available"},
    }


_SHARED = tuple(f for f in UnavailableTurnResult.__struct_fields__ if f in ResolveResult.__struct_fields__)


def unavailable_result(session: Session, resolution: Resolution, cwd: str) -> UnavailableTurnResult:
    wire = resolve_result(resolution)
    return UnavailableTurnResult(
        success=False,
        session_id=session.session_id,
        thread_id=session.thread_id,
        resolved_working_directory=cwd,
        **{f: getattr(wire, f) for f in _SHARED},
    )
