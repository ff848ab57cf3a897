"""Pure mapping between ACP payloads and the adapter's turn events. No I/O.

Sources: ACP v1 schema (``session/update`` kinds, ``ToolCall``/``ToolCallUpdate``, ``Usage``,
``UsageUpdate``, ``PermissionOption``); acp-and-real-agents.md §1 and §4 (gemini's
``_meta.quota.token_count``, opencode's prompt ``usage``).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from bridge.rpc.codec import cut_utf8
from bridge.rpc.redact import redact
from compat.base import (
    PlanEvent,
    SessionStateEvent,
    StatusEvent,
    TextDelta,
    ThoughtDelta,
    ToolCallEvent,
    TurnEvent,
    TurnRequest,
    UsageEvent,
)
from compat.settings import PermissionPolicy

SESSION_STATE_KINDS = (
    "available_commands_update",
    "current_mode_update",
    "config_option_update",
    "session_info_update",
)
"""ACP update kinds that describe the session rather than a turn: ``SessionStateEvent(kind)``,
kept as the session's state whenever they arrive (between turns too, and during ``session/load``'s
replay). Any kind we do not know is passed on as ``StatusEvent(event=<kind>)``."""

IGNORED_UPDATE_KINDS = ("user_message_chunk",)
"""Echoes of our own prompt (and ``session/load`` replays): never forwarded."""

TOOL_CALL_FIELDS = ("toolCallId", "title", "kind", "status", "locations", "content")
_PROMPT_USAGE_KEYS = (
    "inputTokens",
    "outputTokens",
    "totalTokens",
    "thoughtTokens",
    "cachedReadTokens",
    "cachedWriteTokens",
)
_PERMISSION_PREFERENCE: dict[str, tuple[str, ...]] = {
    "allow": ("allow_once", "allow_always"),
    "deny": ("reject_once", "reject_always"),
}


class UpdateMapper:
    """Turns one turn's ``session/update`` payloads into turn events; keeps tool-call state.

    ACP sends only the changed fields of a tool call, so the mapper keeps the merged state per
    ``toolCallId`` and every :class:`ToolCallEvent` carries the whole current state.
    """

    def __init__(self, tool_content_bytes: int) -> None:
        """
        Args:
            tool_content_bytes: Cap on a tool call's serialized ``content``, in bytes
                (``Limits.tool_content_bytes``); longer content is cut and marked ``truncated``.
        """
        self.usage: dict[str, Any] = {}
        self._tools: dict[str, dict[str, Any]] = {}
        self._cap = tool_content_bytes

    def map(self, update: dict[str, Any]) -> list[TurnEvent]:
        """Map one ``update`` object (the ``params.update`` of ``session/update``)."""
        kind = update.get("sessionUpdate")
        if kind == "agent_message_chunk":
            return _text_event(update, TextDelta)
        if kind == "agent_thought_chunk":
            return _text_event(update, ThoughtDelta)
        if kind in ("tool_call", "tool_call_update"):
            return self._tool_call(update)
        if kind == "plan":
            entries = update.get("entries")
            return [PlanEvent(entries if isinstance(entries, list) else [])]
        if kind == "usage_update":
            return self.add_usage(usage_from_update(update))
        if kind in IGNORED_UPDATE_KINDS:
            return []
        data = {k: v for k, v in update.items() if k != "sessionUpdate"}
        if kind in SESSION_STATE_KINDS:
            return [SessionStateEvent(kind, data or None)]
        return [StatusEvent(event=str(kind or "unknown"), data=data or None)]

    def add_usage(self, usage: dict[str, Any]) -> list[TurnEvent]:
        """Merge ``usage`` into the turn's usage and return the event to emit, if any."""
        if not usage:
            return []
        self.usage.update(usage)
        return [UsageEvent(usage)]

    def _tool_call(self, update: dict[str, Any]) -> list[TurnEvent]:
        call_id = update.get("toolCallId")
        if not isinstance(call_id, str):
            return []
        known = call_id in self._tools
        state = self._tools.setdefault(call_id, {"toolCallId": call_id})
        for name in TOOL_CALL_FIELDS[1:]:
            if name in update:
                state[name] = update[name]
        if "content" in update:
            state.pop("truncated", None)
            state["content"], truncated = cap_content(update["content"], self._cap)
            if truncated:
                state["truncated"] = True
        return [ToolCallEvent(dict(state), is_update=known)]


