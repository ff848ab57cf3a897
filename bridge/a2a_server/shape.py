"""What a knowledge request says, whichever shape it came in: the LLMWiki agent bridge's
``/message:send`` body or an A2A v1 message. Plain Python: no I/O, no a2a-sdk.

The LLMWiki shape (shared/reference/knowledge-sources.md §2.2): ``{"data": {…}}`` or the same
fields at the root; the query is ``data.query``, else the text parts of ``data.message`` (or the
root ``message``) whose ``role`` is ``user``/``agent``; ``orchestrationMode`` or ``mode`` (also at
the root), ``knowledgeSources`` or ``knowledge_sources``, ``retrieval``, ``messages``, and
``threadId`` / ``sessionId`` / ``turnId``. An A2A v1 message carries the same fields in a data part.

The A2A v1 HTTP+JSON ``SendMessageRequest`` (A2A v1 §11 "HTTP+JSON binding") uses the same path;
it is told apart by shape: a root ``message`` whose ``role`` is a proto enum name (``ROLE_USER``),
and none of ``data``, ``query`` or ``text`` beside it. The LLMWiki bridge ignores such a message
(its roles are ``user``/``agent``), so no request its clients send is taken for A2A.

Must not import: ``orchestrator``, ``compat`` or a2a-sdk.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

MAX_HISTORY = 64  # messages kept from data.messages; the runtime sends at most the last 12
MAX_CONTENT_CHARS = 20_000  # per history message
_SAFE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_PARAMS = (("orchestrationMode", "orchestrationMode"), ("mode", "orchestrationMode"), ("retrieval", "retrieval"))
_SOURCES = ("knowledgeSources", "knowledge_sources")


class RequestError(Exception):
    """A request that cannot run, as the LLMWiki bridge reports it: ``{"error": {code, message}}``.

    Attributes:
        status: the HTTP status (400, 413).
        code: ``bad_request``, ``invalid_json``, ``body_too_large``, ``invalid_retrieval_intent``,
            ``retrieval_mode_unsupported``.
    """

    def __init__(self, message: str, code: str = "bad_request", status: int = 400) -> None:
        super().__init__(message)
        self.message, self.code, self.status = message, code, status


@dataclass(frozen=True, slots=True)
class KnowledgeRequest:
    """One knowledge turn to run.

    Attributes:
        query: the question.
        extra: the knowledge turn params (``orchestrationMode``, ``retrieval``,
            ``knowledgeSources``), validated later by the knowledge service.
        history: earlier ``(role, content)`` messages, oldest first.
        thread_id, session_id, turn_id: the caller's identifiers, when safe ones were given.
    """

    query: str
    extra: dict[str, Any]
    history: tuple[tuple[str, str], ...] = ()
    thread_id: str | None = None
    session_id: str | None = None
    turn_id: str | None = None


def safe_id(value: Any) -> str | None:
    """``value`` when it is an identifier safe to echo (``[A-Za-z0-9._:-]{1,128}``), else None."""
    return value if isinstance(value, str) and _SAFE_ID.fullmatch(value) else None


def request_id(header: str | None) -> str:
    """The ``x-request-id`` / ``x-trace-id`` to use: the header when safe, else a new UUID."""
    return safe_id(header) or str(uuid.uuid4())


def is_a2a_v1(body: Any) -> bool:
    """Whether a ``POST /message:send`` body is an A2A v1 HTTP+JSON ``SendMessageRequest``."""
    if not isinstance(body, dict) or any(k in body for k in ("data", "query", "text")):
        return False
    message = body.get("message")
    role = message.get("role") if isinstance(message, dict) else None
    return isinstance(role, str) and role.startswith("ROLE_")


def from_llmwiki(body: Any) -> KnowledgeRequest:
    """The request in a ``/message:send`` body of the LLMWiki shape.

    Raises:
        RequestError: ``bad_request`` when the body is not an object or names no query.
    """
    if not isinstance(body, dict):
        raise RequestError("A2A request body must be a JSON object.")
    data: dict[str, Any] = body["data"] if isinstance(body.get("data"), dict) else body
    message = _message(data.get("message", body.get("message")))
    query = str(data.get("query") or "").strip() if isinstance(data.get("query"), str) else ""
    query = query or (message or {}).get("text", "")
    history = _history(data.get("messages"))
    if message and message["text"]:
        history.append(("assistant" if message["role"] == "agent" else "user", message["text"]))
    return _request(query, data, body, tuple(history), message or {})


def from_a2a(text: str, data: dict[str, Any] | None, context_id: str, task_id: str) -> KnowledgeRequest:
    """The request in an A2A message: its text parts and its first data part (the LLMWiki
    ``data`` fields), in the A2A task ``task_id`` of context ``context_id``.

    Raises:
        RequestError: ``bad_request`` when neither names a query.
    """
    data = data or {}
    query = data.get("query") if isinstance(data.get("query"), str) else ""
    request = _request(str(query).strip() or text.strip(), data, {}, tuple(_history(data.get("messages"))), {})
    thread = request.thread_id or safe_id(context_id)
    return KnowledgeRequest(request.query, request.extra, request.history, thread, request.session_id, task_id)


def _request(
    query: str, data: dict[str, Any], root: dict[str, Any], history: tuple[tuple[str, str], ...], message: dict
) -> KnowledgeRequest:
    if not query:
        raise RequestError("A2A request data.query or message text is required.")
    extra: dict[str, Any] = {}
    for scope in (root, data):  # data wins over the envelope
        for key, param in _PARAMS:
            if key in scope:
                extra[param] = scope[key]
    for key in _SOURCES:
        if key in data:
            extra["knowledgeSources"] = data[key]
            break
    return KnowledgeRequest(
        query,
        extra,
        history,
        thread_id=safe_id(data.get("threadId")) or safe_id(message.get("contextId")),
        session_id=safe_id(data.get("sessionId")),
        turn_id=safe_id(data.get("turnId")) or safe_id(message.get("messageId")),
    )


def _message(value: Any) -> dict[str, str] | None:
    """An A2A 0.3-style message ``{role: user|agent, parts: [{kind: text, text}]}``, its text
    joined; None for any other value (the LLMWiki bridge's ``normalizeA2aMessage``)."""
    if not isinstance(value, dict):
        return None
    role = str(value.get("role") or "").strip().lower()
    if role not in ("user", "agent"):
        return None
    parts: list[Any] = value["parts"] if isinstance(value.get("parts"), list) else []
    text = "\n".join(
        p["text"] for p in parts if isinstance(p, dict) and p.get("kind") == "text" and isinstance(p.get("text"), str)
    )
    out = {"role": role, "text": text.strip()[:MAX_CONTENT_CHARS]}
    for key in ("messageId", "contextId"):
        if isinstance(value.get(key), str):
            out[key] = value[key]
    return out


def _history(value: Any) -> list[tuple[str, str]]:
    """``data.messages`` as ``(role, content)``: user and assistant messages with text (system
    messages are never forwarded), the last ``MAX_HISTORY``."""
    items = value if isinstance(value, list) else []
    out = [
        (role, m["content"].strip()[:MAX_CONTENT_CHARS])
        for m in items
        if isinstance(m, dict)
        and (role := str(m.get("role") or "").strip().lower()) in ("user", "assistant")
        and isinstance(m.get("content"), str)
        and m["content"].strip()
    ]
    return out[-MAX_HISTORY:]
