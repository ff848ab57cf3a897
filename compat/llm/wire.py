"""Sans-I/O: the request bodies and reply parsing of the two runtime kinds.

A call is held in the OpenAI chat shape (``messages`` with ``system`` / ``user`` / ``assistant``
roles; content a string or a list of ``{type: "text", text}`` and ``{type: "image_url",
image_url: {url}}`` parts, an image's ``url`` being a ``data:`` URL or a remote one) and turned
into the body of each kind:

* ``openai``: ``POST <baseUrl>/chat/completions`` (OpenAI API reference, "Create chat
  completion"), ``response_format`` ``json_schema`` / ``json_object`` for JSON;
* ``anthropic``: ``POST <baseUrl>/v1/messages`` (Anthropic API reference, "Messages"), system
  prompt apart, images as ``base64`` / ``url`` sources, JSON asked for in the system prompt.

Why not the ``openai`` / ``anthropic`` SDKs: both retry on their own (which would fight the
fallback chain and its ``Retry-After`` handling, ``compat.llm.service``) and cost tens of
milliseconds to import; the bodies used here are a few fields of stable, documented APIs, sent
with the httpx client the bridge already uses for every HTTP call.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import msgspec

from compat.llm.settings import ModelRuntime

ANTHROPIC_VERSION = "2023-06-01"
MAX_REPLY_BYTES = 4 * 1024 * 1024
"""Bytes of a runtime's reply read at most."""
MAX_ERROR_CHARS = 500
_MODEL_NAME = re.compile(r"^[\w.:/@+-]{1,200}$")
"""A model name a runtime reports, used only when it looks like one (it reaches log lines)."""


class JsonRequest(msgspec.Struct, frozen=True):
    """Ask for JSON: with ``schema`` (a JSON Schema, named ``name``), or any JSON object."""

    schema: dict[str, Any] | None = None
    name: str = "result"


class Call(msgspec.Struct, frozen=True):
    """One model call, as the runtime will get it.

    Attributes:
        messages: the OpenAI chat shape (see the module docstring).
        model: the model to call.
        max_tokens: the reply's bound, in tokens (already capped to the runtime's).
        temperature: 0–2, or None for the runtime's own.
        json: ask for JSON (None: plain text).
    """

    messages: list[dict[str, Any]]
    model: str
    max_tokens: int
    temperature: float | None = None
    json: JsonRequest | None = None


class Reply(msgspec.Struct, frozen=True):
    """What a runtime answered: the text, the model it says answered, token usage in the turn
    ``usage`` shape (``inputTokens``, ``outputTokens``, ``totalTokens``, ``cachedReadTokens``,
    ``cachedWriteTokens``; only those it reported), and the cost it reported in USD, if any
    (OpenRouter's ``usage.cost``)."""

    text: str
    model: str
    usage: dict[str, int]
    cost: float | None = None


class ReplyInvalid(ValueError):
    """The runtime answered 200 with a body that is not a usable reply (``message`` says how)."""


def endpoint(runtime: ModelRuntime) -> str:
    base = runtime.base_url.rstrip("/")
    if runtime.kind == "anthropic":
        if base.endswith("/messages"):
            return base
        return base + "/messages" if base.endswith("/v1") else base + "/v1/messages"
    return base if base.endswith("/chat/completions") else base + "/chat/completions"


def headers(runtime: ModelRuntime, api_key: str) -> dict[str, str]:
    out = {"content-type": "application/json", "accept": "application/json"}
    if runtime.kind == "anthropic":
        out["anthropic-version"] = ANTHROPIC_VERSION
        if api_key:
            out["x-api-key"] = api_key
    elif api_key:
        out["authorization"] = f"Bearer {api_key}"
    return out


def json_instruction(request: JsonRequest) -> str:
    """The system-prompt text that asks a runtime without a JSON mode for JSON."""
    text = "Reply with one JSON value only: no prose before or after it, no code fence."
    if request.schema is not None:
        schema = json.dumps(request.schema, ensure_ascii=False, separators=(",", ":"))
        text += f" The value must validate against this JSON Schema (named {request.name}): {schema}"
    return text


def body(runtime: ModelRuntime, call: Call) -> dict[str, Any]:
    """The request body of ``call`` for ``runtime``'s kind."""
    messages = call.messages
    if call.json is not None and not runtime.has_json_mode:
        messages = _with_system(messages, json_instruction(call.json))
    if runtime.kind == "anthropic":
        return _anthropic_body(call, messages)
    out: dict[str, Any] = {"model": call.model, "messages": messages, "max_tokens": call.max_tokens, "stream": False}
    if call.temperature is not None:
        out["temperature"] = call.temperature
    if call.json is not None and runtime.has_json_mode:
        if call.json.schema is not None:
            out["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": call.json.name, "schema": call.json.schema, "strict": False},
            }
        else:
            out["response_format"] = {"type": "json_object"}
    return out


