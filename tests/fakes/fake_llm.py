"""A fake model server for offline end-to-end tests of the real coding agents.

One Starlette app on 127.0.0.1 speaks enough of four wire formats for every pinned agent:

* OpenAI ``POST /v1/chat/completions`` (SSE ``chat.completion.chunk`` ending ``data: [DONE]``, or JSON),
  used by opencode (``@ai-sdk/openai-compatible``) and hermes;
* OpenAI ``POST /v1/responses`` (SSE ``response.*`` events, or JSON), used by codex-acp;
* Gemini ``POST /v1beta/models/{model}:streamGenerateContent?alt=sse`` and ``:generateContent``
  (plus ``:countTokens``), used by gemini-cli;
* Anthropic ``POST /v1/messages`` (SSE ``message_start`` … ``message_stop``, or JSON) and
  ``/v1/messages/count_tokens``, used by Claude Code behind claude-agent-acp;

plus the small start-up probes the agents make (model lists, ``HEAD /``). Anything else answers 404
and is still recorded.

The reply is configurable (``set_reply``): a text (default ``"Hello from mock"``) or a list of
chunks, each sent as its own delta, with an optional delay before each chunk; ``queue_reply`` sets
the answer for the next main call only (FIFO), and ``responder`` (a callable taking the recorded
request) can decide per request. A reply can also call a tool: ``Reply.function_call`` (Gemini) or
``Reply.tool_call`` (OpenAI chat completions, e.g. ``queue_reply(tool_call={"name": "write",
"arguments": {"path": "hello.txt", "content": "hi\\n"}})``: a ``tool_calls`` delta and
``finish_reason: "tool_calls"``). Side calls are
recognised and answered sensibly: title generators get a short title, structured-output calls
(JSON mode / response schema, e.g. gemini's next-speaker check or model router) get a JSON object
built from the requested schema. Every request is recorded (method, path, query, headers, JSON
body) in ``server.requests``.

In-process use (pytest)::

    from tests.fakes.fake_llm import FakeLLM
    with FakeLLM() as llm:            # binds 127.0.0.1:<ephemeral>, serves from a thread
        llm.set_reply(chunks=["Hello ", "from ", "mock"], delay=0.05)
        ... llm.base_url ...           # "http://127.0.0.1:PORT"
        llm.requests, llm.paths(), llm.main_requests()

or the ``fake_llm`` fixture defined below (import it into a test module or conftest).

Stand-alone: ``python tests/fakes/fake_llm.py --port 18080 [--reply TEXT] [--chunk A --chunk B] [--delay S]``
(requests are logged to stderr as JSON lines).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

DEFAULT_REPLY = "Hello from mock"
DEFAULT_TITLE = "Mock conversation"
DEFAULT_MODELS = ("mock-model", "m1", "gemini-2.5-flash", "claude-sonnet-4-6")


# --------------------------------------------------------------------------------------------
# Recording


@dataclass
class RecordedRequest:
    """One request as the agent sent it."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or None
    raw: bytes
    time: float
    kind: str = "other"  # "main", "title", "json", "count", "models", "probe", "other"
    api: str = ""  # "openai-chat", "openai-responses", "gemini", "anthropic", ""
    status: int = 200

    @property
    def json(self) -> Any:
        return self.body

    def text(self) -> str:
        """All user/system visible text of the request body, flattened (for assertions)."""
        return _flatten_text(self.body)

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "kind": self.kind,
            "api": self.api,
            "status": self.status,
            "headers": self.headers,
            "body_bytes": len(self.raw),
        }


def _flatten_text(obj: Any) -> str:
    out: list[str] = []

    def walk(o: Any) -> None:
        if isinstance(o, str):
            out.append(o)
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk(obj)
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Reply configuration


@dataclass
class Reply:
    """What the next model call answers with."""

    chunks: list[str] = field(default_factory=lambda: [DEFAULT_REPLY])
    delay: float = 0.0  # seconds to wait before each chunk
    function_call: dict[str, Any] | None = None
    """Gemini only: ``{name, args}``, answered as one ``functionCall`` part after the chunks (an
    agent's tool use: its next request carries the ``functionResponse``)."""
    tool_call: dict[str, Any] | None = None
    """OpenAI chat completions only: ``{"name": ..., "arguments": {...} or "<json>", "id"?: ...}``,
    answered after the chunks as one ``tool_calls`` entry (id ``call_fake_<n>`` unless given) with
    ``finish_reason: "tool_calls"``, streamed or not. Empty text chunks are not sent as deltas. The
    agent's next request carries the ``role: "tool"`` result."""

    @property
    def text(self) -> str:
        return "".join(self.chunks)


