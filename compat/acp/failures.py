"""How the peer's errors become an ACP turn's ``TurnError``.

Error codes come from the one table in docs/api.md: ``AGENT_EXITED``, ``AGENT_PROTOCOL_ERROR``,
``AGENT_START_TIMEOUT``, ``AGENT_AUTH_REQUIRED``, ``AGENT_ERROR``. Every message and piece of
upstream data is redacted here, before it can reach a client or a log.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from typing import Any

from bridge.rpc.redact import redact
from compat.acp.connection import AUTH_REQUIRED, AcpConnection
from compat.acp.mapping import redact_data
from compat.base import TurnError
from compat.peer import PeerClosed, PeerError, PeerProtocolError, RequestTimeout, ResponseError

AUTH_HINT = (
    "agents get only an allow-listed environment: put the agent's API key under providers.<id>.env "
    "(or name it in envPassthrough), or set providers.<id>.authMethod to one of authMethods"
)
AUTH_HINT_NO_METHODS = (
    "agents get only an allow-listed environment: put the agent's API key under providers.<id>.env "
    "(or name it in envPassthrough), or log the agent in once from a terminal as the bridge's user"
)
"""For an agent that names no ``authMethods`` in ``initialize``: there is none to choose."""


class TurnFailure:
    """How a peer error ends the turn: ``failed`` with ``error``; ``kill`` ends the agent too."""

    __slots__ = ("error", "kill")

    def __init__(self, code: str, message: str, data: dict[str, Any], *, kill: bool) -> None:
        self.error = TurnError(code, message, data)
        self.kill = kill


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
        if exc.exit_code is None:  # it closed stdout and lives on: it is ended with the turn
            return TurnFailure("AGENT_EXITED", "agent closed its output while still running", data, kill=True)
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
        data = {**upstream, "authMethods": methods, "hint": AUTH_HINT if methods else AUTH_HINT_NO_METHODS}
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
