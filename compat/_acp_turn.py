"""One ACP turn's state, and how peer errors become the turn's ``TurnError``.

Error codes come from the one table in docs/api.md: ``AGENT_EXITED``, ``AGENT_PROTOCOL_ERROR``,
``AGENT_START_TIMEOUT``, ``AGENT_AUTH_REQUIRED``, ``AGENT_ERROR``. Every message and piece of
upstream data is redacted here, before it can reach a client or a log.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec

from bridge.rpc.redact import redact
from compat._acp_connection import AUTH_REQUIRED, AcpConnection
from compat._acp_mapping import UpdateMapper, redact_data
from compat.base import TurnError, TurnEvent, TurnOutcome, TurnRequest, TurnSink
from compat.jsonrpc_peer import PeerClosed, PeerError, PeerProtocolError, RequestTimeout, ResponseError

AUTH_HINT = (
    "agents get only an allow-listed environment: put the agent's API key under providers.<id>.env "
    "(or name it in envPassthrough), or set providers.<id>.authMethod to one of authMethods"
)


class TurnFailure(Exception):
    """Ends the turn as ``failed`` with ``error``; ``kill`` ends the agent process too."""

    def __init__(self, code: str, message: str, data: dict[str, Any], *, kill: bool) -> None:
        super().__init__(message)
        self.error = TurnError(code, message, data)
        self.kill = kill


class TurnState(msgspec.Struct, eq=False):
    """What one running turn shares between its body, its supervisor and the agent's callbacks."""

    request: TurnRequest
    sink: TurnSink
    mapper: UpdateMapper
    attention: anyio.Event = msgspec.field(default_factory=anyio.Event)  # body done or cancel asked
    body_done: anyio.Event = msgspec.field(default_factory=anyio.Event)
    permission_scopes: set[anyio.CancelScope] = msgspec.field(default_factory=set)
    outcome: TurnOutcome | None = None
    stop_reason: str | None = None
    resolved_model: str | None = None
    context_reset: bool = False
    cancel_requested: bool = False
    kill_now: bool = False
    prompt_sent: bool = False
    replaying: bool = False

    def request_cancel(self, *, kill_now: bool = False) -> None:
        # Pending permissions are answered after session/cancel is sent (the ACP order); a
        # permission asked from now on is answered cancelled at once.
        self.cancel_requested = True
        self.kill_now = self.kill_now or kill_now
        self.attention.set()

    def cancel_permissions(self) -> None:
        for scope in self.permission_scopes:
            scope.cancel()

    def emit(self, events: list[TurnEvent]) -> None:
        for event in events:
            self.sink.emit(event)


def turn_failure(exc: PeerError, phase: str, conn: AcpConnection | None, tail_bytes: int) -> TurnFailure:
    """Map a peer error raised in ``phase`` (``initialize``, ``session`` or ``prompt``).

    Args:
        exc: What the peer raised.
        phase: Where the turn was; an error answer to ``initialize`` also ends the process.
        conn: The connection, for the stderr tail and the advertised ``authMethods``.
        tail_bytes: How much stderr to attach (``Limits.client_stderr_tail_bytes``).
    """
    tail = conn.process.stderr_tail(tail_bytes) if conn is not None else ""
    if isinstance(exc, PeerClosed):
        data = {"exitCode": exc.exit_code, "stderrTail": exc.stderr_tail}
        return TurnFailure("AGENT_EXITED", f"agent exited with code {exc.exit_code}", data, kill=True)
    if isinstance(exc, PeerProtocolError):
        return TurnFailure("AGENT_PROTOCOL_ERROR", str(exc), {"stderrTail": tail}, kill=True)
    if isinstance(exc, RequestTimeout):
        message = f"agent did not answer {exc.method} within {exc.timeout} s"
        data = {"method": exc.method, "timeout": exc.timeout, "stderrTail": tail}
        return TurnFailure("AGENT_START_TIMEOUT", message, data, kill=True)
    assert isinstance(exc, ResponseError)
    upstream = {"code": exc.code, "message": redact(exc.message), "data": redact_data(exc.data)}
    if exc.code == AUTH_REQUIRED:
        methods = [m.get("id") for m in conn.auth_methods] if conn is not None else []
        message = upstream["message"] or "authentication required"
        data = {**upstream, "authMethods": methods, "hint": AUTH_HINT}
        return TurnFailure("AGENT_AUTH_REQUIRED", message, data, kill=False)
    message = upstream["message"] or "agent error"
    detail = _detail(upstream["data"])
    if detail and detail not in message:  # "Internal error" alone tells a user nothing
        message = f"{message}: {detail}"[:MAX_DETAIL_CHARS]
    return TurnFailure("AGENT_ERROR", message, upstream, kill=phase == "initialize")


MAX_DETAIL_CHARS = 500


def _detail(data: Any) -> str | None:
    """The agent's own explanation inside a JSON-RPC error's ``data`` (Hermes: ``details``,
    codex-acp: ``message``), already redacted."""
    if isinstance(data, dict):
        for key in ("details", "message"):
            value = data.get(key)
            if isinstance(value, str) and value.strip():
                return " ".join(value.split())
    return None
