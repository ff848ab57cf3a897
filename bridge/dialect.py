"""Which protocol a connection speaks, decided by its first message (docs/api.md "Editor mode").

``acp-stdio`` and ``GET /acp`` serve two dialects: the bridge's own methods (hybrid envelope) and,
when the first message is an ACP ``initialize`` with an integer ``protocolVersion``, plain ACP
handled by a :class:`LineAgent` (``bridge.acp_agent.AcpAgent``). The transports import only this
module, so they stay free of sessions and the orchestrator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import anyio
import anyio.abc
import msgspec


def is_acp_initialize(message: bytes | str) -> bool:
    """Whether ``message`` is an ACP ``initialize`` request (an integer ``protocolVersion``; the
    bridge's own clients never send ``initialize``)."""
    try:
        obj = msgspec.json.decode(message)
    except (msgspec.DecodeError, RecursionError, ValueError):  # deep nesting raises RecursionError
        return False
    if not isinstance(obj, dict) or obj.get("method") != "initialize":
        return False
    params = obj.get("params")
    version = params.get("protocolVersion") if isinstance(params, dict) else None
    return isinstance(version, int) and not isinstance(version, bool)


class LineAgent(Protocol):
    """A peer that takes a connection's messages itself, one JSON-RPC message per line."""

    @property
    def closers(self) -> list[Callable[[], None]]:
        """Run when the connection closes."""
        ...

    async def idle(self) -> None:
        """Until every request received is answered."""
        ...

    async def room(self) -> None:
        """Until the agent can take another request (feed the next message after it: a client
        that pipelines requests waits in its socket, not in a refusal)."""
        ...

    def feed(self, line: bytes) -> None:
        """One received message, in order."""
        ...

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled (host it in the connection's task group)."""
        ...


Write = Callable[[bytes], None]
"""Queues one outgoing line (with or without its newline)."""
Backlog = Callable[[], int]
"""The bytes the connection has queued and not yet sent."""
EditorFactory = Callable[[Write, Backlog], LineAgent]
"""stdio: builds the agent on the process's output."""
WsEditorFactory = Callable[[Write, Backlog, str, str], LineAgent]
"""WebSocket: builds the agent on ``(write, backlog, principal, connection_id)``."""