Responder = Callable[[RecordedRequest], "Reply | str | list[str] | None"]


def _schema_example(schema: Any, depth: int = 0) -> Any:
    """A small value that satisfies a JSON schema (OpenAPI-ish, as Gemini and OpenAI send them)."""
    if not isinstance(schema, dict) or depth > 8:
        return "ok"
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return _schema_example(schema[key][0], depth + 1)
    typ = schema.get("type")
    if isinstance(typ, list):
        typ = next((t for t in typ if str(t).lower() != "null"), typ[0] if typ else "string")
    typ = str(typ or ("object" if "properties" in schema else "string")).lower()
    if typ == "object":
        props = schema.get("properties") or {}
        return {k: _schema_example(v, depth + 1) for k, v in props.items()}
    if typ == "array":
        return [_schema_example(schema.get("items") or {}, depth + 1)]
    if typ in ("integer", "number"):
        return schema.get("minimum", 1)
    if typ == "boolean":
        return False
    return "ok"


# Known structured side calls: answer so that the agent carries on with the user's turn.
_KNOWN_JSON = {
    # gemini-cli next-speaker check: "user" ends the turn.
    "next_speaker": {"reasoning": "The model answered; it is the user's turn.", "next_speaker": "user"},
}


def _json_answer(schema: Any) -> str:
    value = _schema_example(schema) if schema else {}
    if isinstance(value, dict):
        for key, canned in _KNOWN_JSON.items():
            if key in value:
                value = dict(canned)
                break
    return json.dumps(value)


_TITLE_MARKERS = (
    "title generator",
    "generate a title",
    "generate a brief title",
    "generate a short title",
    "generate a concise title",
    "conversation title",
    "session title",
    "thread title",
    "a title for",
    "sentence-case title",
)


def _looks_like_title_request(system_text: str, has_tools: bool) -> bool:
    """Title generators (opencode's small-model call, …) send no tools and say so up front.

    Main agent prompts are long, carry tools and may mention titles somewhere deep inside, so only
    the opening of a tool-less system prompt counts.
    """
    if has_tools:
        return False
    head = system_text.lstrip()[:600].lower()
    return any(m in head for m in _TITLE_MARKERS)


# --------------------------------------------------------------------------------------------
# The server


