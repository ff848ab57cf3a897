"""``AcpSession``: one bridge session's agent process and ACP session, and its turns.

A turn: connect (spawn and ``initialize`` unless a live agent is kept), ``session/new`` or
``session/load``, apply the model, ``session/prompt``, and before the result is handed back a
drain of every line the agent has already written. The orchestrator owns the turn's end
(``orchestrator.machine``): :meth:`AcpSession.request_cancel` sends ACP's ``session/cancel`` while a
prompt is out; a turn cut off (cancel grace, close, timeout, shutdown) ends the agent when a
request to it was still unanswered, since its state is then unknown (field-failures #15, #17).

Where the agent's ``session/update`` notifications go:

- updates naming a session id not known yet (written before the ``session/new`` or
  ``session/load`` result) wait, bounded, and go to the turn that opened it once the id is known;
- session-level kinds (``SESSION_STATE_KINDS``) always reach a sink, which keeps them as the
  session's state;
- other updates belong to the turn whose prompt is out; before this turn's prompt is out, or after
  its result, they belong to the turn before (a chunk written behind a prompt's answer is that
  turn's, and is still forwarded); the history replayed by ``session/load`` is nobody's output.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Protocol

import anyio
import msgspec

from bridge.rpc.redact import redact
from compat.acp.capacity import AgentCapacity, NoAgentCapacity
from compat.acp.connection import KILL_GRACE, AcpConnection, ClientRequestHandler
from compat.acp.failures import TurnFailure, turn_failure
from compat.acp.mapping import (
    SESSION_STATE_KINDS,
    UpdateMapper,
    choose_option,
    permission_outcome,
    prompt_blocks,
    usage_from_result,
)
from compat.acp.models import ModelState
from compat.base import TurnError, TurnOutcome, TurnRequest, TurnSink, TurnStatus, offers
from compat.peer import Call, NotificationHandler, PeerError, RequestHandler, ResponseError
from compat.process.spawn import SpawnError
from compat.settings import Limits, ProviderConfig, Timeouts
from compat.telemetry import METRICS

logger = logging.getLogger(__name__)

EARLY_UPDATES = 256
"""Updates kept for session ids not known yet (written before their ``session/new`` result), in
all: whatever ids an agent names, the oldest go first."""
_CLOSE_SLACK = 5.0  # seconds aclose() waits for a running turn beyond cancelGrace


class AgentHost(Protocol):
    """What an ``AcpSession`` needs from its adapter (``compat.acp.adapter.AcpAdapter``)."""

    config: ProviderConfig
    limits: Limits
    timeouts: Timeouts
    capacity: AgentCapacity

    async def start_connection(
        self,
        cwd: str | None,
        launch_model: str | None,
        on_update: NotificationHandler | None = None,
        on_permission: RequestHandler | None = None,
        client_capabilities: dict[str, Any] | None = None,
        on_client_request: ClientRequestHandler | None = None,
    ) -> AcpConnection: ...

    def watch_idle(self, session: AcpSession, wake: anyio.Event) -> None: ...

    def forget(self, session: AcpSession) -> None: ...


class _TurnLink:
    """Where one turn's updates go: its sink and its tool-call state."""

    __slots__ = ("mapper", "opened", "sink")

    def __init__(self, sink: TurnSink, mapper: UpdateMapper) -> None:
        self.sink = sink
        self.mapper = mapper
        self.opened = False  # this turn created or loaded the current ACP session

    def take(self, update: dict[str, Any]) -> None:
        for event in self.mapper.map(update):
            self.sink.emit(event)


