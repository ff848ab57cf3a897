"""The ASGI application: ``POST /acp/rpc`` (JSON or SSE), ``GET /acp`` (WebSocket, ``bridge.ws``),
``GET /`` and ``GET /api/ping`` (docs/api.md "HTTP"; xworkmate-original.md §3.3-§3.6).

Checks on ``/acp/rpc`` run in this order: OPTIONS → 204, other methods → 405, origin → 403, body
size → 413, token → 401, JSON → 400. Everything after parsing is HTTP 200 (or 204 when nothing
will be answered), JSON-RPC errors included.

Imports ``bridge.*``, Starlette and sse-starlette only; knows nothing about sessions.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import Any

import anyio
from anyio.abc import TaskGroup
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import Receive, Scope, Send

import bridge
from bridge.auth import Authenticator, OriginPolicy, rejection
from bridge.config import BridgeConfig
from bridge.dispatch import CallContext, Dispatcher
from bridge.rpc.codec import Frame, Invalid, parse_frame
from bridge.rpc.errors import InvalidRequest, NotFound, OriginNotAllowed, ParseError, Unauthorized
from bridge.rpc.stream import EnvelopeStream
from bridge.ws import AcpWebSocket

log = logging.getLogger(__name__)

BANNER = "xworkmate-bridge is running"
BODY_READ_TIMEOUT = 30.0
"""Seconds allowed for reading a request body; a client that stalls mid-body gets 408."""
DEADLINE_SWEEP = 0.25
"""Seconds between two checks for body reads past ``BODY_READ_TIMEOUT`` (``ReadDeadlines``)."""
CORS_HEADERS = {
    "Access-Control-Allow-Methods": "POST, OPTIONS",
    "Access-Control-Allow-Headers": "Authorization, Content-Type, Accept",
    "Access-Control-Max-Age": "600",
}
_COMMIT = re.compile(r"[0-9a-f]{40}")
_ids = itertools.count(1)
Lifespan = Callable[[Starlette], AbstractAsyncContextManager[Any]]


def create_app(
    config: BridgeConfig,
    dispatcher: Dispatcher,
    *,
    lifespan: Lifespan | None = None,
    bind_host: str | None = None,
    mcp_app: Any = None,
) -> Starlette:
    """Build the bridge's Starlette app.

    Args:
        config: origins, tokens, limits and ``sse_keepalive`` (seconds) are read from it.
        dispatcher: serves every JSON-RPC frame, whatever the transport.
        lifespan: the caller's lifespan (e.g. starting the orchestrator); it is entered first and
            left last, around the task group that runs id-less requests in the background.
        bind_host: the address the server binds (default ``config.host``); with no token
            configured, requests are allowed only when it is loopback (or
            ``allowInsecureNoAuth``).
        mcp_app: an ASGI app served at ``/mcp`` behind the same origin and token checks.
    """
    auth = Authenticator.from_config(config, bind_host=bind_host)
    origins = OriginPolicy(config.allowed_origins)
    rpc = RpcEndpoint(dispatcher, auth, origins, config)
    ws = AcpWebSocket(
        dispatcher,
        auth,
        origins,
        queue_size=config.limits.max_connection_queue,
        queue_bytes=config.limits.max_connection_queue_bytes,
    )
    routes = [
        Route("/acp/rpc", rpc),  # an ASGI app, so every method reaches it (405 is ours); hottest first
        WebSocketRoute("/acp", ws),
        Route("/api/ping", ping, methods=["GET"]),
        Route("/", banner, methods=["GET"]),
    ]
    if mcp_app is not None:
        routes.append(Route("/mcp", Guarded(mcp_app, auth, origins), methods=["GET", "POST", "DELETE"]))
    handlers = {404: _http_error, 405: _http_error}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=rpc.lifespan(lifespan))
    app.router.redirect_slashes = False  # "/acp/rpc/" is 404 like any other path, not a redirect
    return app


async def banner(request: Request) -> Response:
    return PlainTextResponse(BANNER)


async def ping(request: Request) -> Response:
    return JSONResponse(image_info(os.environ.get("IMAGE")))


def image_info(image: str | None) -> dict[str, str]:
    """``/api/ping`` fields from the ``IMAGE`` reference (xworkmate-original.md §3.5).

    ``@digest`` is dropped; the tag is the text after the last ``:`` that follows the last ``/``;
    a 40-hex tag is also the commit. With ``IMAGE`` unset, ``version`` is the package version.
    """
    image = (image or "").strip()
    if not image:
        return {"status": "ok", "image": "", "tag": "", "commit": "", "version": bridge.__version__}
    ref = image.split("@", 1)[0]
    colon = ref.rfind(":")
    tag = ref[colon + 1 :] if colon > ref.rfind("/") else ""
    commit = tag if _COMMIT.fullmatch(tag) else ""
    return {"status": "ok", "image": image, "tag": tag, "commit": commit, "version": tag}


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if status == 404:
        return rejection(404, NotFound(f"not found: {request.url.path}"[:300]))
    return rejection(status, InvalidRequest("method not allowed"), getattr(exc, "headers", None))


class BodyTooLarge(Exception):
    """The body is longer than ``limits.max_message_bytes``."""


async def read_body(receive: Receive, declared: str, limit: int) -> bytes:
    """Read the body from ASGI ``http.request`` messages, stopping as soon as it passes ``limit``
    bytes; ``declared`` is the ``Content-Length`` header ("" when absent).

    Raises:
        BodyTooLarge: ``Content-Length`` or the bytes read so far exceed ``limit``; the rest is
            never buffered (field-failures #6).
        ClientDisconnect: the client left before the body was complete.
    """
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def parse_body(body: bytes) -> tuple[Frame | bytes, bool]:
    """Parse the body once: ``(frame, whether it will be answered)``. A reply is expected unless
    the frame is a notification or a batch of only notifications (JSON-RPC 2.0 §4.1, §6). The
    empty batch stays as bytes: the dispatcher answers it with one error.

    Raises:
        ParseError: -32700, the body is not JSON (HTTP 400).
    """
    try:
        frame = parse_frame(body)
    except InvalidRequest:
        return body, True
    if not frame.is_batch:
        message = frame.messages[0]
        return frame, isinstance(message, Invalid) or not message.is_notification
    return frame, any(isinstance(m, Invalid) or not m.is_notification for m in frame.messages)


class RpcHeaders:
    """The request headers ``/acp/rpc`` reads, found in one pass over the ASGI scope (header
    names arrive lowercased, ASGI spec §2.2.1). Four Starlette ``Headers`` lookups, each a scan
    that raises ``KeyError`` for an absent header, cost more than the rest of the request parsing
    (bench case 2, cProfile of the ASGI app).
    """

    __slots__ = ("accept", "authorization", "content_length", "origins")

    def __init__(self) -> None:
        self.origins: list[str] = []  # every Origin header: a request carrying two is judged by both
        self.authorization: str | None = None
        self.accept = ""
        self.content_length = ""

    @classmethod
    def of(cls, scope: Scope) -> RpcHeaders:
        found = cls()
        for name, value in scope["headers"]:
            if name == b"origin":
                found.origins.append(value.decode("latin-1"))
            elif name == b"authorization" and found.authorization is None:
                found.authorization = value.decode("latin-1")
            elif name == b"accept" and not found.accept:
                found.accept = value.decode("latin-1")
            elif name == b"content-length" and not found.content_length:
                found.content_length = value.decode("latin-1")
        return found


class ReadDeadlines:
    """Body reads past ``BODY_READ_TIMEOUT`` seconds, cancelled by one sweep every
    ``DEADLINE_SWEEP`` seconds (the read then raises ``TimeoutError``).

    A timer per request (``asyncio.timeout``, which arms a uvloop timer) cost 3.8 us of the
    bridge's ~50 us per request in bench case 2; a dict entry costs 0.1 us. The anyio cancel
    scope used before cost more still. A deadline is late by at most ``DEADLINE_SWEEP``.
    """

    def __init__(self) -> None:
        self._due: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self.running = False

    async def read(self, body: Awaitable[bytes]) -> bytes:
        """Await ``body`` within the deadline. Raises TimeoutError past it."""
        task = asyncio.current_task()
        assert task is not None
        self._due[task] = time.monotonic() + BODY_READ_TIMEOUT
        try:
            return await body
        except asyncio.CancelledError:
            if task not in self._expired:
                raise
            task.uncancel()
            raise TimeoutError from None
        finally:
            self._due.pop(task, None)
            self._expired.discard(task)

    async def sweep(self) -> None:
        """Run in the app's lifespan; cancels reads whose deadline has passed."""
        self.running = True
        try:
            while True:
                await anyio.sleep(DEADLINE_SWEEP)
                now = time.monotonic()
                for task in [t for t, due in self._due.items() if due <= now]:
                    del self._due[task]
                    self._expired.add(task)
                    task.cancel()
        finally:
            self.running = False


class RpcEndpoint:
    """``/acp/rpc`` for every method; also owns the task group for id-less requests."""

    def __init__(
        self, dispatcher: Dispatcher, auth: Authenticator, origins: OriginPolicy, config: BridgeConfig
    ) -> None:
        self._dispatcher = dispatcher
        self._auth = auth
        self._origins = origins
        self._limit = config.limits.max_message_bytes
        self._queue_size = config.limits.max_connection_queue
        self._queue_bytes = config.limits.max_connection_queue_bytes
        self._keepalive = config.sse_keepalive
        self._background: TaskGroup | None = None
        self._deadlines = ReadDeadlines()

    def lifespan(self, outer: Lifespan | None) -> Lifespan:
        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[Any]:
            async with outer(app) if outer else nullcontext() as state, anyio.create_task_group() as tg:
                tg.start_soon(self._deadlines.sweep)
                self._background = tg
                try:
                    yield state
                finally:
                    self._background = None
                    tg.cancel_scope.cancel()

        return lifespan

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.handle(scope["method"], RpcHeaders.of(scope), receive)
        await response(scope, receive, send)

    async def handle(self, method: str, request: RpcHeaders, receive: Receive) -> Response | _JsonReply:
        origin = request.origins[0] if request.origins else None
        headers = {"Vary": "Origin"}
        if origin and self._origins.allows(origin):
            headers.update(CORS_HEADERS, **{"Access-Control-Allow-Origin": origin})
        if method == "OPTIONS":
            return Response(status_code=204, headers=headers)
        if method != "POST":
            error = InvalidRequest("method not allowed")
            return rejection(405, error, {**headers, "Allow": "POST, OPTIONS"})
        if not self._origins.allows_all(request.origins):
            return rejection(403, OriginNotAllowed(f"origin not allowed: {origin}"[:300]), headers)
        return await self._post(request, receive, headers)

    async def _post(self, request: RpcHeaders, receive: Receive, headers: dict[str, str]) -> Response | _JsonReply:
        body = await self._read(receive, request.content_length, headers)
        if isinstance(body, Response):
            return body
        try:
            principal = self._auth.authenticate(request.authorization)
        except Unauthorized as exc:
            return rejection(401, exc, {**headers, "WWW-Authenticate": "Bearer"})
        try:
            frame, reply_expected = parse_body(body)
        except ParseError as exc:
            return rejection(400, exc, headers)
        ctx = CallContext(principal, connection_id=f"http-{next(_ids)}")
        if not reply_expected:
            return self._detach(frame, ctx, headers)
        if "text/event-stream" in request.accept.lower():
            from bridge.sse import SseReply  # sse-starlette: ~5 ms of the cold start, imported when first used

            return SseReply(
                self._dispatcher,
                frame,
                ctx,
                headers,
                keepalive=self._keepalive,
                queue_size=self._queue_size,
                queue_bytes=self._queue_bytes,
            )
        return await self._json(frame, ctx, headers)

    async def _read(self, receive: Receive, declared: str, headers: dict[str, str]) -> bytes | Response:
        """The body, or the response refusing it (413 too large, 408 stalled)."""
        try:
            if self._deadlines.running:
                return await self._deadlines.read(read_body(receive, declared, self._limit))
            async with asyncio.timeout(BODY_READ_TIMEOUT):  # no lifespan, so no sweeper
                return await read_body(receive, declared, self._limit)
        except BodyTooLarge:
            error = InvalidRequest("Invalid Request: body too large", maxMessageBytes=self._limit)
            # No "Connection: close": uvicorn discards the unread rest (never buffered), and a
            # client still sending would otherwise meet a reset instead of this answer.
            return rejection(413, error, headers)
        except TimeoutError:
            error = InvalidRequest("Invalid Request: body read timed out")
            return rejection(408, error, {**headers, "Connection": "close"})
        except ClientDisconnect:
            return Response(status_code=400)  # nobody is left to read it

    def _detach(self, body: Frame | bytes, ctx: CallContext, headers: dict[str, str]) -> Response:
        """204 at once; the notifications still run, in the app's task group."""
        run = _Detached(self._dispatcher, body, ctx)
        if self._background is not None:
            self._background.start_soon(run)
            return Response(status_code=204, headers=headers)
        # No lifespan (a bare ASGI harness): run right after the response instead.
        return Response(status_code=204, headers=headers, background=BackgroundTask(run))

    async def _json(self, body: Frame | bytes, ctx: CallContext, headers: dict[str, str]) -> Response | _JsonReply:
        replies: list[bytes] = []  # ctx.notify discards: without SSE notifications have nowhere to go
        await self._dispatcher.run_frame(body, EnvelopeStream(replies.append), ctx)
        if not replies:
            return Response(status_code=204, headers=headers)
        return _JsonReply(replies[0], headers)


class _JsonReply:
    """A 200 ``application/json`` response: Starlette's ``Response`` minus its generic header
    assembly (a tenth of the bridge's own time per request in bench case 2, cProfile)."""

    __slots__ = ("body", "raw_headers")
    status_code = 200

    def __init__(self, body: bytes, headers: dict[str, str]) -> None:
        self.body = body
        self.raw_headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body})


class Guarded:
    """Wraps an ASGI app with the bridge's origin (403, -32003) and token (401, -32001) checks."""

    def __init__(self, app: Any, auth: Authenticator, origins: OriginPolicy) -> None:
        self._app, self._auth, self._origins = app, auth, origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        origin = request.headers.get("origin")
        if not self._origins.allows_all(request.headers.getlist("origin")):
            response = rejection(403, OriginNotAllowed(f"origin not allowed: {origin}"[:300]))
        else:
            try:
                self._auth.authenticate(request.headers.get("authorization"))
            except Unauthorized as exc:
                response = rejection(401, exc, {"WWW-Authenticate": "Bearer"})
            else:
                await self._app(scope, receive, send)
                return
        await response(scope, receive, send)


class _Detached:
    """Runs an id-less frame whose response (204) has already been sent."""

    def __init__(self, dispatcher: Dispatcher, body: Frame | bytes, ctx: CallContext) -> None:
        self._dispatcher, self._body, self._ctx = dispatcher, body, ctx

    async def __call__(self) -> None:
        await self._dispatcher.run_frame(self._body, EnvelopeStream(_drop), self._ctx)


def _drop(envelope: bytes) -> None:
    """Nothing is sent for a frame of notifications."""