def cap_content(content: Any, limit: int) -> tuple[Any, bool]:
    """Keep whole tool-call content items while they fit in ``limit`` serialized bytes.

    The first item that does not fit is kept with its text cut to the remaining room when it is
    a text block; later items are dropped.

    Returns:
        ``(content, truncated)``.
    """
    if not isinstance(content, list) or len(orjson.dumps(content)) <= limit:
        return content, False
    kept: list[Any] = []
    room = limit
    for item in content:
        size = len(orjson.dumps(item))
        if size <= room:
            kept.append(item)
            room -= size
            continue
        block = item.get("content") if isinstance(item, dict) else None
        if isinstance(block, dict) and isinstance(block.get("text"), str) and room > 0:
            cut = cut_utf8(block["text"], room)
            kept.append({**item, "content": {**block, "text": cut}})
        break
    return kept, True


def usage_from_update(update: dict[str, Any]) -> dict[str, Any]:
    """ACP ``usage_update {used, size, cost}`` → ``{contextUsed, contextSize, cost}``."""
    usage: dict[str, Any] = {}
    if _is_number(update.get("used")):
        usage["contextUsed"] = update["used"]
    if _is_number(update.get("size")):
        usage["contextSize"] = update["size"]
    cost = update.get("cost")
    if isinstance(cost, dict) and _is_number(cost.get("amount")):
        usage["cost"] = {"amount": cost["amount"], "currency": cost.get("currency")}
    return usage


def usage_from_result(result: dict[str, Any]) -> dict[str, Any]:
    """The ``session/prompt`` result's ``usage`` and gemini's ``_meta.quota.token_count``."""
    usage: dict[str, Any] = {}
    meta = result.get("_meta")
    quota = meta.get("quota") if isinstance(meta, dict) else None
    counts = quota.get("token_count") if isinstance(quota, dict) else None
    if isinstance(counts, dict):
        for src, dst in (("input_tokens", "inputTokens"), ("output_tokens", "outputTokens")):
            if _is_number(counts.get(src)):
                usage[dst] = counts[src]
    reported = result.get("usage")
    if isinstance(reported, dict):
        usage.update({k: reported[k] for k in _PROMPT_USAGE_KEYS if _is_number(reported.get(k))})
    return usage


def choose_option(policy: PermissionPolicy, options: list[dict[str, Any]]) -> str | None:
    """The ``optionId`` a non-interactive policy picks, or None to answer ``cancelled``.

    ``allow`` prefers ``allow_once`` then ``allow_always``; ``deny`` prefers ``reject_once``
    then ``reject_always``; ``ask`` never picks.
    """
    for kind in _PERMISSION_PREFERENCE.get(policy, ()):
        for option in options:
            if option.get("kind") == kind and isinstance(option.get("optionId"), str):
                return option["optionId"]
    return None


def permission_outcome(option_id: str | None) -> dict[str, Any]:
    """The ``session/request_permission`` result for a choice (None → ``cancelled``)."""
    if option_id is None:
        return {"outcome": {"outcome": "cancelled"}}
    return {"outcome": {"outcome": "selected", "optionId": option_id}}


def prompt_blocks(request: TurnRequest) -> list[dict[str, Any]]:
    """The prompt as one ``text`` block (or the editor's own content blocks, as it sent them)
    plus one ``resource_link`` block per attachment."""
    blocks: list[dict[str, Any]] = list(request.content) or [{"type": "text", "text": request.prompt}]
    for attachment in request.attachments:
        link = {"type": "resource_link", "uri": Path(attachment.path).as_uri()}
        link["name"] = attachment.name
        if attachment.description:
            link["description"] = attachment.description
        blocks.append(link)
    return blocks


def redact_data(value: Any) -> Any:
    """Redact every string inside a JSON-like value (upstream error ``data``)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_data(v) for v in value]
    return value


def _text_event(update: dict[str, Any], cls: type[TextDelta] | type[ThoughtDelta]) -> list[TurnEvent]:
    content = update.get("content")
    if isinstance(content, dict) and content.get("type") == "text":
        text = content.get("text")
        if isinstance(text, str) and text:
            return [cls(text)]
    return []


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
