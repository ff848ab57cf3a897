"""ACP coding agents (codex-acp, gemini --acp, opencode acp, hermes acp, claude-agent-acp) as
providers: :class:`AcpAdapter` implements ``ProviderAdapter``, :class:`AcpSession` implements
``ProviderSession``.

One agent process per bridge session, spawned on the first turn and kept across turns together
with its ACP session. The adapter ends idle processes after ``idleTimeout`` when it runs as a
service (``async with adapter`` or ``await tg.start(adapter.run)``); otherwise an expired idle
process is replaced at the start of the next turn. Protocol details: acp-and-real-agents.md
§0-§4; failure handling: field-failures.md #2, #9, #10, #13, #14, #15, #17.

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
from compat._acp_connection import AcpConnection
from compat._acp_mapping import IGNORED_UPDATE_KINDS, UNMAPPED_UPDATE_KINDS
from compat._acp_session import KILL_GRACE, AcpSession
from compat._process import SpawnError, child_env, cut_tail
from compat.base import ProbeResult, ProviderInfo
from compat.jsonrpc_peer import (
    NotificationHandler,
    PeerClosed,
    PeerError,
    RequestHandler,
    RequestTimeout,
)
from compat.presets import find_command
from compat.settings import Limits, ProviderConfig, Timeouts

__all__ = ["IGNORED_UPDATE_KINDS", "UNMAPPED_UPDATE_KINDS", "AcpAdapter", "AcpSession"]

logger = logging.getLogger(__name__)

_REASON_TAIL_BYTES = 500  # stderr in a probe's reason (``unavailableReason``)


class AcpAdapter:
    """Implements ``ProviderAdapter`` for one configured ACP agent.

    Matches ``AdapterFactory``: ``AcpAdapter(provider_id, config, limits, timeouts)``.
    """

    def __init__(self, provider_id: str, config: ProviderConfig, limits: Limits, timeouts: Timeouts) -> None:
        label = config.label or provider_id
        self.info = ProviderInfo(provider_id=provider_id, label=label, category="acp")
        self.config = config
        self.limits = limits
        self.timeouts = timeouts
        self._sessions: set[AcpSession] = set()
        self._probes: set[AcpConnection] = set()
        self._host: anyio.abc.TaskGroup | None = None
        self._own_tg: anyio.abc.TaskGroup | None = None
        register_env_secrets(config.env)

    # ---- ProviderAdapter ----------------------------------------------------------------------

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
        async with anyio.create_task_group() as tg:
            result = await self._probe(tg)
            tg.cancel_scope.cancel()
        return result

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

    # ---- service lifetime (idle reaping) ------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Host idle reapers until cancelled, then end every process."""
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

    # ---- used by AcpSession -----------------------------------------------------------------

    async def start_connection(
        self,
        cwd: str | None,
        launch_model: str | None,
        on_update: NotificationHandler | None = None,
        on_permission: RequestHandler | None = None,
    ) -> AcpConnection:
        """Spawn the configured agent (with ``modelFlag launch_model`` when given).

        Raises:
            SpawnError: The command is not found or cannot be started.
        """
        command = find_command(self.config.command)
        if command is None:
            raise SpawnError(self.config.command or "", "command not found")
        argv = [command, *(self.config.args or [])]
        if launch_model and self.config.model_flag:
            argv += [self.config.model_flag, launch_model]
        return await AcpConnection.start(
            argv,
            cwd=cwd,
            env=child_env(self.config.env, self.config.env_passthrough),
            limits=self.limits,
            timeouts=self.timeouts,
            launch_model=launch_model,
            on_update=on_update,
            on_permission=on_permission,
        )

    def host_connection(self, conn: AcpConnection) -> None:
        """Run ``conn``'s pumps for its whole life when the adapter runs as a service."""
        if self._host is not None:
            conn.host(self._host)

    def watch_idle(self, session: AcpSession, wake: anyio.Event) -> None:
        """Start the session's idle reaper when the adapter runs as a service."""
        if self._host is not None:
            self._host.start_soon(session.reap_when_idle, wake)

    def forget(self, session: AcpSession) -> None:
        self._sessions.discard(session)

    async def _probe(self, tg: anyio.abc.TaskGroup) -> ProbeResult:
        conn: AcpConnection | None = None
        try:
            with anyio.CancelScope(shield=True):
                conn = await self.start_connection(self.config.cwd or os.getcwd(), None)
                self._probes.add(conn)
            await conn.attach(tg)
            info = await conn.initialize()
        except SpawnError as exc:
            return ProbeResult("error", redact(str(exc)))
        except RequestTimeout as exc:
            return ProbeResult("error", f"initialize timed out after {exc.timeout} s")
        except PeerClosed as exc:
            tail = cut_tail(exc.stderr_tail, _REASON_TAIL_BYTES)  # redacted, on a line boundary
            detail = f"agent exited with code {exc.exit_code}: {tail}"
            return ProbeResult("error", detail)
        except PeerError as exc:
            return ProbeResult("error", redact(str(exc)))
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
