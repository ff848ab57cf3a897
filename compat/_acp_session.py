"""``AcpSession``: one bridge session's agent process and ACP session, and its turns.

A turn runs in a task group it owns: the agent's stdout reader and stderr pump, the turn body
(connect, ``initialize``, ``session/new`` | ``session/load``, model, ``session/prompt``) and a
supervisor that waits for the body or a cancel. Cancel follows ACP (``session/cancel``, then
pending permissions answered ``cancelled``, then wait for the prompt's answer) but is bounded by
``cancelGrace``, after which the process group is killed (field-failures #15, #17).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from bridge.rpc.redact import redact
from compat._acp_connection import AcpConnection
from compat._acp_mapping import (
    UpdateMapper,
    choose_option,
    permission_outcome,
    prompt_blocks,
    usage_from_result,
)
from compat._acp_models import ModelState
from compat._acp_turn import TurnFailure, TurnState, turn_failure
from compat._process import SpawnError
from compat.base import TurnError, TurnOutcome, TurnRequest, TurnSink, TurnStatus
from compat.jsonrpc_peer import PeerError, ResponseError
from compat.pacing import turn_ends

if TYPE_CHECKING:
    from compat.acp import AcpAdapter

logger = logging.getLogger(__name__)

KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL when we end an agent ourselves
_DETACH_BOUND = 1.0  # seconds for in-flight permission answers to be written at turn end
_CLOSE_SLACK = 5.0  # seconds aclose() waits for a running turn beyond cancelGrace


class AcpSession:
    """Implements ``ProviderSession`` for one bridge session; created by
    ``AcpAdapter.open_session``. The agent process starts on the first turn."""

    def __init__(self, adapter: AcpAdapter, session_id: str) -> None:
        self.session_id = session_id
        self._adapter = adapter
        self._config = adapter.config
        self._limits = adapter.limits
        self._timeouts = adapter.timeouts
        self._conn: AcpConnection | None = None
        self._acp_session_id: str | None = None
        self._acp_cwd: str | None = None
        self._models = ModelState(adapter.config.model_flag)
        self._turn: TurnState | None = None
        self._lock = anyio.Lock(fast_acquire=True)  # uncontended: no extra pass of the loop
        self._closed = False
        self._idle_since: float | None = None
        self._idle_wake: anyio.Event | None = None

    @property
    def pid(self) -> int | None:
        """The agent's process id (also its process-group id) while one runs."""
        return self._conn.process.pid if self._conn is not None else None

    async def run_turn(self, request: TurnRequest, sink: TurnSink) -> TurnOutcome:
        """Run one turn; failures come back as outcomes (``AGENT_*``, ``TURN_TIMEOUT``)."""
        async with self._lock:
            if self._closed:
                return TurnOutcome("failed", error=TurnError("AGENT_ERROR", "session is closed"))
            self._wake()
            turn = self._turn = TurnState(request, sink, UpdateMapper(self._limits.tool_content_bytes))
            try:
                return await self._run(turn)
            except anyio.get_cancelled_exc_class():
                with anyio.CancelScope(shield=True):
                    await self._drop_conn()  # the caller gave up mid-turn: leave no busy agent
                raise
            finally:
                self._turn = None
                self._went_idle()

    async def cancel(self) -> None:
        """Stop the running turn; a cancel with no turn in flight does nothing (#17)."""
        turn = self._turn
        if turn is not None and not turn.body_done.is_set() and not turn.cancel_requested:
            turn.request_cancel()

    async def aclose(self) -> None:
        """End a running turn and the agent process; bounded and idempotent."""
        self._closed = True
        self._adapter.forget(self)
        self._wake()
        with anyio.CancelScope(shield=True):
            if self._turn is not None:
                self._turn.request_cancel(kill_now=True)
            with anyio.move_on_after(self._timeouts.cancel_grace + _CLOSE_SLACK):
                async with self._lock:
                    pass
            await self._drop_conn()

    # ---- one turn ---------------------------------------------------------------------------

    async def _run(self, turn: TurnState) -> TurnOutcome:
        outcome: TurnOutcome | None = None
        with anyio.move_on_after(self._timeouts.turn_timeout):
            async with anyio.create_task_group() as host:  # the agent's pumps, unless hosted for good
                outcome = await self._supervise(turn, host)
                turn.cancel_permissions()
                if self._conn is not None and not self._conn.hosted:
                    await self._conn.peer.wait_idle(_DETACH_BOUND)
                host.cancel_scope.cancel()
        if outcome is not None:
            if self._conn is not None:  # the agent stays between turns: keep its tree in view
                await self._conn.process.refresh_descendants()
            return outcome
        turn.cancel_permissions()
        await self._drop_conn()
        limit = self._timeouts.turn_timeout
        error = TurnError("TURN_TIMEOUT", f"turn exceeded {limit} s", {"turnTimeout": limit})
        return self._outcome(turn, "timeout", error=error)

    async def _supervise(self, turn: TurnState, host: anyio.abc.TaskGroup) -> TurnOutcome:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._body, turn, host)
            await turn.attention.wait()
            if not turn.body_done.is_set():
                await self._stop_body(turn)
            tg.cancel_scope.cancel()
        if turn.cancel_requested:
            return self._outcome(turn, "cancelled", stop_reason=turn.stop_reason or "cancelled")
        assert turn.outcome is not None
        return turn.outcome

    async def _stop_body(self, turn: TurnState) -> None:
        conn = self._conn
        if turn.prompt_sent and conn is not None and self._acp_session_id and not turn.kill_now:
            await conn.cancel(self._acp_session_id)
            turn.cancel_permissions()
            with anyio.move_on_after(self._timeouts.cancel_grace):
                await turn.body_done.wait()
        turn.cancel_permissions()
        if turn.body_done.is_set() or conn is None:
            return
        if turn.prompt_sent or turn.kill_now or not conn.initialized:
            await self._drop_conn()  # the agent ignored the cancel, or its state is unknown

    async def _body(self, turn: TurnState, host: anyio.abc.TaskGroup) -> None:
        try:
            turn.outcome = await self._execute(turn, host)
        except TurnFailure as failure:
            if failure.kill:
                await self._drop_conn()
            turn.outcome = self._outcome(turn, "failed", error=failure.error)
        except Exception:
            logger.exception("ACP turn failed unexpectedly")
            await self._drop_conn()
            error = TurnError("AGENT_ERROR", "internal error in the ACP adapter")
            turn.outcome = self._outcome(turn, "failed", error=error)
        finally:
            turn.body_done.set()
            turn.attention.set()

    async def _execute(self, turn: TurnState, host: anyio.abc.TaskGroup) -> TurnOutcome:
        request = turn.request
        cwd = self._config.cwd or request.working_directory
        model = request.model or self._config.model
        phase = "initialize"
        try:
            conn = await self._connect(host, cwd, model)
            phase = "session"
            session_id = await self._open_acp_session(turn, conn, cwd)
            turn.resolved_model = await self._models.apply(conn, session_id, model, turn.emit)
            phase = "prompt"
            await conn.process.refresh_descendants()  # what the agent started so far (#15)
            turn.prompt_sent = True
            result = await conn.prompt(session_id, prompt_blocks(request))
        except SpawnError as exc:
            data = {"command": exc.command, "reason": exc.reason}
            raise TurnFailure("AGENT_ERROR", redact(str(exc)), data, kill=False) from exc
        except PeerError as exc:
            raise turn_failure(exc, phase, self._conn, self._limits.client_stderr_tail_bytes) from exc
        await turn_ends().wait()  # many agents may answer at once: their turns end one per pass
        turn.emit(turn.mapper.add_usage(usage_from_result(result)))
        stop = result.get("stopReason")
        turn.stop_reason = stop if isinstance(stop, str) else None
        status: TurnStatus = "cancelled" if turn.stop_reason == "cancelled" else "completed"
        return self._outcome(turn, status, stop_reason=turn.stop_reason)

    # ---- process and ACP session --------------------------------------------------------------

    async def _connect(self, host: anyio.abc.TaskGroup, cwd: str, model: str | None) -> AcpConnection:
        conn = self._conn
        if conn is not None and (not conn.alive or self._idle_expired() or self._models.needs_relaunch(conn, model)):
            await self._drop_conn()
            conn = None
        if conn is not None:
            await conn.attach(host)
            return conn
        launch_model = model if self._config.model_flag and model else None
        with anyio.CancelScope(shield=True):  # a cancelled spawn must not lose the process
            conn = self._conn = await self._adapter.start_connection(
                cwd, launch_model, self._on_update, self._on_permission
            )
        self._adapter.host_connection(conn)
        await conn.attach(host)
        await conn.initialize()
        return conn

    async def _open_acp_session(self, turn: TurnState, conn: AcpConnection, cwd: str) -> str:
        previous = self._acp_session_id
        if previous is not None and cwd == self._acp_cwd:
            if previous in conn.sessions:
                return previous
            if conn.can_load and await self._load(turn, conn, previous, cwd):
                return previous
        result = await conn.new_session(cwd, self._config.auth_method)
        turn.context_reset = previous is not None
        self._remember(result["sessionId"], cwd, result)
        return result["sessionId"]

    async def _load(self, turn: TurnState, conn: AcpConnection, session_id: str, cwd: str) -> bool:
        turn.replaying = True  # the history comes back as updates: not this turn's output
        try:
            result = await conn.load_session(session_id, cwd)
        except ResponseError as exc:
            logger.info("session/load %s failed (%s); starting fresh", session_id, exc.code)
            return False
        finally:
            turn.replaying = False
        self._remember(session_id, cwd, result)
        return True

    def _remember(self, session_id: str, cwd: str, result: dict[str, Any]) -> None:
        self._acp_session_id, self._acp_cwd = session_id, cwd
        self._models.remember(result)

    async def _drop_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close(KILL_GRACE)

    # ---- agent → client ---------------------------------------------------------------------

    def _on_update(self, params: dict[str, Any]) -> None:
        turn = self._turn
        update = params.get("update")
        # Before our prompt is sent, updates belong to an earlier turn or to a replay (#17).
        if turn is None or not turn.prompt_sent or turn.replaying or not isinstance(update, dict):
            return
        if params.get("sessionId") == self._acp_session_id:
            turn.emit(turn.mapper.map(update))

    async def _on_permission(self, params: dict[str, Any]) -> dict[str, Any]:
        turn = self._turn
        raw = params.get("options")
        options = [o for o in raw if isinstance(o, dict)] if isinstance(raw, list) else []
        # body_done: the prompt was answered; a request right behind that answer must not reach
        # the client, who could never answer it before the turn's end cancels it.
        if turn is None or turn.cancel_requested or not turn.prompt_sent or turn.body_done.is_set():
            return permission_outcome(None)
        policy = self._config.permission_policy
        if policy != "ask":
            return permission_outcome(choose_option(policy, options))
        tool_call = params.get("toolCall") if isinstance(params.get("toolCall"), dict) else {}
        choice = None
        with anyio.CancelScope() as scope:  # cancelled by a turn cancel or the turn's end
            turn.permission_scopes.add(scope)
            try:
                choice = await turn.sink.ask_permission(tool_call, options)
            finally:
                turn.permission_scopes.discard(scope)
        valid = {o.get("optionId") for o in options}
        return permission_outcome(choice if choice in valid else None)

    # ---- outcome and idle reaping -------------------------------------------------------------

    def _outcome(
        self,
        turn: TurnState,
        status: TurnStatus,
        *,
        stop_reason: str | None = None,
        error: TurnError | None = None,
    ) -> TurnOutcome:
        return TurnOutcome(
            status=status,
            stop_reason=stop_reason,
            error=error,
            usage=dict(turn.mapper.usage) or None,
            upstream_session_id=self._acp_session_id,
            resolved_model=turn.resolved_model,
            context_reset=turn.context_reset,
        )

    def _wake(self) -> None:
        if self._idle_wake is not None:
            self._idle_wake.set()
            self._idle_wake = None

    def _went_idle(self) -> None:
        self._idle_since = anyio.current_time()
        if self._conn is not None and not self._closed:
            self._idle_wake = anyio.Event()
            self._adapter.watch_idle(self, self._idle_wake)

    def _idle_expired(self) -> bool:
        since = self._idle_since
        return since is not None and anyio.current_time() - since >= self._timeouts.idle_timeout

    async def reap_when_idle(self, wake: anyio.Event) -> None:
        """End the agent process after ``idleTimeout`` seconds with no turn (adapter-hosted)."""
        with anyio.move_on_after(self._timeouts.idle_timeout):
            await wake.wait()
            return
        async with self._lock:
            if self._idle_expired() and self._conn is not None:
                logger.debug("session %s: agent idle, ending it", self.session_id)
                await self._drop_conn()
