"""The delegated runtime: llmwiki-agent-bridge's evidence prompt (§2.7) and a streaming
OpenAI-compatible ``/chat/completions`` client.

The request is one system prompt, the conversation history (user/assistant only, the last 12
messages, each cut at 6,000 characters, alternating, starting with user), then one user message
``# User question\\n<question>\\n\\n# LLMWiki evidence bundle\\n<compact JSON>``. The bundle's key
order is fixed; graph nodes and source bundles are deliberately not in it. A golden test pins the
whole request.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from bridge.rpc.codec import encode_body
from bridge.rpc.redact import register_secret
from compat import tracing
from compat.knowledge.evidence import Evidence
from compat.knowledge.settings import RuntimeSettings
from compat.knowledge.shapes import as_dict
from compat.llm.wire import error_message, openai_usage
from compat.telemetry import METRICS

if TYPE_CHECKING:
    import httpx

SYSTEM_PROMPT = " ".join(
    (
        "You are answering through a local LLMWiki Agent Bridge.",
        "Answer in grounded markdown using only the provided LLMWiki evidence.",
        "Every factual claim that relies on evidence must include markdown citation anchors near the claim, "
        "formatted exactly as [n](#citation-n).",
        "Use n as the 1-based index of the matching item in the evidence bundle citations array; do not use "
        "citationDigest order or sourceRefs for numbering.",
        "When one claim needs several sources, include several anchors after that claim.",
        "If evidence is incomplete or a source failed, state the limitation plainly.",
        "Do not expose API keys, request headers, or bridge internals.",
    )
)
HISTORY_LIMIT = 12
HISTORY_CHARS = 6000
DIGEST_LIMIT = 8
MAX_ANSWER_CHARS = 256 * 1024
_WORD = re.compile(r"\w+")


class RuntimeFailure(Exception):
    """The runtime call failed; ``reason``: timeout, connect, http_status, invalid_json, too_large,
    upstream_error, truncated, empty_answer, not_configured. ``message`` is the runtime's own
    words when it gave any (a quota text), redacted before it reaches a client."""

    def __init__(self, reason: str, http_status: int | None = None, message: str = "") -> None:
        self.reason, self.http_status, self.message = reason, http_status, message
        super().__init__(reason)


class PromptContext(msgspec.Struct, frozen=True):
    question: str
    session_id: str
    thread_id: str
    turn_id: str


def compact(value: Any) -> str:
    """JSON like JavaScript's ``JSON.stringify``: no spaces, non-ASCII kept (a lone surrogate
    becomes U+FFFD: ``bridge.rpc.codec.encode_body``)."""
    return encode_body(value).decode()


def conversation(history: Sequence[tuple[str, str]], question: str) -> list[dict[str, str]]:
    """The history to send: user/assistant turns only, alternating, starting with user and ending
    with assistant, the last ``HISTORY_LIMIT`` messages, each cut at ``HISTORY_CHARS``."""
    kept: list[dict[str, str]] = []
    for role, content in history:
        if role not in ("user", "assistant") or not content:
            continue
        message = {"role": role, "content": content[:HISTORY_CHARS]}
        if kept and kept[-1]["role"] == role:
            kept[-1] = message  # forced alternation: the later of two same-role messages wins
        else:
            kept.append(message)
    if kept and kept[-1]["role"] == "user" and kept[-1]["content"].strip() == question.strip():
        kept.pop()
    while kept and kept[-1]["role"] == "user":
        kept.pop()
    kept = kept[-HISTORY_LIMIT:]
    while kept and kept[0]["role"] != "user":
        kept.pop(0)
    return kept


def _relevance(citation: dict[str, Any], terms: list[str], phrase: str) -> int:
    title, path, snippet = (str(citation.get(k) or "").lower() for k in ("title", "path", "snippet"))
    score = sum(8 * (t in title) + 5 * (t in path) + (t in snippet) for t in terms)
    if phrase:
        score += 18 * (phrase in title) + 12 * (phrase in path) + 4 * (phrase in snippet)
    return score + (40 if title and title in phrase else 0)


def citation_digest(citations: list[dict[str, Any]], question: str) -> list[dict[str, Any]]:
    """At most 8 citations re-ranked by relevance to the question (stable for ties)."""
    terms = [w for w in dict.fromkeys(w.lower() for w in _WORD.findall(question)) if len(w) > 2]
    phrase = " ".join(_WORD.findall(question.lower()))
    ranked = sorted(citations, key=lambda c: -_relevance(c, terms, phrase))[:DIGEST_LIMIT]
    return [
        {
            "id": c["id"],
            "title": c["title"],
            "path": c.get("path"),
            "snippet": c["snippet"][:320],
            "sourceRefs": c.get("sourceRefs", []),
        }
        for c in ranked
    ]


def evidence_bundle(evidence: Evidence, ctx: PromptContext, history_length: int) -> dict[str, Any]:
    """The ``llmwiki-agent-bridge.answer-evidence.v1`` bundle, keys in the pinned order."""
    pages = sum(int(s.get("pageCount") or 0) for s in evidence.sources)
    approved = sum(int(s.get("approvedPageCount") or 0) for s in evidence.sources)
    return {
        "schema": "llmwiki-agent-bridge.answer-evidence.v1",
        "runtimeContract": {
            "citations": "Use the top-level citations array as the only citation anchor source.",
            "graph": "Graph and source bundle details are returned in the bridge artifact and source tools, "
            "not in this answer prompt.",
        },
        "conversationContext": {
            "schema": "llmwiki-agent-bridge.conversation-context.v1",
            "threadId": ctx.thread_id,
            "sessionId": ctx.session_id,
            "turnId": ctx.turn_id,
            "messageCount": history_length + 1,
            "historyLength": history_length,
            "historyLimit": HISTORY_LIMIT,
        },
        "citationDigest": citation_digest(evidence.citations, ctx.question),
        "citations": evidence.citations,
        "sources": evidence.sources,
        "sourceFailures": evidence.failures,
        "mergedGraphSummary": {
            "nodeCount": len(evidence.nodes),
            "edgeCount": len(evidence.edges),
            "corpusPageCount": pages,
            "corpusApprovedPageCount": approved,
        },
        "mergedCorpusSummary": {
            "sourceCount": len(evidence.sources),
            "pageCount": pages,
            "approvedPageCount": approved,
            "sources": [
                {
                    "id": s["id"],
                    "name": s["name"],
                    "pageCount": s.get("pageCount"),
                    "approvedPageCount": s.get("approvedPageCount"),
                }
                for s in evidence.sources
            ],
        },
        "citationCount": len(evidence.citations),
    }


def build_request(
    settings: RuntimeSettings, evidence: Evidence, ctx: PromptContext, history: Sequence[tuple[str, str]]
) -> dict[str, Any]:
    """The chat-completions request body (streaming)."""
    past = conversation(history, ctx.question)
    bundle = evidence_bundle(evidence, ctx, len(past))
    user = f"# User question\n{ctx.question}\n\n# LLMWiki evidence bundle\n{compact(bundle)}"
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, *past, {"role": "user", "content": user}]
    return {"model": settings.model, "messages": messages, "temperature": 0.2, "stream": True}


def endpoint(settings: RuntimeSettings) -> str:
    base = (settings.base_url or "").rstrip("/")
    return base if base.endswith("/chat/completions") else base + "/chat/completions"


def _headers(settings: RuntimeSettings) -> dict[str, str]:
    headers = {"content-type": "application/json", "accept": "text/event-stream, application/json"}
    key = os.environ.get(settings.api_key_env or "", "").strip() if settings.api_key_env else ""
    if key:
        register_secret(key)
        headers["authorization"] = f"Bearer {key}"
    return headers


def _text_of(choice: Any, key: str) -> str:
    if not isinstance(choice, dict):
        return ""
    part = as_dict(choice.get(key))
    content = part.get("content")
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else str(choice.get("text") or "")


class Completion(msgspec.Struct, frozen=True):
    """A runtime's answer: its text, and its token usage in the turn ``usage`` shape
    (``inputTokens``, ``outputTokens``, ``totalTokens``, ``cachedReadTokens``; empty when the
    runtime reports none)."""

    text: str
    usage: dict[str, int]


class RuntimeClient:
    """The runtime's HTTP connection pool, for the knowledge service's lifetime.

    A new ``httpx.AsyncClient`` per model call cost about 27 ms of CPU each (client and TLS
    context set-up): delegated turns were 2.05x slower than the LLMWiki agent bridge at p50 (bench
    case 7, delegated turns). One client, made on first use, serves every call.
    """

    def __init__(self) -> None:
        self._client: httpx.AsyncClient | None = None

    def get(self) -> httpx.AsyncClient:
        if self._client is None:
            import httpx  # here, not at the top: a bridge without a runtime model never needs it (~15 ms)

            self._client = httpx.AsyncClient(
                follow_redirects=False, timeout=None, event_hooks={"request": [tracing.httpx_request_hook]}
            )
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await client.aclose()


async def complete(
    settings: RuntimeSettings, body: dict[str, Any], on_delta: Callable[[str], None], pool: RuntimeClient | None = None
) -> Completion:
    """:func:`stream_completion`, counted in the model-call metrics under the runtime's
    ``llm.runtimes`` id."""
    runtime_id = settings.id or "knowledge"
    try:
        attributes = {"xworkmate.runtime": runtime_id, "gen_ai.request.model": settings.model or ""}
        with tracing.span("model.call", attributes):
            completion = await stream_completion(settings, body, on_delta, pool)
    except RuntimeFailure as exc:
        METRICS.model_calls.inc(runtime_id, exc.reason)
        raise
    METRICS.model_calls.inc(runtime_id, "ok")
    METRICS.tokens(runtime_id, completion.usage)
    return completion


async def stream_completion(
    settings: RuntimeSettings, body: dict[str, Any], on_delta: Callable[[str], None], pool: RuntimeClient | None = None
) -> Completion:
    """POST ``body`` and stream the answer to ``on_delta`` as it arrives.

    Accepts an SSE stream (``chat.completion.chunk``) or a plain JSON completion. Asks for usage
    (``stream_options.include_usage``) and, when a runtime refuses that option (HTTP 400/422
    naming it), asks once more without it. Bounded by ``settings.timeout_seconds`` overall and
    ``MAX_ANSWER_CHARS``.

    Raises:
        RuntimeFailure: the call failed or produced no text; also a stream that ended without a
            ``finish_reason`` or ``[DONE]`` (``truncated``), an ``event: error`` frame or an in-band
            ``{"error": …}`` chunk (``upstream_error``, with the runtime's own message). What
            streamed before stays streamed.
    """
    if not settings.configured:
        raise RuntimeFailure("not_configured")
    import httpx

    parts: list[str] = []
    usage: dict[str, int] = {}

    def emit(text: str) -> None:
        if text and sum(map(len, parts)) < MAX_ANSWER_CHARS:
            parts.append(text)
            on_delta(text)

    owned = pool is None
    pool = pool or RuntimeClient()
    request = {**body, "stream_options": {"include_usage": True}} if body.get("stream") else body
    try:
        with anyio.fail_after(settings.timeout_seconds):
            try:
                await _post(pool.get(), settings, request, emit, usage)
            except _OptionRefused:
                await _post(pool.get(), settings, body, emit, usage)
    except TimeoutError as exc:
        raise RuntimeFailure("timeout") from exc
    except httpx.TimeoutException as exc:
        raise RuntimeFailure("timeout") from exc
    except httpx.HTTPError as exc:
        raise RuntimeFailure("connect") from exc
    except ValueError as exc:
        raise RuntimeFailure("invalid_json") from exc
    finally:
        if owned:
            await pool.aclose()
    text = "".join(parts)
    if not text.strip():
        raise RuntimeFailure("empty_answer")
    return Completion(text, usage)


class _OptionRefused(Exception):
    """The runtime refused ``stream_options`` (HTTP 400/422 naming it)."""


async def _post(
    client: httpx.AsyncClient,
    settings: RuntimeSettings,
    body: dict[str, Any],
    emit: Callable[[str], None],
    usage: dict[str, int],
) -> None:
    content = encode_body(body)  # not httpx's json=: the stdlib encoder took 0.2 ms of a delegated turn
    async with client.stream("POST", endpoint(settings), content=content, headers=_headers(settings)) as resp:
        if resp.status_code != 200:
            detail = (await _read_capped(resp, 64 * 1024)).decode("utf-8", "replace")
            if resp.status_code in (400, 422) and "stream_options" in body and "stream_options" in detail:
                raise _OptionRefused
            raise RuntimeFailure("http_status", resp.status_code, error_message(detail))
        if "text/event-stream" in resp.headers.get("content-type", ""):
            await _read_sse(resp, emit, usage)
        else:
            payload = json.loads(await _read_capped(resp))
            emit(_text_of(_choice(payload), "message"))
            usage.update(openai_usage(as_dict(payload).get("usage")))


def _choice(payload: Any) -> Any:
    if not isinstance(payload, dict):
        raise RuntimeFailure("upstream_error")
    if payload.get("error"):
        error = payload["error"]
        message = error.get("message") if isinstance(error, dict) else error
        raise RuntimeFailure("upstream_error", message=str(message or "")[:500])
    choices = payload.get("choices")
    return choices[0] if isinstance(choices, list) and choices else {}


async def _read_capped(resp: httpx.Response, limit: int = 4 * MAX_ANSWER_CHARS) -> bytes:
    body = bytearray()
    async for chunk in resp.aiter_bytes():
        body += chunk
        if len(body) > limit:
            if limit < 4 * MAX_ANSWER_CHARS:
                return bytes(body[:limit])  # an error body: its start is enough
            raise RuntimeFailure("too_large")
    return bytes(body)


async def _read_sse(resp: httpx.Response, emit: Callable[[str], None], usage: dict[str, int]) -> None:
    """Read a ``chat.completion.chunk`` stream until ``[DONE]``.

    Raises:
        RuntimeFailure: ``upstream_error`` for an ``event: error`` frame or an ``{"error": …}``
            chunk; ``truncated`` when the stream ends with neither a ``finish_reason`` nor ``[DONE]``.
    """
    event = ""
    finished = done = False
    async for line in resp.aiter_lines():
        if done:
            continue  # read to the end, so the connection goes back to the pool
        if not line:
            event = ""  # a blank line ends an SSE event
            continue
        if line.startswith("event:"):
            event = line[6:].strip()
            continue
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            continue
        if not data:
            continue
        payload = json.loads(data)
        if event == "error":
            message = error_message(data) or "the runtime sent an error event"
            raise RuntimeFailure("upstream_error", message=message)
        choice = _choice(payload)
        usage.update(openai_usage(as_dict(payload).get("usage")))
        emit(_text_of(choice, "delta"))
        if isinstance(choice, dict) and choice.get("finish_reason"):
            finished = True
    if not finished and not done:
        raise RuntimeFailure("truncated", message="the runtime's stream ended without a finish_reason or [DONE]")
