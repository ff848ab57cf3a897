"""One running turn: the ``TurnSink`` adapters report to, output accounting and limits.

The turn publishes each update to its session's log (which numbers it) and to the requesting
connection. Publishing never blocks: connections buffer with a bound and drop slow clients, so a
stuck client cannot stall an agent (field-failures #7).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import uuid4

import anyio
import msgspec

from compat.base import PermissionEvent, TextDelta, ThoughtDelta, TurnEvent
from compat.settings import Limits, Timeouts
from orchestrator import updates
from orchestrator.session import Session

Notify = Callable[[str, Any], None]


def cut_utf8(text: str, max_bytes: int) -> str:
    """The longest prefix of ``text`` whose UTF-8 encoding fits in ``max_bytes``."""
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= max_bytes:
        return text
    return encoded[:max_bytes].decode("utf-8", "ignore")


class PendingPermission(msgspec.Struct, eq=False):
    option_ids: frozenset[str]
    answered: anyio.Event = msgspec.field(default_factory=anyio.Event)
    option_id: str | None = None

    def answer(self, option_id: str | None) -> None:
        if not self.answered.is_set():
            self.option_id = option_id
            self.answered.set()


class TurnRunner:
    """Implements ``compat.base.TurnSink`` for one turn.

    Args:
        session: the bridge session the turn belongs to.
        turn_id: ``turn-<unix nanoseconds>``.
        notify: sends a notification to the requesting connection (never blocks).
        on_output_limit: called once when the output passes ``limits.max_output_bytes``; it
            should stop the provider turn.
    """

    def __init__(
        self,
        session: Session,
        turn_id: str,
        notify: Notify,
        limits: Limits,
        timeouts: Timeouts,
        on_output_limit: Callable[[], None],
    ) -> None:
        self.session = session
        self.turn_id = turn_id
        self._notify = notify
        self._limits = limits
        self._timeouts = timeouts
        self._on_output_limit = on_output_limit
        self._parts: list[str] = []
        self._output_bytes = 0
        self._thought_bytes = 0
        self.output_exceeded = False
        self.cancel_requested = False

    @property
    def output(self) -> str:
        return "".join(self._parts)

    def publish(self, params: dict[str, Any]) -> None:
        full = {"sessionId": self.session.session_id, "threadId": self.session.thread_id, "turnId": self.turn_id}
        full.update(params)
        self.session.log.append(full)
        self._notify("session.update", full)

    def emit(self, event: TurnEvent) -> None:
        if isinstance(event, TextDelta):
            self._text(event.text)
            return
        if isinstance(event, ThoughtDelta):
            # Reasoning is not output, but it is streamed and logged: the same budget bounds it.
            self._thought_bytes += len(event.text)
            if self._thought_bytes > self._limits.max_output_bytes:
                return
        self.publish(updates.from_event(event))

    def _text(self, text: str) -> None:
        if self.output_exceeded or not text:
            return
        room = self._limits.max_output_bytes - self._output_bytes
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > room:
            text = cut_utf8(text, room)
            size = len(text.encode("utf-8", "surrogatepass"))
            self.output_exceeded = True
        self._parts.append(text)
        self._output_bytes += size
        # A single update stays under maxUpdateBytes; 4 bytes per character bounds UTF-8 size.
        step = max(1, self._limits.max_update_bytes // 4 - 512)
        for start in range(0, len(text), step):
            self.publish(updates.delta(text[start : start + step]))
        if self.output_exceeded:
            self._on_output_limit()

    async def ask_permission(self, tool_call: dict[str, Any], options: list[dict[str, Any]]) -> str | None:
        """Policy ``ask``: publish a ``permission`` update and wait for ``session.permission``.

        Returns the chosen optionId, or None after ``permissionTimeout`` seconds or on cancel.
        """
        if self.cancel_requested:
            return None
        request_id = f"perm-{uuid4().hex}"
        ids = frozenset(str(o.get("optionId")) for o in options if isinstance(o, dict))
        pending = PendingPermission(ids)
        self.session.permissions[request_id] = pending
        try:
            self.emit(PermissionEvent(request_id, tool_call, options))
            with anyio.move_on_after(self._timeouts.permission_timeout):
                await pending.answered.wait()
        finally:
            self.session.permissions.pop(request_id, None)
        return pending.option_id

    def cancel_permissions(self) -> None:
        self.cancel_requested = True
        for pending in tuple(self.session.permissions.values()):
            pending.answer(None)

    def finish(self, status: str, message: str, error_code: str | None) -> None:
        self.publish(updates.done(status, cut_utf8(message, self._limits.done_message_bytes), error_code))