class AcpSession:
    """Implements ``ProviderSession`` for one bridge session; created by
    ``AcpAdapter.open_session``. The agent process starts on the first turn."""

    def __init__(self, host: AgentHost, session_id: str) -> None:
        self.session_id = session_id
        self._host = host
        self._config = host.config
        self._limits = host.limits
        self._timeouts = host.timeouts
        self._conn: AcpConnection | None = None
        self._acp_session_id: str | None = None
        self._acp_cwd: str | None = None
        self._models = ModelState(host.config.model_flag)
        self._turn: _TurnLink | None = None  # the running turn
        self._last: _TurnLink | None = None  # the turn before it (late updates)
        self._prompt: Call | None = None  # this turn's session/prompt, once sent
        self._opening = False  # a session/new or session/load is out
        self._replaying = False  # a session/load is out: its updates replay history
        self._early: deque[tuple[str, dict[str, Any]]] = deque(maxlen=EARLY_UPDATES)
        self._early_dropped = False  # warned that the oldest early updates were dropped
        self._lock = anyio.Lock()
        self._closed = False
        self._idle_since: float | None = None
        self._idle_wake: anyio.Event | None = None
        self._request: TurnRequest | None = None  # the running turn's input (its editor, MCP servers)
        self._resuming = False  # the next turn loads a session this agent had before a restart
        self._restored: str | None = None  # how this turn continued the stored conversation

    @property
    def idle(self) -> bool:
        """No turn runs or waits on it (``AgentCapacity`` may end its agent to make room)."""
        return self._turn is None and not self._lock.locked()

    async def end_agent(self) -> None:
        """End the agent to make room for another (``AgentCapacity``): only while still idle;
        the next turn starts it again (``session/load`` when the agent supports it)."""
        if not self.idle:
            return
        async with self._lock:
            logger.debug("session %s: ending its idle agent to make room (maxLiveAgents)", self.session_id)
            await self._drop_conn()

    def resume(self, upstream_session_id: str, working_directory: str) -> bool:
        """``Resumable``: the next turn loads ``upstream_session_id`` (``session/load``, when the
        agent advertises it) rather than opening a new session; only before any turn."""
        if self._acp_session_id is not None or self._conn is not None:
            return False
        self._acp_session_id = upstream_session_id
        self._acp_cwd = self._config.cwd or working_directory
        self._resuming = True
        return True

    @property
    def pid(self) -> int | None:
        """The agent's process id (also its process-group id) while one runs."""
        return self._conn.process.pid if self._conn is not None else None

    @property
    def upstream_session_id(self) -> str | None:
        """The ACP session id."""
        return self._acp_session_id

    # ---- ProviderSession --------------------------------------------------------------------------

    async def run_turn(self, request: TurnRequest, sink: TurnSink) -> TurnOutcome:
        """Run one turn; failures come back as outcomes (``AGENT_*``)."""
        async with self._lock:
            if self._closed:
                return TurnOutcome("failed", error=TurnError("AGENT_ERROR", "session is closed"))
            self._wake()
            turn = self._turn = _TurnLink(sink, UpdateMapper(self._limits.tool_content_bytes))
            try:
                return await self._run(turn, request)
            except BaseException:
                # Cut off. An agent with a request still unanswered is in an unknown state (it may
                # be mid-prompt after ignoring session/cancel): end it rather than keep it.
                with anyio.CancelScope(shield=True):
                    if self._conn is not None and self._conn.has_unanswered:
                        await self._drop_conn()
                raise
            finally:
                self._prompt = None
                self._turn, self._last = None, turn
                self._went_idle()

    def request_cancel(self) -> bool:
        """``session/cancel`` while this turn's prompt is out (ACP: the agent then answers the
        prompt ``cancelled``); before that there is nothing to cancel gracefully."""
        conn, prompt = self._conn, self._prompt
        if conn is None or prompt is None or prompt.answered or not conn.alive or self._acp_session_id is None:
            return False
        conn.cancel(self._acp_session_id)
        return True

    async def aclose(self) -> None:
        """End the agent process; bounded and idempotent."""
        self._closed = True
        self._host.forget(self)
        self._wake()
        with anyio.CancelScope(shield=True):
            await self._drop_conn()  # a running turn's prompt fails: the agent is gone
            with anyio.move_on_after(self._timeouts.cancel_grace + _CLOSE_SLACK):
                async with self._lock:
                    pass

    # ---- one turn ---------------------------------------------------------------------------------

    async def _run(self, turn: _TurnLink, request: TurnRequest) -> TurnOutcome:
        self._request = request
        try:
            return await self._run_request(turn, request)
        finally:
            self._request = None

    async def _run_request(self, turn: _TurnLink, request: TurnRequest) -> TurnOutcome:
        cwd = self._config.cwd or request.working_directory
        model = request.model or self._config.model
        phase = "initialize"
        context_reset, resolved_model = False, None
        try:
            conn = await self._connect(cwd, model)
            phase = "session"
            session_id, context_reset = await self._open_acp_session(turn, conn, cwd)
            if self._resuming:  # after a restart: loaded, or a new session given the stored conversation
                self._resuming = False
                if context_reset and request.fallback_prompt is not None:
                    request = msgspec.structs.replace(request, prompt=request.fallback_prompt, content=())
                    context_reset, self._restored = False, "history"
                elif not context_reset:
                    self._restored = "session/load"
            resolved_model = await self._models.apply(conn, session_id, model, turn.sink.emit)
            if request.config_options:
                await self._models.apply_options(conn, session_id, request.config_options, turn.sink.emit)
            phase = "prompt"
            turn.sink.begin()
            self._prompt = conn.start_prompt(session_id, prompt_blocks(request))
            result = await conn.prompt_result(self._prompt)
            conn.drain()  # what the agent wrote before its answer, read or not yet, is this turn's
            if not conn.alive:  # a line over maxAgentLineBytes right behind the answer: end the agent
                await self._drop_conn()
        except SpawnError as exc:
            data = {"command": exc.command, "reason": exc.reason}
            error = TurnError("AGENT_ERROR", redact(str(exc)), data)
            return self._outcome(turn, "failed", error=error, context_reset=context_reset)
        except NoAgentCapacity as exc:
            data = {"limit": "maxLiveAgents", "value": self._host.capacity.max_live}
            error = TurnError("AGENT_CAPACITY", str(exc), data)
            return self._outcome(turn, "failed", error=error, context_reset=context_reset)
        except PeerError as exc:
            failure = turn_failure(exc, phase, self._conn, self._limits.client_stderr_tail_bytes)
            return await self._failed(turn, failure, context_reset)
        for event in turn.mapper.add_usage(usage_from_result(result)):
            turn.sink.emit(event)
        stop = result.get("stopReason")
        stop_reason = stop if isinstance(stop, str) else None
        status: TurnStatus = "cancelled" if stop_reason == "cancelled" else "completed"
        return self._outcome(
            turn, status, stop_reason=stop_reason, resolved_model=resolved_model, context_reset=context_reset
        )

    async def _failed(self, turn: _TurnLink, failure: TurnFailure, context_reset: bool) -> TurnOutcome:
        if failure.kill:
            await self._drop_conn()
        return self._outcome(turn, "failed", error=failure.error, context_reset=context_reset)

    # ---- process and ACP session ------------------------------------------------------------------

    async def _connect(self, cwd: str, model: str | None) -> AcpConnection:
        conn = self._conn
        if conn is not None and (not conn.alive or self._idle_expired() or self._models.needs_relaunch(conn, model)):
            await self._drop_conn()
            conn = None
        if conn is not None:
            return conn
        launch_model = model if self._config.model_flag and model else None
        assert self._turn is not None
        await self._host.capacity.acquire(self, self._turn.sink)  # maxLiveAgents, bridge-wide
        try:
            client = self._request.client if self._request is not None else None
            # a cancel while the start waits its turn starts nothing; once the agent is started,
            # start_connection hosts it (or ends it) before it returns
            conn = self._conn = await self._host.start_connection(
                cwd,
                launch_model,
                self._on_update,
                self._on_permission,
                client.capabilities if client is not None else None,
                self._on_client_request,
            )
        except BaseException:
            self._host.capacity.release(self)
            raise
        await conn.initialize()
        return conn

    async def _open_acp_session(self, turn: _TurnLink, conn: AcpConnection, cwd: str) -> tuple[str, bool]:
        """The ACP session for this turn, and whether the conversation's context was lost."""
        previous = self._acp_session_id
        if previous is not None and cwd == self._acp_cwd:
            if previous in conn.sessions:
                return previous, False
            if conn.can_load and await self._load(turn, conn, previous, cwd):
                return previous, False
        self._start_opening()
        try:
            result = await conn.new_session(cwd, self._config.auth_method, self._mcp_servers())
        finally:
            self._opening = False
        self._remember(turn, result["sessionId"], cwd, result)
        return result["sessionId"], previous is not None

    async def _load(self, turn: _TurnLink, conn: AcpConnection, session_id: str, cwd: str) -> bool:
        self._start_opening()
        self._replaying = True
        try:
            result = await conn.load_session(session_id, cwd, self._mcp_servers())
        except ResponseError as exc:
            logger.info("session/load %s failed (%s); starting fresh", session_id, exc.code)
            return False
        finally:
            self._opening = self._replaying = False
        self._remember(turn, session_id, cwd, result)
        return True

    def _mcp_servers(self) -> tuple[dict[str, Any], ...]:
        return self._request.mcp_servers if self._request is not None else ()

    async def _on_client_request(self, method: str, params: dict[str, Any]) -> Any:
        """The agent's ``fs/*`` or ``terminal/*`` request, relayed to the editor of the running
        turn (the capability was advertised because an editor started the agent); -32601 when
        no turn's editor offers it now."""
        client = self._request.client if self._request is not None else None
        if client is None or not offers(client.capabilities, method):
            raise ResponseError(-32601, f"{method} is not available: no editor offers it now")
        return await client.request(method, params)

    def _start_opening(self) -> None:
        self._opening = True
        self._early.clear()  # what an earlier, failed opening left
        self._early_dropped = False

    def _remember(self, turn: _TurnLink, session_id: str, cwd: str, result: dict[str, Any]) -> None:
        self._acp_session_id, self._acp_cwd = session_id, cwd
        self._models.remember(result)
        turn.opened = True
        if isinstance(result.get("configOptions"), list):  # the session's options from the start
            turn.take({"sessionUpdate": "config_option_update", "configOptions": result["configOptions"]})
        self._last = None  # the turns before were on another ACP session
        early = [update for sid, update in self._early if sid == session_id]
        self._early.clear()
        for update in early:
            self._route(update)

    async def _drop_conn(self) -> None:
        conn, self._conn = self._conn, None
        self._last = None  # an agent that is gone writes no late chunk: let its turn go
        try:
            if conn is not None:
                await conn.close(KILL_GRACE)
        finally:
            self._host.capacity.release(self)

    # ---- agent → client ---------------------------------------------------------------------------

    def _on_update(self, params: dict[str, Any]) -> None:
        update = params.get("update")
        session_id = params.get("sessionId")
        if not isinstance(update, dict):
            return
        if session_id == self._acp_session_id and session_id is not None:
            self._route(update)
        elif self._opening and isinstance(session_id, str):
            if len(self._early) == EARLY_UPDATES and not self._early_dropped:
                self._early_dropped = True
                logger.warning(
                    "session %s: more than %d agent updates before session/new answered; the oldest are dropped",
                    self.session_id[:80],
                    EARLY_UPDATES,
                )
            self._early.append((session_id, update))
        else:
            logger.debug("an update for session %r, which is not this session's", str(session_id)[:80])

    def _route(self, update: dict[str, Any]) -> None:
        kind = update.get("sessionUpdate")
        if self._replaying and kind not in SESSION_STATE_KINDS:
            return  # session/load replays the history: nobody's output now
        turn = self._turn
        if turn is not None and (self._prompt is not None or turn.opened or kind in SESSION_STATE_KINDS):
            # Session state is the session's, not a turn's output: the current turn streams it
            # (a model change on a warm turn sends config_option_update before the prompt is out).
            target: _TurnLink | None = turn
        else:
            target = self._last or turn
        if target is None:
            logger.info("session %s: an agent update (%s) with no turn to take it", self.session_id[:80], kind)
            return
        target.take(update)

    async def _on_permission(self, params: dict[str, Any]) -> dict[str, Any]:
        turn, prompt = self._turn, self._prompt
        raw = params.get("options")
        options = [o for o in raw if isinstance(o, dict)] if isinstance(raw, list) else []
        # Only while this turn's prompt is out: a request right behind the prompt's answer could
        # never be answered before the turn's end, and one between turns has nobody to ask.
        if turn is None or prompt is None or prompt.answered:
            METRICS.permissions.inc("no_turn")
            return permission_outcome(None)
        policy = self._config.permission_policy
        if policy != "ask":
            METRICS.permissions.inc(f"policy_{policy}")
            return permission_outcome(choose_option(policy, options))
        raw_call = params.get("toolCall")
        tool_call: dict[str, Any] = raw_call if isinstance(raw_call, dict) else {}
        choice = await turn.sink.ask_permission(tool_call, options)  # None once the turn stops running
        valid = {o.get("optionId") for o in options}
        METRICS.permissions.inc("client_answered" if choice in valid else "cancelled")
        return permission_outcome(choice if choice in valid else None)

    # ---- outcome and idle reaping -----------------------------------------------------------------

    def _outcome(
        self,
        turn: _TurnLink,
        status: TurnStatus,
        *,
        stop_reason: str | None = None,
        error: TurnError | None = None,
        resolved_model: str | None = None,
        context_reset: bool = False,
    ) -> TurnOutcome:
        return TurnOutcome(
            status=status,
            stop_reason=stop_reason,
            error=error,
            usage=dict(turn.mapper.usage) or None,
            upstream_session_id=self._acp_session_id,
            resolved_model=resolved_model,
            context_reset=context_reset,
            context_restored=self._take_restored(),
        )

    def _take_restored(self) -> str | None:
        restored, self._restored = self._restored, None
        return restored

    def _wake(self) -> None:
        if self._idle_wake is not None:
            self._idle_wake.set()
            self._idle_wake = None

    def _went_idle(self) -> None:
        self._idle_since = anyio.current_time()
        if self._conn is not None and not self._closed:
            self._idle_wake = anyio.Event()
            self._host.watch_idle(self, self._idle_wake)

    def _idle_expired(self) -> bool:
        since = self._idle_since
        return since is not None and anyio.current_time() - since >= self._timeouts.idle_timeout

    async def reap_when_idle(self, wake: anyio.Event) -> None:
        """End the agent process after ``idleTimeout`` seconds with no turn. Runs in the
        adapter's task group, which every session shares: never raises."""
        with anyio.move_on_after(self._timeouts.idle_timeout):
            await wake.wait()
            return
        try:
            async with self._lock:
                if self._idle_expired() and self._conn is not None:
                    logger.debug("session %s: agent idle, ending it", self.session_id)
                    await self._drop_conn()
        except Exception:
            logger.exception("session %s: ending the idle agent failed", self.session_id[:80])
