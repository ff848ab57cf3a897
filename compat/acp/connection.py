"""One ACP agent process: spawn, handshake, and the agent methods the ACP session calls.

The connection owns an :class:`~compat.process.AgentProcess` and its
:class:`~compat.peer.JsonRpcPeer`. :meth:`AcpConnection.run` pumps the process's pipes into the
peer and hosts the peer's request handlers for the process's whole life, in a task group of the
adapter's (between turns too: a permission asked then is answered, stderr is drained, an exit is
noticed). Method names and params follow the ACP v1 schema (acp-and-real-agents.md §1).

Messages are raw dicts, not the ``agent-client-protocol`` package's models: that package drops
fields it does not know (gemini's ``models`` in ``session/new``, acp-and-real-agents.md §0 fact 2)
and importing its schema costs about a second, on the event loop, at the first agent. The tests
check what the bridge sends against those models (tests/compat/test_acp_schema.py).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
import anyio.abc

from compat.base import CLIENT_METHODS, offers
from compat.peer import (
    Call,
    JsonRpcPeer,
    NotificationHandler,
    PeerClosed,
    PeerError,
    PeerProtocolError,
    RequestHandler,
    ResponseError,
)
from compat.process.child import AgentProcess
from compat.process.lines import LineTooLong
from compat.process.spawn import spawn
from compat.settings import Limits, Timeouts

PROTOCOL_VERSION = 1
AUTH_REQUIRED = -32000  # ACP's ErrorCode for "authentication required"
CLIENT_INFO = {"name": "xworkmate-bridge", "title": "XWorkmate Bridge"}
NO_CLIENT_CAPABILITIES: dict[str, Any] = {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False}
ClientRequestHandler = Callable[[str, dict[str, Any]], Awaitable[Any]]
"""``handler(method, params)`` for an agent's ``fs/*`` / ``terminal/*`` request."""
"""``clientInfo`` in ``initialize``; the adapter adds the bridge's version."""
KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL when the bridge ends an agent itself

logger = logging.getLogger(__name__)