def _with_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """``messages`` with ``text`` added to the system prompt (a new first message if none)."""
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _anthropic_body(call: Call, messages: list[dict[str, Any]]) -> dict[str, Any]:
    system = "\n\n".join(_text(m.get("content")) for m in messages if m.get("role") == "system")
    turns = [
        {"role": m["role"], "content": _anthropic_content(m.get("content"))}
        for m in messages
        if m.get("role") in ("user", "assistant")
    ]
    out: dict[str, Any] = {"model": call.model, "max_tokens": call.max_tokens, "messages": turns}
    if system:
        out["system"] = system
    if call.temperature is not None:
        out["temperature"] = min(call.temperature, 1.0)  # the Messages API takes 0–1
    return out


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _anthropic_content(content: Any) -> Any:
    if not isinstance(content, list):
        return content if isinstance(content, str) else ""
    blocks: list[dict[str, Any]] = []
    for part in content:
        if part.get("type") == "text":
            blocks.append({"type": "text", "text": part.get("text", "")})
        elif part.get("type") == "image_url":
            url = str((part.get("image_url") or {}).get("url") or "")
            if url.startswith("data:"):
                head, _, data = url.partition(",")
                media_type = head[5:].split(";")[0]
                blocks.append({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}})
            else:
                blocks.append({"type": "image", "source": {"type": "url", "url": url}})
    return blocks


def parse(runtime: ModelRuntime, payload: Any) -> Reply:
    """The reply in a 200 response's JSON body.

    Raises:
        ReplyInvalid: the body is not a reply of the runtime's kind, or has no text.
    """
    if not isinstance(payload, dict):
        raise ReplyInvalid("the reply is not a JSON object")
    if payload.get("error"):
        raise ReplyInvalid(error_message(payload) or "the runtime answered with an error")
    reported = payload.get("model")
    model = reported if isinstance(reported, str) and _MODEL_NAME.match(reported) else ""
    if runtime.kind == "anthropic":
        content = payload.get("content")
        if not isinstance(content, list):
            raise ReplyInvalid("the reply has no content")
        text = "".join(str(b.get("text") or "") for b in content if isinstance(b, dict) and b.get("type") == "text")
        usage = anthropic_usage(payload.get("usage"))
    else:
        choices = payload.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ReplyInvalid("the reply has no choices")
        message = choices[0].get("message")
        text = _text(message.get("content")) if isinstance(message, dict) else ""
        usage = openai_usage(payload.get("usage"))
    if not text.strip():
        raise ReplyInvalid("the reply has no text")
    raw_usage = payload.get("usage")
    cost = raw_usage.get("cost") if isinstance(raw_usage, dict) else None
    reported = float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0 else None
    return Reply(text=text, model=model or runtime.model, usage=usage, cost=reported)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


_OPENAI_USAGE = (
    ("prompt_tokens", "inputTokens"),
    ("completion_tokens", "outputTokens"),
    ("total_tokens", "totalTokens"),
)
_ANTHROPIC_USAGE = (
    ("input_tokens", "inputTokens"),
    ("output_tokens", "outputTokens"),
    ("cache_read_input_tokens", "cachedReadTokens"),
    ("cache_creation_input_tokens", "cachedWriteTokens"),
)


def _renamed(raw: Any, names: tuple[tuple[str, str], ...]) -> dict[str, int]:
    """The token counts of a runtime's ``usage`` object under the turn usage shape's names."""
    raw = raw if isinstance(raw, dict) else {}
    return {ours: value for theirs, ours in names if (value := _int(raw.get(theirs))) is not None}


def openai_usage(raw: Any) -> dict[str, int]:
    """An OpenAI ``usage`` object in the turn usage shape."""
    out = _renamed(raw, _OPENAI_USAGE)
    details = raw.get("prompt_tokens_details") if isinstance(raw, dict) else None
    if isinstance(details, dict) and (cached := _int(details.get("cached_tokens"))) is not None:
        out["cachedReadTokens"] = cached
    return out


def anthropic_usage(raw: Any) -> dict[str, int]:
    """An Anthropic ``usage`` object in the turn usage shape (``totalTokens``: every input and
    output token, cached ones included)."""
    out = _renamed(raw, _ANTHROPIC_USAGE)
    if out:
        out["totalTokens"] = sum(out.values())
    return out


def error_message(detail: str | dict[str, Any]) -> str:
    """The runtime's own words in an error body (``{"error": {"message"}}``, ``{"error": "…"}``,
    or text), at most ``MAX_ERROR_CHARS``."""
    payload: Any = detail
    if isinstance(detail, str):
        try:
            payload = json.loads(detail)
        except ValueError:
            return detail.strip()[:MAX_ERROR_CHARS]
    error = payload.get("error") if isinstance(payload, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    return str(message)[:MAX_ERROR_CHARS] if message else ""


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (RFC 9110 §10.2.3: delay seconds or an HTTP
    date), or None when it is absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    import email.utils  # here: only an HTTP-date Retry-After needs it

    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
