"""ACP coding agents (codex-acp, gemini --acp, opencode acp, hermes acp, claude-agent-acp) as
providers: :class:`AcpAdapter` implements ``ProviderAdapter``; its sessions are
:class:`~compat.acp.session.AcpSession`.

One agent process per bridge session, spawned on the first turn and kept across turns together
with its ACP session. The adapter runs as a service (``async with adapter`` or
``await tg.start(adapter.run)``): its task group hosts every agent's pumps for the agent's life and
ends idle agents after ``idleTimeout``. Protocol details: acp-and-real-agents.md §0-§4; failure
handling: field-failures.md #2, #9, #10, #13, #14, #15, #17.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import logging
import os
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from bridge.rpc.redact import redact, register_env_secrets
from compat import tracing
from compat.acp.capacity import AgentCapacity
from compat.acp.connection import KILL_GRACE, AcpConnection, ClientRequestHandler
from compat.acp.session import AcpSession
from compat.base import ProbeResult, ProviderInfo
from compat.peer import NotificationHandler, PeerClosed, PeerError, RequestHandler, RequestTimeout
from compat.process.commands import find_command
from compat.process.env import child_env, cut_tail
from compat.process.spawn import SpawnError
from compat.settings import Limits, ProviderConfig, Timeouts

logger = logging.getLogger(__name__)

_REASON_TAIL_BYTES = 500  # stderr in a probe's reason (``unavailableReason``)


class AcpAdapter:
    """Implements ``ProviderAdapter`` for one configured ACP agent.

    Args:
        provider_id: the ``providers.<id>`` key.
        config: the provider's entry.
        limits / timeouts: the named settings of docs/api.md.
        client_version: the bridge's version, sent in ``initialize``'s ``clientInfo``.
    """

    def __init__(
        self,
        provider_id: str,
        config: ProviderConfig,
        limits: Limits,
        timeouts: Timeouts,
        *,
        client_version: str = "",
        capacity: AgentCapacity | None = None,
    ) -> None:
        label = config.label or provider_id
        self.info = ProviderInfo(provider_id=provider_id, label=label, category="acp")
        self.config = config
        self.limits = limits
        self.timeouts = timeouts
        self.capacity = capacity or AgentCapacity(limits.max_live_agents, timeouts.agent_capacity_timeout)
        """Shared by every ACP provider of a bridge (``bridge.wiring``): ``maxLiveAgents``."""
        self._client_version = client_version
        self._sessions: set[AcpSession] = set()
        self._probes: set[AcpConnection] = set()
        self._host: anyio.abc.TaskGroup | None = None
        self._own_tg: anyio.abc.TaskGroup | None = None
        register_env_secrets(config.env)

    # ---- ProviderAdapter --------------------------------------------------------------------------

    def probe_cheap(self) -> ProbeResult:
        """``ok`` when the command resolves to an executable (PATH, then the agents cache)."""
        path = find_command(self.config.command)
        if path is None:
            return ProbeResult("not_found", f"command not found: {self.config.command}")
        return ProbeResult("ok", path)

    async def probe_full(self) -> ProbeResult:
        """Spawn the agent, ``initialize`` within ``initializeTimeout``, then end it.

        Returns:
            ``ok`` (detail: agent name and version), ``not_found``, or ``error`` with a redacted
            reason (timeout, exit code and stderr tail, error response).
        """
        cheap = self.probe_cheap()
        if not cheap.available:
            return cheap
        result = ProbeResult("error", "the probe did not finish")
        async with anyio.create_task_group() as tg:
            result = await self._probe(tg)
            tg.cancel_scope.cancel()  # the agent's pumps: the probe ended it
        return result

    async def preflight(self, params: dict[str, Any]) -> None:
        """ACP turns take no provider-family params: nothing to refuse."""

    def open_session(self, session_id: str) -> AcpSession:
        """A new provider session; its agent process starts on its first turn."""
        session = AcpSession(self, session_id)
        self._sessions.add(session)
        return session

    async def aclose(self) -> None:
        """End every session and probe process this adapter started (bounded, shielded)."""
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for session in list(self._sessions):
                    tg.start_soon(session.aclose)
                for conn in list(self._probes):
                    tg.start_soon(conn.close, KILL_GRACE)

    # ---- service lifetime -------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Host the agents' pumps and idle reapers until cancelled, then end every process."""
        try:
            async with anyio.create_task_group() as tg:
                self._host = tg
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._host = None
            await self.aclose()

    async def __aenter__(self) -> AcpAdapter:
        self._own_tg = anyio.create_task_group()
        await self._own_tg.__aenter__()
        await self._own_tg.start(self.run)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._own_tg is not None
        self._own_tg.cancel_scope.cancel()
        await self._own_tg.__aexit__(None, None, None)  # the body's exception propagates as is

    # ---- used by AcpSession -----------------------------------------------------------------------

    async def start_connection(
        self,
        cwd: str | None,
        launch_model: str | None,
        on_update: NotificationHandler | None = None,
        on_permission: RequestHandler | None = None,
        client_capabilities: dict[str, Any] | None = None,
        on_client_request: ClientRequestHandler | None = None,
    ) -> AcpConnection:
        """Spawn the configured agent (with ``modelFlag launch_model`` when given) and host its
        pumps in the adapter's task group; ``client_capabilities`` and ``on_client_request`` as
        ``AcpConnection.start`` takes them.

        Raises:
            SpawnError: The command is not found or cannot be started.
            RuntimeError: The adapter is not running as a service.
        """
        if self._host is None:
            raise RuntimeError("the ACP adapter is not running: use it with `async with` or start its run()")
        argv = self._argv()
        if launch_model and self.config.model_flag:
            argv += [self.config.model_flag, launch_model]
        with tracing.span("agent.start", {"xworkmate.provider": self.info.provider_id}):
            # a cancel while the start waits its turn starts nothing; a begun start is handed back
            conn = await self._spawn(
                argv, cwd, launch_model, on_update, on_permission, client_capabilities, on_client_request
            )
            with anyio.CancelScope(shield=True):  # from here the process is hosted, or ended
                if self._host is None:  # the adapter stopped while the agent started
                    await conn.close(KILL_GRACE)
                    raise RuntimeError("the ACP adapter stopped while the agent started")
                await self._host.start(conn.run)
        return conn

    def watch_idle(self, session: AcpSession, wake: anyio.Event) -> None:
        """Start the session's idle reaper (ends its agent after ``idleTimeout``)."""
        if self._host is not None:
            self._host.start_soon(session.reap_when_idle, wake)

    def forget(self, session: AcpSession) -> None:
        self._sessions.discard(session)

    # ---- internals --------------------------------------------------------------------------------

    def _argv(self) -> list[str]:
        command = find_command(self.config.command)
        if command is None:
            raise SpawnError(self.config.command or "", "command not found")
        return [command, *(self.config.args or [])]

    async def _spawn(
        self,
        argv: list[str],
        cwd: str | None,
        launch_model: str | None,
        on_update: NotificationHandler | None = None,
        on_permission: RequestHandler | None = None,
        client_capabilities: dict[str, Any] | None = None,
        on_client_request: ClientRequestHandler | None = None,
    ) -> AcpConnection:
        return await AcpConnection.start(
            argv,
            cwd=cwd,
            env=child_env(self.config.env, self.config.env_passthrough),
            limits=self.limits,
            timeouts=self.timeouts,
            launch_model=launch_model,
            client_version=self._client_version,
            on_update=on_update,
            on_permission=on_permission,
            client_capabilities=client_capabilities,
            on_client_request=on_client_request,
        )

    async def _probe(self, tg: anyio.abc.TaskGroup) -> ProbeResult:
        conn: AcpConnection | None = None
        try:
            # a cancel while the start waits its turn starts nothing; a begun start is handed
            # back (compat.process.spawn), and nothing awaits before the finally can close it
            conn = await self._spawn(self._argv(), self.config.cwd or os.getcwd(), None)
            self._probes.add(conn)
            await tg.start(conn.run)
            info = await conn.initialize()
        # A probe's reason reaches every client in acp.capabilities: a short classified reason
        # there, the detail (stderr: paths, environment) only in the bridge's log.
        except SpawnError as exc:
            logger.warning("provider %s: probe: %s", self.info.provider_id, redact(str(exc)))
            return ProbeResult("error", "the agent could not be started (see the bridge's log)")
        except RequestTimeout as exc:
            return ProbeResult("error", f"initialize timed out after {exc.timeout} s")
        except PeerClosed as exc:
            tail = cut_tail(exc.stderr_tail, _REASON_TAIL_BYTES)  # redacted, on a line boundary
            if tail.strip():
                logged, where = f"; stderr:\n{tail}", " (see the bridge's log)"
            else:  # nothing in the log to point to
                logged, where = " and wrote nothing to stderr", ", with nothing on stderr"
            logger.warning(
                "provider %s: probe: agent exited with code %s%s", self.info.provider_id, exc.exit_code, logged
            )
            return ProbeResult("error", f"the agent exited with code {exc.exit_code} during initialize{where}")
        except PeerError as exc:
            logger.warning("provider %s: probe: %s", self.info.provider_id, redact(str(exc)))
            return ProbeResult("error", "the agent answered initialize with an error (see the bridge's log)")
        finally:
            if conn is not None:
                await conn.close(KILL_GRACE)
                self._probes.discard(conn)
        return ProbeResult("ok", _agent_label(info))


def _agent_label(info: dict[str, Any]) -> str:
    agent = info.get("agentInfo")
    if not isinstance(agent, dict):
        return "initialize ok"
    return " ".join(str(agent[k]) for k in ("name", "version") if agent.get(k)) or "initialize ok"
