"""What an exec profile is given and how its stdout is read: the P0 exec protocol (``AGENT_*``
environment in, ``AGENT_PARTIAL:`` / ``AGENT_SESSION:`` / ``AGENT_ERROR:`` lines out) and, for the
built-in ``claude-code`` profile, Claude Code's ``--output-format stream-json`` lines.

Sources: the iLink Hub Bridge profile spec and the ``agentproc`` 0.4.2 SDK
(exec-profiles-and-hermes.md §1.2, §2); Claude Code print mode (openclaw-and-claude.md §2).
Parsers are plain objects with no I/O: bytes in, events out. Text is made safe for the wire here
(invalid UTF-8 and lone surrogates become U+FFFD, with the codec's one function; a surrogate pair
split over two partials is joined first), because strict clients refuse lone surrogates.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import msgspec

from bridge.rpc.codec import cut_utf8, loads, scrub
from bridge.rpc.errors import ParseError
from compat.base import ThoughtDelta, ToolCallEvent, TurnEvent, TurnRequest, UsageEvent

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = "0.1"
ENV_MESSAGE_MAX_BYTES = 128 * 1024 - len("AGENT_MESSAGE=") - 1  # Linux MAX_ARG_STRLEN per "NAME=value\0"
_PARTIAL, _SESSION, _ERROR = b"AGENT_PARTIAL:", b"AGENT_SESSION:", b"AGENT_ERROR:"
_PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)\}\}")
_USAGE_NAMES = {
    "input_tokens": "inputTokens",
    "output_tokens": "outputTokens",
    "cache_read_input_tokens": "cachedReadTokens",
    "cache_creation_input_tokens": "cachedWriteTokens",
}


# ---- what a parser reports besides ordinary turn events -----------------------------------------


class Partial(msgspec.Struct, frozen=True):
    """A streamed chunk of the reply (``AGENT_PARTIAL:``, a Claude ``text_delta``)."""

    text: str


class Body(msgspec.Struct, frozen=True):
    """One reply line (no newline), or Claude's final ``result`` text (``final=True``)."""

    text: str
    final: bool = False


class SessionReport(msgspec.Struct, frozen=True):
    """The upstream session id to hand back next turn (last one wins)."""

    session_id: str


class ProfileFailed(msgspec.Struct, frozen=True):
    """``AGENT_ERROR:`` or a Claude ``result`` with ``is_error``: the turn fails ``PROFILE_ERROR``."""

    message: str


ParsedEvent = Partial | Body | SessionReport | ProfileFailed | TurnEvent


# ---- text hygiene -------------------------------------------------------------------------------


class PartialJoiner:
    """Holds a trailing high surrogate of one partial until the next (JS profiles that slice a
    string by UTF-16 index and ``JSON.stringify`` each piece split emoji this way)."""

    def __init__(self) -> None:
        self._held = ""

    def push(self, text: str) -> str:
        text, self._held = self._held + text, ""
        if text and "\ud800" <= text[-1] <= "\udbff":
            text, self._held = text[:-1], text[-1]
        return scrub(text)

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "\ufffd" if held else ""


def decode_json_text(payload: bytes) -> str:
    """A marker's payload: a JSON string, else (not JSON, not a string) the raw text as agentproc's
    runner does, so a sloppy profile still shows its output."""
    raw = payload.decode("utf-8", "replace")
    try:
        value = json.loads(raw)  # json, not orjson: the text may carry lone surrogate escapes
    except ValueError:
        return raw
    return value if isinstance(value, str) else raw


# ---- the environment of one turn ----------------------------------------------------------------


def message_for_env(message: str) -> tuple[str, bool]:
    """``AGENT_MESSAGE``'s value and whether it is truncated (then the whole message goes to stdin).

    A NUL cannot be in the environment and one variable holds at most 128 KiB with its name: the
    value is cut before the first NUL and at a UTF-8 boundary within the bound.
    """
    value = message.split("\0", 1)[0]
    value = cut_utf8(value, ENV_MESSAGE_MAX_BYTES)
    return value, value != message