class AcpConnection:
    """An agent process speaking ACP; create with :meth:`start`, then host :meth:`run`."""

    def __init__(
        self,
        process: AgentProcess,
        limits: Limits,
        timeouts: Timeouts,
        launch_model: str | None,
        client_version: str = "",
    ) -> None:
        self.process = process
        self.peer = JsonRpcPeer(process.write, name=f"pid {process.pid}")
        self.launch_model = launch_model
        """The model passed with ``modelFlag`` on the command line, if any."""
        self.initialize_result: dict[str, Any] = {}
        self.client_capabilities: dict[str, Any] = NO_CLIENT_CAPABILITIES
        """What ``initialize`` advertises (fixed for the process's life)."""
        self.sessions: set[str] = set()
        """ACP session ids created or loaded in this process."""
        self._limits = limits
        self._timeouts = timeouts
        self._client_info = {**CLIENT_INFO, "version": client_version}

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
        client_version: str = "",
        on_update: NotificationHandler | None = None,
        on_permission: RequestHandler | None = None,
        client_capabilities: dict[str, Any] | None = None,
        on_client_request: ClientRequestHandler | None = None,
    ) -> AcpConnection:
        """Spawn the agent. ``client_capabilities`` (default: none) is what ``initialize``
        advertises; the ``fs/*`` and ``terminal/*`` requests they allow go to
        ``on_client_request(method, params)``. Every other client method but
        ``session/request_permission`` (extensions too) is answered -32601 by the peer.

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
        conn = cls(process, limits, timeouts, launch_model, client_version)
        conn.client_capabilities = client_capabilities or NO_CLIENT_CAPABILITIES
        if on_client_request is not None:
            for method in CLIENT_METHODS:
                if offers(conn.client_capabilities, method):
                    conn.peer.on_request(method, functools.partial(on_client_request, method))
        if on_update is not None:
            conn.peer.on_notification("session/update", on_update)
        if on_permission is not None:
            conn.peer.on_request("session/request_permission", on_permission)
        return conn

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Pump the agent's output into the peer until the agent is gone; never raises for what
        the agent does (the adapter's task group, which every session shares, must not end).

        At the end every request still waiting fails: :class:`~compat.peer.PeerClosed` (exit code,
        stderr tail) when the agent exited or closed stdout, :class:`~compat.peer.PeerProtocolError`
        when it broke the framing (then the agent is ended too).
        """
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(self.peer.serve)
                task_status.started()
                try:
                    await self.process.run(self.peer.feed)
                except LineTooLong as exc:
                    self.peer.close(PeerProtocolError(str(exc)))
                else:
                    tail = self.process.stderr_tail(self._limits.client_stderr_tail_bytes)
                    self.peer.close(PeerClosed(self.process.returncode, tail))
                tg.cancel_scope.cancel()
        except Exception:
            logger.exception("pid %d: pumping the agent failed; ending it", self.process.pid)
            self.peer.close(PeerProtocolError("internal error reading the agent's output"))
        finally:
            if isinstance(self.peer.error, PeerProtocolError):
                try:
                    await self.process.terminate(KILL_GRACE)
                except Exception:
                    logger.exception("pid %d: ending the agent failed", self.process.pid)

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

    @property
    def has_unanswered(self) -> bool:
        """A request to the agent is still waiting for its answer: the agent's state is unknown."""
        return self.peer.unanswered > 0

    def drain(self) -> None:
        """Hand over every line the agent has already written (see ``AgentProcess.drain``)."""
        try:
            self.process.drain()
        except LineTooLong as exc:
            self.peer.close(PeerProtocolError(str(exc)))

    async def initialize(self) -> dict[str, Any]:
        """ACP ``initialize`` with :attr:`client_capabilities` (no fs or terminal unless an
        editor relays them), bounded by ``initializeTimeout``."""
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": self.client_capabilities,
            "clientInfo": self._client_info,
        }
        result = await self.peer.request("initialize", params, timeout=self._timeouts.initialize_timeout)
        self.initialize_result = result if isinstance(result, dict) and result else {"ok": True}
        return self.initialize_result

    async def new_session(
        self, cwd: str, auth_method: str | None, mcp_servers: Sequence[dict[str, Any]] = ()
    ) -> dict[str, Any]:
        """``session/new`` with the ``mcp_servers`` the agent can take (:meth:`usable_mcp_servers`);
        on -32000 with ``auth_method`` set, ``authenticate`` and retry once.

        Raises:
            ResponseError: Including code -32000 when authentication is still required.
        """
        servers = self.usable_mcp_servers(mcp_servers)
        try:
            return await self._new_session(cwd, servers)
        except ResponseError as exc:
            if exc.code != AUTH_REQUIRED or not auth_method:
                raise
        await self.peer.request("authenticate", {"methodId": auth_method}, timeout=self._timeouts.initialize_timeout)
        return await self._new_session(cwd, servers)

    def usable_mcp_servers(self, servers: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The ACP ``mcpServers`` entries this agent accepts: stdio ones always, ``http`` and
        ``sse`` ones where its ``mcpCapabilities`` advertise them; the others are logged by name."""
        caps = self.initialize_result.get("agentCapabilities")
        mcp = caps.get("mcpCapabilities") if isinstance(caps, dict) else None
        mcp = mcp if isinstance(mcp, dict) else {}
        usable, left = [], []
        for server in servers:
            kind = server.get("type", "stdio")
            (usable if kind == "stdio" or mcp.get(kind) is True else left).append(server)
        if left:
            names = ", ".join(f"{str(s.get('name', '?'))[:100]} ({s.get('type')})" for s in left[:20])
            logger.warning("pid %d: the agent does not take these MCP servers: %s", self.process.pid, names)
        return usable

    async def _new_session(self, cwd: str, mcp_servers: list[dict[str, Any]]) -> dict[str, Any]:
        result = await self._call("session/new", {"cwd": cwd, "mcpServers": mcp_servers})
        session_id = result.get("sessionId")
        if not isinstance(session_id, str) or not session_id:
            raise ResponseError(-32603, "session/new returned no sessionId")
        self.sessions.add(session_id)
        return result

    async def load_session(
        self, session_id: str, cwd: str, mcp_servers: Sequence[dict[str, Any]] = ()
    ) -> dict[str, Any]:
        """``session/load``; the agent replays the history as updates before it answers."""
        params = {"sessionId": session_id, "cwd": cwd, "mcpServers": self.usable_mcp_servers(mcp_servers)}
        result = await self._call("session/load", params)
        self.sessions.add(session_id)
        return result

    async def set_config_option(self, session_id: str, config_id: str, value: str) -> dict[str, Any]:
        params = {"sessionId": session_id, "configId": config_id, "value": value}
        return await self._call("session/set_config_option", params)

    async def set_model(self, session_id: str, model_id: str) -> dict[str, Any]:
        """The legacy ``session/set_model`` (gemini), removed from the spec in June 2026."""
        return await self._call("session/set_model", {"sessionId": session_id, "modelId": model_id})

    def start_prompt(self, session_id: str, blocks: list[dict[str, Any]]) -> Call:
        """Send ``session/prompt``; await :meth:`prompt_result` for its answer."""
        return self.peer.call("session/prompt", {"sessionId": session_id, "prompt": blocks})

    async def prompt_result(self, call: Call) -> dict[str, Any]:
        """The ``session/prompt`` answer, with no bound of its own: the turn timeout bounds it."""
        result = await self.peer.wait(call, None)
        return result if isinstance(result, dict) else {}

    def cancel(self, session_id: str) -> None:
        """Send the ``session/cancel`` notification now; a dead agent is ignored."""
        try:
            self.peer.notify("session/cancel", {"sessionId": session_id})
        except PeerError as exc:  # the agent is gone: nothing to cancel
            logger.debug("session/cancel not sent: %s", exc)

    async def close(self, grace: float) -> int | None:
        """Terminate the process group (SIGTERM, ``grace`` seconds, SIGKILL); idempotent. The
        pumps end with the process."""
        return await self.process.terminate(grace)

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        result = await self.peer.request(method, params, timeout=self._timeouts.session_new_timeout)
        return result if isinstance(result, dict) else {}
