"""One ACP agent process: spawn, handshake, and the agent methods the adapter calls.

The connection owns an :class:`~compat._process.AgentProcess` and its
:class:`~compat.jsonrpc_peer.JsonRpcPeer`. Its pumps (stdout reader, stderr drain) run either for
the process's whole life (:meth:`host`, when the adapter runs as a service) or for as long as
someone talks to it (:meth:`attach`: one turn, one probe). Method names and params follow the
ACP v1 schema (acp-and-real-agents.md §1).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from contextlib import suppress
from functools import partial
from typing import Any

import anyio
import anyio.abc

from compat._process import AgentProcess, spawn
from compat.jsonrpc_peer import (
    JsonRpcPeer,
    NotificationHandler,
    PeerError,
    RequestHandler,
    ResponseError,
)
from compat.settings import Limits, Timeouts

PROTOCOL_VERSION = 1
AUTH_REQUIRED = -32000  # ACP's ErrorCode for "authentication required"
CLIENT_INFO = {"name": "xworkmate-bridge", "title": "XWorkmate Bridge", "version": "0.1.0"}
_CANCEL_WRITE_BOUND = 1.0  # seconds: a stuck stdin must not hold up a cancel
_PUMP_FAILURE_GRACE = 1.0  # seconds between SIGTERM and SIGKILL for an agent we can no longer read

logger = logging.getLogger(__name__)


class AcpConnection:
    """An agent process speaking ACP; create with :meth:`start`."""

    def __init__(self, process: AgentProcess, peer: JsonRpcPeer, timeouts: Timeouts, launch_model: str | None) -> None:
        self.process = process
        self.peer = peer
        self.launch_model = launch_model
        """The model passed with ``modelFlag`` on the command line, if any."""
        self.initialize_result: dict[str, Any] = {}
        self.sessions: set[str] = set()
        """ACP session ids created or loaded in this process."""
        self.hosted = False
        """The pumps run until :meth:`close` (:meth:`host`); else each user attaches them."""
        self._timeouts = timeouts
        self._pumps = anyio.CancelScope()

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        *,
        cwd: str | None,
        env: Mapping[str, str],
        limits: Limits,
        timeouts: Timeouts,
        launch_model: str | None = None,
        on_update: NotificationHandler | None = None,
        on_permission: RequestHandler | None = None,
    ) -> AcpConnection:
        """Spawn the agent; every client method other than ``session/request_permission``
        (``fs/*``, ``terminal/*``, extensions) is answered -32601 by the peer.

        Raises:
            SpawnError: The command could not be started.
        """
        process = await spawn(
            argv,
            cwd=cwd,
            env=env,
            max_line_bytes=limits.max_agent_line_bytes,
            stderr_tail_bytes=limits.stderr_tail_bytes,
        )
        peer = JsonRpcPeer(process, stderr_tail_bytes=limits.client_stderr_tail_bytes)
        if on_update is not None:
            peer.on_notification("session/update", on_update)
        if on_permission is not None:
            peer.on_request("session/request_permission", on_permission)
        return cls(process, peer, timeouts, launch_model)

    @property
    def alive(self) -> bool:
        """True while the process runs and the stream is intact."""
        return self.process.returncode is None and self.peer.error is None

    @property
    def initialized(self) -> bool:
        return bool(self.initialize_result)

    @property
    def can_load(self) -> bool:
        """The agent advertised ``agentCapabilities.loadSession``."""
        caps = self.initialize_result.get("agentCapabilities")
        return isinstance(caps, dict) and caps.get("loadSession") is True

    @property
    def auth_methods(self) -> list[dict[str, Any]]:
        methods = self.initialize_result.get("authMethods")
        return [m for m in methods if isinstance(m, dict)] if isinstance(methods, list) else []

    def host(self, tg: anyio.abc.TaskGroup) -> None:
        """Run the pumps in ``tg``, a task group that outlives the turns, until :meth:`close`.

        Per-turn pumps cost a turn on a kept agent about 0.2 ms of event-loop time to start and
        cancel their tasks (server CPU per turn 0.81 ms, 0.59 ms hosted); kept running, they
        also drain stderr between turns, answer a permission asked between turns and notice an
        agent that exited. The descendant tracker still runs per use (:meth:`attach`): an idle
        agent is not scanned.
        """
        self.hosted = True
        tg.start_soon(self._run_pumps)

    async def _run_pumps(self) -> None:
        with self._pumps:
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(partial(self.process.pump_stderr, track_descendants=False))
                    tg.start_soon(self.peer.run)
            except Exception:  # never into the adapter's task group, which every session shares
                logger.exception("pid %d: the agent's pumps failed; ending it", self.process.pid)
                with anyio.CancelScope(shield=True):
                    await self.process.terminate(_PUMP_FAILURE_GRACE)

    async def attach(self, tg: anyio.abc.TaskGroup) -> None:
        """Run, in ``tg`` until its scope is cancelled, what one use of the agent (a turn, a
        probe) needs: the descendant tracker, and the stdout reader and stderr pump unless
        :meth:`host` runs them.

        They start with the next pass of the event loop, without waiting for them: what the
        agent writes meanwhile waits in its pipes. Each wait was one more pass before the first
        request, and in a start storm a pass takes tens of milliseconds (bench case 4).
        """
        if self.hosted:
            tg.start_soon(self.process.track_descendants)
            return
        tg.start_soon(self.process.pump_stderr)
        tg.start_soon(self.peer.run)

    async def initialize(self) -> dict[str, Any]:
        """ACP ``initialize`` with no fs or terminal capabilities, bounded by
        ``initializeTimeout``."""
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": {
                "fs": {"readTextFile": False, "writeTextFile": False},
                "terminal": False,
            },
            "clientInfo": CLIENT_INFO,
        }
        result = await self.peer.request("initialize", params, timeout=self._timeouts.initialize_timeout)
        self.initialize_result = result if isinstance(result, dict) and result else {"ok": True}
        return self.initialize_result

    async def new_session(self, cwd: str, auth_method: str | None) -> dict[str, Any]:
        """``session/new``; on -32000 with ``auth_method`` set, ``authenticate`` and retry once.

        Raises:
            ResponseError: Including code -32000 when authentication is still required.
        """
        try:
            return await self._new_session(cwd)
        except ResponseError as exc:
            if exc.code != AUTH_REQUIRED or not auth_method:
                raise
        await self.peer.request("authenticate", {"methodId": auth_method}, timeout=self._timeouts.initialize_timeout)
        return await self._new_session(cwd)

    async def _new_session(self, cwd: str) -> dict[str, Any]:
        result = await self._call("session/new", {"cwd": cwd, "mcpServers": []})
        session_id = result.get("sessionId")
        if not isinstance(session_id, str) or not session_id:
            raise ResponseError(-32603, "session/new returned no sessionId")
        self.sessions.add(session_id)
        return result

    async def load_session(self, session_id: str, cwd: str) -> dict[str, Any]:
        """``session/load``; the agent replays the history as updates before it answers."""
        params = {"sessionId": session_id, "cwd": cwd, "mcpServers": []}
        result = await self._call("session/load", params)
        self.sessions.add(session_id)
        return result

    async def set_config_option(self, session_id: str, config_id: str, value: str) -> dict[str, Any]:
        params = {"sessionId": session_id, "configId": config_id, "value": value}
        return await self._call("session/set_config_option", params)

    async def set_model(self, session_id: str, model_id: str) -> dict[str, Any]:
        """The legacy ``session/set_model`` (gemini), removed from the spec in June 2026."""
        return await self._call("session/set_model", {"sessionId": session_id, "modelId": model_id})

    async def prompt(self, session_id: str, blocks: list[dict[str, Any]]) -> dict[str, Any]:
        """``session/prompt`` with no bound of its own: the turn timeout bounds it."""
        result = await self.peer.request("session/prompt", {"sessionId": session_id, "prompt": blocks}, timeout=None)
        return result if isinstance(result, dict) else {}

    async def cancel(self, session_id: str) -> None:
        """Send the ``session/cancel`` notification; a dead or stuck agent is ignored."""
        with anyio.move_on_after(_CANCEL_WRITE_BOUND), suppress(PeerError):
            await self.peer.notify("session/cancel", {"sessionId": session_id})

    async def close(self, grace: float) -> int | None:
        """Terminate the process group (SIGTERM, ``grace`` seconds, SIGKILL), then stop hosted
        pumps; idempotent."""
        try:
            return await self.process.terminate(grace)
        finally:
            self._pumps.cancel()

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        result = await self.peer.request(method, params, timeout=self._timeouts.session_new_timeout)
        return result if isinstance(result, dict) else {}