def protocol_env(
    request: TurnRequest, upstream_session_id: str | None, *, streaming: bool
) -> tuple[dict[str, str], bool]:
    """The ``AGENT_*`` variables for ``request``; also whether the message was truncated."""
    message, truncated = message_for_env(scrub(request.text_prompt()))
    env = {
        "AGENT_MESSAGE": message,
        "AGENT_SESSION_ID": upstream_session_id or "",
        "AGENT_SESSION_NAME": _no_nul(request.thread_id) or "default",
        "AGENT_FROM_USER": _no_nul(request.principal) or "local",
        "AGENT_CONTEXT_TOKEN": _no_nul(request.session_id),
        "AGENT_STREAMING": "1" if streaming else "0",
        "AGENT_PROTOCOL_VERSION": PROTOCOL_VERSION,
    }
    if truncated:
        env["AGENT_MESSAGE_TRUNCATED"] = "1"
    return env, truncated


CLIENT_PLACEHOLDERS = frozenset({"MESSAGE", "SESSION_ID", "SESSION_NAME"})
"""Placeholders whose values come from the request (``PROFILE_DIR`` is the operator's)."""
SESSION_ID_BYTES = 256
_UNSAFE_ID = re.compile(r"[\x00-\x1f\x7f/\\]|\.\.")


def placeholders(template: str) -> list[str]:
    """The placeholder names ``template`` uses."""
    return _PLACEHOLDER.findall(template)


def safe_session_id(value: str) -> bool:
    """Whether an ``AGENT_SESSION`` id a profile reported may be stored and handed back (it goes
    into ``{{SESSION_ID}}``, maybe a path or an argument): no path separator, no ``..``, no
    control character, at most :data:`SESSION_ID_BYTES` bytes."""
    return (
        bool(value) and len(value.encode("utf-8", "surrogatepass")) <= SESSION_ID_BYTES and not _UNSAFE_ID.search(value)
    )


def fill_placeholders(template: str, values: dict[str, str]) -> str:
    """Replace ``{{MESSAGE}}``, ``{{SESSION_ID}}``, ``{{SESSION_NAME}}``, ``{{PROFILE_DIR}}`` in one
    pass (a message that contains ``{{SESSION_ID}}`` stays as it is); NULs are dropped."""
    return _PLACEHOLDER.sub(lambda m: _no_nul(values[m.group(1)]) if m.group(1) in values else m.group(0), template)


def _no_nul(value: str) -> str:
    return value.replace("\0", "")


# ---- the P0 exec protocol -----------------------------------------------------------------------


class ExecLineParser:
    """Reads the P0 markers from stdout lines (bytes without their ``\\n``).

    ``AGENT_SESSION:`` is accepted on any line (the agentproc SDK prints it after the partials);
    ``first_line_prefix`` (``cli_session_first_line_prefix``) also takes a session id from the
    first body line, as iLink does.
    """

    def __init__(self, first_line_prefix: str | None = None) -> None:
        self._prefix = first_line_prefix
        self._seen_body = False
        self._joiner = PartialJoiner()

    def feed(self, line: bytes) -> list[ParsedEvent]:
        if line.startswith(_PARTIAL):
            text = self._joiner.push(decode_json_text(line[len(_PARTIAL) :]))
            return [Partial(text)] if text else []
        if line.startswith(_SESSION):
            return _session(line[len(_SESSION) :].decode("utf-8", "replace"))
        if line.startswith(_ERROR):
            return [ProfileFailed(scrub(decode_json_text(line[len(_ERROR) :])))]
        text = line.decode("utf-8", "replace")
        first, self._seen_body = not self._seen_body, True
        if first and self._prefix and text.startswith(self._prefix):
            return _session(text[len(self._prefix) :])
        return [Body(text)]

    def finish(self) -> list[ParsedEvent]:
        tail = self._joiner.flush()
        return [Partial(tail)] if tail else []


def _session(value: str) -> list[ParsedEvent]:
    value = value.strip()
    if not safe_session_id(value):
        logger.warning(
            "ignoring an unsafe AGENT_SESSION id from a profile (%d chars; empty, a path separator, '..', "
            "a control character or too long): not reused",
            len(value),
        )
        return []
    return [SessionReport(value)]


# ---- Claude Code print mode (stream-json) -------------------------------------------------------