class FakeLLM:
    """The fake model server. Thread-safe recording; start()/stop() or use as a context manager."""

    def __init__(
        self,
        reply: str | None = None,
        chunks: Iterable[str] | None = None,
        delay: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
        title: str = DEFAULT_TITLE,
        models: Iterable[str] = DEFAULT_MODELS,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.title = title
        self.models = list(models)
        self.requests: list[RecordedRequest] = []
        self.responder: Responder | None = None
        self._tool_call_seq = 0
        self._queue: deque[Reply] = deque()
        self._json_queue: deque[Reply] = deque()
        self._errors: deque[tuple[int, str, str | None]] = deque()
        self._reply = Reply()
        self.set_reply(reply, chunks=chunks, delay=delay)
        self._lock = threading.Lock()
        self._log = log
        self._thread: threading.Thread | None = None
        self._server: uvicorn.Server | None = None
        self._sock: socket.socket | None = None
        self.app = self._build_app()

    # ---- configuration ---------------------------------------------------------------------

    def set_reply(self, text: str | None = None, *, chunks: Iterable[str] | None = None, delay: float = 0.0) -> None:
        """Set the answer to main model calls: one text, or explicit chunks (one delta each)."""
        if chunks is not None:
            parts = [str(c) for c in chunks]
        else:
            parts = [DEFAULT_REPLY if text is None else text]
        self._reply = Reply(chunks=parts or [""], delay=float(delay))

    def queue_reply(
        self,
        text: str | None = None,
        *,
        chunks: Iterable[str] | None = None,
        delay: float = 0.0,
        tool_call: dict[str, Any] | None = None,
    ) -> None:
        """Answer the *next* main model call with this reply (FIFO); later calls fall back to set_reply.

        ``tool_call`` (``{"name", "arguments"}``) makes an OpenAI chat-completions answer call that
        tool (see ``Reply.tool_call``); without ``text``/``chunks`` it then carries no text.
        """
        if chunks is not None:
            parts = [str(c) for c in chunks]
        elif text is None and tool_call is not None:
            parts = [""]
        else:
            parts = [DEFAULT_REPLY if text is None else text]
        with self._lock:
            self._queue.append(Reply(chunks=parts or [""], delay=float(delay), tool_call=tool_call))

    def queue_json_reply(self, text: str, *, delay: float = 0.0) -> None:
        """Answer the next JSON-mode / response-schema call with ``text`` (instead of a JSON value
        built from the schema): a reply in a code block, or one that fails validation."""
        with self._lock:
            self._json_queue.append(Reply(chunks=[text], delay=float(delay)))

    def queue_error(self, status: int, message: str = "fake error", *, retry_after: str | None = None) -> None:
        """Answer the next chat-completions or Messages call with HTTP ``status`` and an
        ``{"error": {"message"}}`` body (with a ``Retry-After`` header when given)."""
        with self._lock:
            self._errors.append((status, message, retry_after))

    def _error_for(self, rec: RecordedRequest) -> Response | None:
        with self._lock:
            if not self._errors:
                return None
            status, message, retry_after = self._errors.popleft()
        rec.status = status
        headers = {"retry-after": retry_after} if retry_after is not None else None
        return JSONResponse({"error": {"message": message, "type": "fake"}}, status_code=status, headers=headers)

    @property
    def reply(self) -> Reply:
        return self._reply

    # ---- inspection ------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def paths(self) -> list[str]:
        with self._lock:
            return [f"{r.method} {r.path}" for r in self.requests]

    def main_requests(self) -> list[RecordedRequest]:
        """Model calls that got the configured reply (not titles, JSON side calls or probes)."""
        with self._lock:
            return [r for r in self.requests if r.kind == "main"]

    def model_requests(self) -> list[RecordedRequest]:
        """Every generation call (main, title and JSON side calls)."""
        with self._lock:
            return [r for r in self.requests if r.kind in ("main", "title", "json")]

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    def wait_for(self, predicate: Callable[[list[RecordedRequest]], bool], timeout: float = 10.0) -> bool:
        """Poll until ``predicate(requests)`` holds (True) or ``timeout`` passes (False)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                snapshot = list(self.requests)
            if predicate(snapshot):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    async def async_wait_for(self, predicate: Callable[[list[RecordedRequest]], bool], timeout: float = 10.0) -> bool:
        """``wait_for`` for async tests (does not block the event loop)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                snapshot = list(self.requests)
            if predicate(snapshot):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)

    def summary(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {
                    "method": r.method,
                    "path": r.path + (f"?{r.query}" if r.query else ""),
                    "kind": r.kind,
                    "status": r.status,
                }
                for r in self.requests
            ]

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeLLM:
        if self._thread is not None:
            return self
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(128)
        sock.setblocking(False)
        self._sock = sock
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            loop="asyncio",
            http="h11",
            ws="none",
            timeout_keep_alive=30,
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        # uvicorn installs signal handlers only in the main thread; this runs in a worker thread.
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name=f"fake-llm-{self.port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake LLM server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(timeout=5)
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._thread = None
        self._server = None
        self._sock = None

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- request handling --------------------------------------------------------------------

    async def _record(self, request: Request) -> RecordedRequest:
        raw = await request.body()
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
        rec = RecordedRequest(
            method=request.method,
            path=request.url.path,
            query=request.url.query,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
            raw=raw,
            time=time.time(),
        )
        with self._lock:
            self.requests.append(rec)
        return rec

    def _emit_log(self, rec: RecordedRequest) -> None:
        if self._log is not None:
            self._log(json.dumps(rec.as_dict() | {"body": rec.body}, default=str))

    def _reply_for(self, rec: RecordedRequest) -> Reply:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        if self.responder is not None:
            got = self.responder(rec)
            if isinstance(got, Reply):
                return got
            if isinstance(got, str):
                return Reply(chunks=[got])
            if isinstance(got, list):
                return Reply(chunks=[str(c) for c in got])
        return self._reply

    def _answer(
        self, rec: RecordedRequest, system_text: str, schema: Any, json_mode: bool, has_tools: bool = False
    ) -> Reply:
        """Decide what a generation request gets, and classify it."""
        if json_mode or schema is not None:
            rec.kind = "json"
            with self._lock:
                if self._json_queue:
                    return self._json_queue.popleft()
            return Reply(chunks=[_json_answer(schema)])
        if _looks_like_title_request(system_text, has_tools):
            rec.kind = "title"
            return Reply(chunks=[self.title])
        rec.kind = "main"
        return self._reply_for(rec)

    def _build_app(self) -> Starlette:
        routes = [
            Route("/", self._root, methods=["GET", "HEAD", "POST"]),
            Route("/v1/chat/completions", self._openai_chat, methods=["POST"]),
            Route("/chat/completions", self._openai_chat, methods=["POST"]),
            Route("/v1/responses", self._openai_responses, methods=["POST"]),
            Route("/responses", self._openai_responses, methods=["POST"]),
            Route("/v1/messages", self._anthropic_messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self._anthropic_count_tokens, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/models", self._models, methods=["GET"]),
            Route("/v1/models/{model:path}", self._model_info, methods=["GET"]),
            Route("/v1beta/models", self._gemini_models, methods=["GET"]),
            Route("/v1beta/models/{rest:path}", self._gemini, methods=["GET", "POST"]),
            Route("/v1/models/{rest:path}", self._gemini, methods=["POST"]),
        ]

        async def not_found(request: Request, exc: Exception) -> Response:
            rec = await self._record(request)
            rec.status = 404
            self._emit_log(rec)
            return JSONResponse(
                {"error": {"message": f"not found: {request.url.path}", "type": "not_found"}}, status_code=404
            )

        async def not_allowed(request: Request, exc: Exception) -> Response:
            rec = await self._record(request)
            rec.status = 405
            self._emit_log(rec)
            return JSONResponse({"error": {"message": "method not allowed"}}, status_code=405)

        app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_allowed})
        return app

    # ---- trivial endpoints -------------------------------------------------------------------

    async def _root(self, request: Request) -> Response:
        rec = await self._record(request)
        rec.kind = "probe"
        self._emit_log(rec)
        if request.method == "HEAD":
            return Response(status_code=200)
        return JSONResponse({"ok": True, "server": "fake-llm"})

    async def _models(self, request: Request) -> Response:
        rec = await self._record(request)
        rec.kind = "models"
        self._emit_log(rec)
        now = int(time.time())
        if "anthropic-version" in rec.headers:
            data = [
                {"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"} for m in self.models
            ]
            return JSONResponse({"data": data, "has_more": False, "first_id": data[0]["id"], "last_id": data[-1]["id"]})
        data = [
            {
                "id": m,
                "object": "model",
                "created": now,
                "owned_by": "fake-llm",
                "context_length": 128000,
                "max_model_len": 128000,
            }
            for m in self.models
        ]
        return JSONResponse({"object": "list", "data": data})

    async def _model_info(self, request: Request) -> Response:
        rec = await self._record(request)
        rec.kind = "models"
        self._emit_log(rec)
        model = request.path_params["model"]
        return JSONResponse(
            {
                "id": model,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "fake-llm",
                "context_length": 128000,
            }
        )

    # ---- OpenAI chat completions ---------------------------------------------------------------

    async def _openai_chat(self, request: Request) -> Response:
        rec = await self._record(request)
        rec.api = "openai-chat"
        if (error := self._error_for(rec)) is not None:
            return error
        body = rec.body if isinstance(rec.body, dict) else {}
        model = str(body.get("model") or "mock-model")
        messages = body.get("messages") or []
        system_text = _flatten_text(
            [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") in ("system", "developer")]
        )
        rf = body.get("response_format") or {}
        schema = None
        json_mode = False
        if isinstance(rf, dict) and rf.get("type") == "json_schema":
            schema = (rf.get("json_schema") or {}).get("schema") or {}
        elif isinstance(rf, dict) and rf.get("type") == "json_object":
            json_mode = True
        reply = self._answer(rec, system_text, schema, json_mode, bool(body.get("tools")))
        self._emit_log(rec)
        cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        usage = {
            "prompt_tokens": 1,
            "completion_tokens": max(1, len(reply.chunks)),
            "total_tokens": 1 + max(1, len(reply.chunks)),
        }

        tool_call = self._openai_tool_call(reply)

        if not body.get("stream"):
            if reply.delay:
                await asyncio.sleep(reply.delay)
            message: dict[str, Any] = {"role": "assistant", "content": reply.text}
            if tool_call is not None:
                message = {"role": "assistant", "content": reply.text or None, "tool_calls": [tool_call]}
            return JSONResponse(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "finish_reason": "stop" if tool_call is None else "tool_calls",
                            "logprobs": None,
                        }
                    ],
                    "usage": usage,
                }
            )

        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
            obj = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
            }
            obj.update(extra)
            return _sse_data(obj)

        async def gen() -> AsyncIterator[bytes]:
            yield chunk({"role": "assistant", "content": ""})
            for part in reply.chunks:
                if reply.delay:
                    await asyncio.sleep(reply.delay)
                if tool_call is not None and part == "":
                    continue
                yield chunk({"content": part})
            if tool_call is not None:
                fn = tool_call["function"]
                head = {
                    "index": 0,
                    "id": tool_call["id"],
                    "type": "function",
                    "function": {"name": fn["name"], "arguments": ""},
                }
                yield chunk({"tool_calls": [head]})
                yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": fn["arguments"]}}]})
                yield chunk({}, "tool_calls", usage=usage)
            else:
                yield chunk({}, "stop", usage=usage)
            if include_usage:
                yield _sse_data(
                    {
                        "id": cid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": usage,
                    }
                )
            yield b"data: [DONE]\n\n"

        return _sse(gen())

    def _openai_tool_call(self, reply: Reply) -> dict[str, Any] | None:
        """``reply.tool_call`` as an OpenAI ``tool_calls`` entry (``arguments`` a JSON string)."""
        if reply.tool_call is None:
            return None
        args = reply.tool_call.get("arguments", reply.tool_call.get("args", {}))
        if not isinstance(args, str):
            args = json.dumps(args)
        call_id = reply.tool_call.get("id")
        if not call_id:
            with self._lock:
                self._tool_call_seq += 1
                call_id = f"call_fake_{self._tool_call_seq}"
        return {
            "id": str(call_id),
            "type": "function",
            "function": {"name": str(reply.tool_call["name"]), "arguments": args},
        }

    # ---- OpenAI responses ----------------------------------------------------------------------

    async def _openai_responses(self, request: Request) -> Response:
        rec = await self._record(request)
        rec.api = "openai-responses"
        body = rec.body if isinstance(rec.body, dict) else {}
        model = str(body.get("model") or "mock-model")
        system_text = str(body.get("instructions") or "")
        inp = body.get("input")
        if isinstance(inp, list):
            system_text += "\n" + _flatten_text(
                [m.get("content") for m in inp if isinstance(m, dict) and m.get("role") in ("system", "developer")]
            )
        fmt = ((body.get("text") or {}).get("format") or {}) if isinstance(body.get("text"), dict) else {}
        schema = fmt.get("schema") if fmt.get("type") == "json_schema" else None
        reply = self._answer(rec, system_text, schema, fmt.get("type") == "json_object", bool(body.get("tools")))
        self._emit_log(rec)
        rid = f"resp_{uuid.uuid4().hex[:24]}"
        mid = f"msg_{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        n_out = max(1, len(reply.chunks))
        usage = {
            "input_tokens": 1,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": n_out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 1 + n_out,
        }
        done_item = {
            "type": "message",
            "id": mid,
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
        }
        base = {"id": rid, "object": "response", "created_at": created, "model": model}

        if not body.get("stream"):
            return JSONResponse(base | {"status": "completed", "output": [done_item], "usage": usage})

        async def gen() -> AsyncIterator[bytes]:
            seq = iter(range(10_000))

            def ev(name: str, payload: dict[str, Any]) -> bytes:
                return _sse_event(name, {"type": name, "sequence_number": next(seq)} | payload)

            yield ev("response.created", {"response": base | {"status": "in_progress", "output": []}})
            yield ev("response.in_progress", {"response": base | {"status": "in_progress", "output": []}})
            yield ev(
                "response.output_item.added",
                {
                    "output_index": 0,
                    "item": {"type": "message", "id": mid, "status": "in_progress", "role": "assistant", "content": []},
                },
            )
            yield ev(
                "response.content_part.added",
                {
                    "item_id": mid,
                    "output_index": 0,
                    "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []},
                },
            )
            for part in reply.chunks:
                if reply.delay:
                    await asyncio.sleep(reply.delay)
                yield ev(
                    "response.output_text.delta", {"item_id": mid, "output_index": 0, "content_index": 0, "delta": part}
                )
            yield ev(
                "response.output_text.done", {"item_id": mid, "output_index": 0, "content_index": 0, "text": reply.text}
            )
            yield ev(
                "response.content_part.done",
                {
                    "item_id": mid,
                    "output_index": 0,
                    "content_index": 0,
                    "part": {"type": "output_text", "text": reply.text, "annotations": []},
                },
            )
            yield ev("response.output_item.done", {"output_index": 0, "item": done_item})
            yield ev(
                "response.completed",
                {"response": base | {"status": "completed", "output": [done_item], "usage": usage}},
            )

        return _sse(gen())

    # ---- Gemini ---------------------------------------------------------------------------------

    async def _gemini_models(self, request: Request) -> Response:
        rec = await self._record(request)
        rec.kind = "models"
        rec.api = "gemini"
        self._emit_log(rec)
        return JSONResponse(
            {
                "models": [
                    {
                        "name": f"models/{m}",
                        "displayName": m,
                        "inputTokenLimit": 1048576,
                        "outputTokenLimit": 65536,
                        "supportedGenerationMethods": ["generateContent", "countTokens"],
                    }
                    for m in self.models
                ]
            }
        )

    async def _gemini(self, request: Request) -> Response:
        rec = await self._record(request)
        rec.api = "gemini"
        rest = request.path_params["rest"]
        model, _, action = rest.partition(":")
        body = rec.body if isinstance(rec.body, dict) else {}
        if request.method == "GET" or not action:
            rec.kind = "models"
            self._emit_log(rec)
            return JSONResponse(
                {
                    "name": f"models/{model}",
                    "displayName": model,
                    "inputTokenLimit": 1048576,
                    "outputTokenLimit": 65536,
                    "supportedGenerationMethods": ["generateContent", "countTokens"],
                }
            )
        if action == "countTokens":
            rec.kind = "count"
            self._emit_log(rec)
            return JSONResponse({"totalTokens": max(1, len(rec.text()) // 4)})
        if action in ("embedContent", "batchEmbedContents"):
            rec.kind = "other"
            self._emit_log(rec)
            vec = {"values": [0.0] * 8}
            if action == "embedContent":
                return JSONResponse({"embedding": vec})
            return JSONResponse({"embeddings": [vec for _ in body.get("requests") or [None]]})
        if action not in ("generateContent", "streamGenerateContent"):
            rec.status = 404
            self._emit_log(rec)
            return JSONResponse(
                {"error": {"code": 404, "message": f"unknown action {action}", "status": "NOT_FOUND"}}, status_code=404
            )

        gen_cfg = body.get("generationConfig") or body.get("generation_config") or {}
        system_text = _flatten_text(body.get("systemInstruction") or body.get("system_instruction"))
        schema = gen_cfg.get("responseJsonSchema") or gen_cfg.get("responseSchema")
        json_mode = gen_cfg.get("responseMimeType") == "application/json"
        reply = self._answer(rec, system_text, schema, json_mode, bool(body.get("tools")))
        self._emit_log(rec)
        n_out = max(1, len(reply.chunks))
        usage = {"promptTokenCount": 1, "candidatesTokenCount": n_out, "totalTokenCount": 1 + n_out}

        def cand(text: str, finish: bool) -> dict[str, Any]:
            c: dict[str, Any] = {"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}
            if finish:
                c["finishReason"] = "STOP"
            return c

        if action == "generateContent":
            return JSONResponse({"candidates": [cand(reply.text, True)], "usageMetadata": usage, "modelVersion": model})

        async def gen() -> AsyncIterator[bytes]:
            last = len(reply.chunks) - 1 + (reply.function_call is not None)
            for i, part in enumerate(reply.chunks):
                if reply.delay:
                    await asyncio.sleep(reply.delay)
                obj: dict[str, Any] = {"candidates": [cand(part, i == last)], "modelVersion": model}
                if i == last:
                    obj["usageMetadata"] = usage
                yield _sse_data(obj, crlf=False)
            if reply.function_call is not None:
                call = {"role": "model", "parts": [{"functionCall": reply.function_call}]}
                obj = {"candidates": [{"content": call, "index": 0, "finishReason": "STOP"}], "modelVersion": model}
                yield _sse_data(obj | {"usageMetadata": usage}, crlf=False)

        if request.query_params.get("alt") == "sse":
            return _sse(gen())

        # Without alt=sse the REST API streams one JSON array.
        async def gen_array() -> AsyncIterator[bytes]:
            yield b"["
            first = True
            async for ev in gen():
                payload = ev.decode()[len("data: ") :].strip()
                yield (b"" if first else b",") + payload.encode()
                first = False
            yield b"]"

        return StreamingResponse(gen_array(), media_type="application/json")

    # ---- Anthropic ------------------------------------------------------------------------------

    async def _anthropic_count_tokens(self, request: Request) -> Response:
        rec = await self._record(request)
        rec.kind = "count"
        rec.api = "anthropic"
        self._emit_log(rec)
        return JSONResponse({"input_tokens": max(1, len(rec.text()) // 4)})

    async def _anthropic_messages(self, request: Request) -> Response:
        rec = await self._record(request)
        rec.api = "anthropic"
        if (error := self._error_for(rec)) is not None:
            return error
        body = rec.body if isinstance(rec.body, dict) else {}
        model = str(body.get("model") or "claude-sonnet-4-6")
        system_text = _flatten_text(body.get("system"))
        schema = None
        of = body.get("output_format") or (body.get("output_config") or {}).get("format")
        if isinstance(of, dict) and of.get("type") == "json_schema":
            schema = of.get("schema") or {}
        reply = self._answer(rec, system_text, schema, False, bool(body.get("tools")))
        self._emit_log(rec)
        mid = f"msg_{uuid.uuid4().hex[:24]}"
        n_out = max(1, len(reply.chunks))
        usage_start = {
            "input_tokens": 10,
            "output_tokens": 1,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        message = {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_start,
        }

        if not body.get("stream"):
            if reply.delay:
                await asyncio.sleep(reply.delay)
            return JSONResponse(
                message
                | {
                    "content": [{"type": "text", "text": reply.text}],
                    "stop_reason": "end_turn",
                    "usage": usage_start | {"output_tokens": n_out},
                }
            )

        async def gen() -> AsyncIterator[bytes]:
            yield _sse_event("message_start", {"type": "message_start", "message": message})
            yield _sse_event(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            )
            yield _sse_event("ping", {"type": "ping"})
            for part in reply.chunks:
                if reply.delay:
                    await asyncio.sleep(reply.delay)
                yield _sse_event(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": part}},
                )
            yield _sse_event("content_block_stop", {"type": "content_block_stop", "index": 0})
            yield _sse_event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": n_out},
                },
            )
            yield _sse_event("message_stop", {"type": "message_stop"})

        return _sse(gen())


# --------------------------------------------------------------------------------------------
# SSE helpers


def _sse_data(obj: Any, crlf: bool = False) -> bytes:
    nl = "\r\n" if crlf else "\n"
    return f"data: {json.dumps(obj, separators=(',', ':'))}{nl}{nl}".encode()


def _sse_event(name: str, obj: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def _sse(gen: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(
        gen, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


# --------------------------------------------------------------------------------------------
# pytest fixture (import it into a test module or a conftest: ``from tests.fakes.fake_llm import fake_llm``)

try:  # pragma: no cover - pytest is only present in the test environment
    import pytest

    @pytest.fixture
    def fake_llm() -> Iterable[FakeLLM]:
        """A started FakeLLM on 127.0.0.1:<ephemeral>; stopped after the test."""
        server = FakeLLM()
        server.start()
        try:
            yield server
        finally:
            server.stop()

except ImportError:  # pragma: no cover
    pass


# --------------------------------------------------------------------------------------------
# CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=18080)
    ap.add_argument("--reply", default=None, help=f"reply text (default {DEFAULT_REPLY!r})")
    ap.add_argument("--chunk", action="append", default=None, help="one reply chunk (repeatable)")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds before each chunk")
    ap.add_argument("--quiet", action="store_true", help="do not log requests to stderr")
    args = ap.parse_args(argv)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    server = FakeLLM(
        reply=args.reply,
        chunks=args.chunk,
        delay=args.delay,
        host=args.host,
        port=args.port,
        log=None if args.quiet else log,
    )
    server.start()
    print(f"fake-llm listening on {server.base_url}", file=sys.stderr, flush=True)

    def _term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
