"""A ``TurnSink`` that keeps every event: for turns run outside a bridge session (the MCP
``llmwiki_agent_run`` tool) and for tests.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from typing import Any

from compat.base import TextDelta, TurnEvent

MAX_EVENTS = 10_000


class CollectingSink:
    """Records events (at most ``MAX_EVENTS``); permission requests are refused."""

    def __init__(self) -> None:
        self.events: list[TurnEvent] = []

    def begin(self) -> None:
        """Nothing to mark: the turn has no state machine here."""

    def emit(self, event: TurnEvent) -> None:
        if len(self.events) < MAX_EVENTS:
            self.events.append(event)

    async def ask_permission(self, tool_call: dict[str, Any], options: list[dict[str, Any]]) -> str | None:
        return None

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TextDelta))