class ClaudeStreamParser:
    """Maps ``claude -p --output-format stream-json --verbose --include-partial-messages`` lines.

    ``system/init`` and ``result`` carry the session id; top-level ``text_delta``s are partials
    (a subagent's, with a ``parent_tool_use_id``, are not the reply); ``thinking_delta``s are
    thoughts; ``tool_use`` blocks and their ``tool_result``s are tool calls; ``result`` carries
    the final text (used when nothing was streamed), usage and cost, or the error.
    """

    def __init__(self) -> None:
        self.model: str | None = None
        self.usage: dict[str, Any] | None = None
        self._tools: dict[str, dict[str, Any]] = {}

    def feed(self, line: bytes) -> list[ParsedEvent]:
        try:
            message = loads(line, untrusted=True)  # bytes that are not UTF-8 become U+FFFD
        except ParseError:
            logger.debug("claude-code: ignoring a non-JSON stdout line (%d bytes)", len(line))
            return []
        if not isinstance(message, dict):
            return []
        kind = message.get("type")
        if kind == "system" and message.get("subtype") == "init":
            self.model = message.get("model") if isinstance(message.get("model"), str) else None
            return _session(str(message.get("session_id") or ""))
        if kind == "stream_event" and message.get("parent_tool_use_id") is None:
            return _stream_event(message.get("event"))
        if kind == "assistant" and message.get("parent_tool_use_id") is None:
            return self._tool_uses(message.get("message"))
        if kind == "user":
            return self._tool_results(message.get("message"))
        if kind == "result":
            return self._result(message)
        return []

    def finish(self) -> list[ParsedEvent]:
        return []

    def _tool_uses(self, message: Any) -> list[ParsedEvent]:
        events: list[ParsedEvent] = []
        for block in _blocks(message):
            if block.get("type") == "tool_use" and isinstance(block.get("id"), str):
                call = {
                    "toolCallId": block["id"],
                    "title": str(block.get("name") or "tool"),
                    "kind": "other",
                    "status": "in_progress",
                    "locations": [],
                    "content": [],
                }
                self._tools[block["id"]] = call
                events.append(ToolCallEvent(dict(call)))
        return events

    def _tool_results(self, message: Any) -> list[ParsedEvent]:
        events: list[ParsedEvent] = []
        for block in _blocks(message):
            call = self._tools.pop(str(block.get("tool_use_id")), None) if block.get("type") == "tool_result" else None
            if call is not None:
                call["status"] = "failed" if block.get("is_error") else "completed"
                events.append(ToolCallEvent(call, is_update=True))
        return events

    def _result(self, message: dict[str, Any]) -> list[ParsedEvent]:
        events: list[ParsedEvent] = _session(str(message.get("session_id") or ""))
        self.usage = _usage(message)
        if self.usage:
            events.append(UsageEvent(dict(self.usage)))
        text = message.get("result") if isinstance(message.get("result"), str) else ""
        if message.get("is_error") or message.get("subtype") not in (None, "success"):
            events.append(ProfileFailed(scrub(text or str(message.get("subtype") or "claude-code failed"))))
        elif text:
            events.append(Body(scrub(text), final=True))
        return events


def _stream_event(event: Any) -> list[ParsedEvent]:
    if not isinstance(event, dict) or event.get("type") != "content_block_delta":
        return []
    delta = event.get("delta")
    if not isinstance(delta, dict):
        return []
    if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str) and delta["text"]:
        return [Partial(scrub(delta["text"]))]
    if delta.get("type") == "thinking_delta" and isinstance(delta.get("thinking"), str):
        return [ThoughtDelta(scrub(delta["thinking"]))]
    return []


def _blocks(message: Any) -> list[dict[str, Any]]:
    content = message.get("content") if isinstance(message, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _usage(result: dict[str, Any]) -> dict[str, Any] | None:
    raw = result.get("usage")
    usage: dict[str, Any] = {}
    if isinstance(raw, dict):
        usage = {ours: raw[theirs] for theirs, ours in _USAGE_NAMES.items() if isinstance(raw.get(theirs), int)}
        if "inputTokens" in usage and "outputTokens" in usage:
            usage["totalTokens"] = usage["inputTokens"] + usage["outputTokens"]
    cost = result.get("total_cost_usd")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool):
        usage["cost"] = {"amount": cost, "currency": "USD"}
    return usage or None


__all__ = [
    "Body",
    "ClaudeStreamParser",
    "ExecLineParser",
    "ParsedEvent",
    "Partial",
    "ProfileFailed",
    "SessionReport",
    "fill_placeholders",
    "message_for_env",
    "protocol_env",
]
