"""Turn events → ``session.update`` params (docs/api.md "Update stream").

Every update carries ``sessionId, threadId, turnId, seq, type, event, pending, error`` and a
``structuredEvent`` ``{type: "text"|"thinking"|"tool_call"|"status", …}``. ``event: "completed"``
appears only on ``done``, because the app ends its stream on it.
"""

from __future__ import annotations

from typing import Any

from compat.base import (
    PermissionEvent,
    PlanEvent,
    SessionStateEvent,
    StatusEvent,
    TextDelta,
    ThoughtDelta,
    ToolCallEvent,
    TurnEvent,
    UsageEvent,
)


def started() -> dict[str, Any]:
    return {
        "type": "status",
        "event": "started",
        "message": "session started",
        "pending": True,
        "error": False,
        "structuredEvent": {"type": "status", "status": "started", "text": "session started"},
    }


def delta(text: str) -> dict[str, Any]:
    return {
        "type": "delta",
        "event": "delta",
        "delta": text,
        "pending": True,
        "error": False,
        "structuredEvent": {"type": "text", "text": text},
    }


def done(status: str, message: str, error_code: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {
        "type": "done",
        "event": "completed",
        "message": message,
        "pending": False,
        "error": status != "completed",
        "status": status,
        "structuredEvent": {"type": "status", "status": status, "text": message},
    }
    if error_code:
        params["errorCode"] = error_code
    return params


WAIT_TEXT = {
    "capacity": "waiting for capacity: a free turn slot (maxRunningTurns) or agent slot (maxLiveAgents)",
    "starting": "waiting for the agent to start",
    "output": "waiting for the agent's output",
    "permission": "waiting for a permission answer (session.permission)",
}
"""What each ``waiting`` reason says (docs/api.md "Update stream")."""


def waiting(reason: str, seconds: int, *, gateway: bool = False) -> dict[str, Any]:
    """``status`` / ``waiting``: nothing was published for ``seconds`` (whole seconds) while the
    turn waits for ``reason``: ``capacity``, ``starting``, ``output`` or ``permission``; a
    gateway-routed turn waits for the gateway, not an agent."""
    text = WAIT_TEXT[reason]
    if gateway:
        text = text.replace("the agent to start", "the gateway connection").replace("the agent's", "the gateway's")
    message = f"{text} ({seconds} s)"
    params = status("waiting", message)
    params["reason"] = reason
    params["waitedSeconds"] = seconds
    return params


def status(event: str, message: str = "", data: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``status`` update; ``event`` is the raw kind (never ``completed``: that is ``done``'s)."""
    params: dict[str, Any] = {
        "type": "status",
        "event": event,
        "message": message,
        "pending": True,
        "error": False,
        "structuredEvent": {"type": "status", "status": event, "text": message},
    }
    if data:
        params["data"] = data
    return params


def from_event(event: TurnEvent) -> dict[str, Any]:
    """Map one adapter event (not TextDelta, which the turn splits by size) to update params."""
    match event:
        case TextDelta(text=text):
            return delta(text)
        case ThoughtDelta(text=text):
            return {
                "type": "thought",
                "event": "thought",
                "delta": text,
                "pending": True,
                "error": False,
                "structuredEvent": {"type": "thinking", "text": text},
            }
        case ToolCallEvent(tool_call=call, is_update=is_update):
            kind = "tool_call_update" if is_update else "tool_call"
            return {
                "type": kind,
                "event": kind,
                "toolCall": call,
                "pending": True,
                "error": False,
                "structuredEvent": {"type": "tool_call", "toolCall": call, "status": call.get("status")},
            }
        case PlanEvent(entries=entries):
            return {
                "type": "plan",
                "event": "plan",
                "entries": entries,
                "pending": True,
                "error": False,
                "structuredEvent": {"type": "status", "status": "plan", "entries": entries},
            }
        case UsageEvent(usage=usage):
            return {
                "type": "usage",
                "event": "usage",
                "usage": usage,
                "pending": True,
                "error": False,
                "structuredEvent": {"type": "status", "status": "usage", "usage": usage},
            }
        case PermissionEvent(request_id=request_id, tool_call=call, options=options):
            return {
                "type": "permission",
                "event": "permission_requested",
                "requestId": request_id,
                "toolCall": call,
                "options": options,
                "pending": True,
                "error": False,
                "structuredEvent": {"type": "tool_call", "toolCall": call, "status": "permission_requested"},
            }
        case StatusEvent(event=raw, message=message, data=data):
            return status(raw if raw != "completed" else "status", message, data)
        case SessionStateEvent(kind=kind, data=data):
            return status(kind, "", data)
    raise TypeError(f"unknown turn event {event!r}")
