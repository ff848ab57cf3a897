"""The ASGI application: ``POST /acp/rpc`` (JSON or SSE), ``GET /acp`` (WebSocket, ``bridge.ws``),
``GET /`` and ``GET /api/ping`` (docs/api.md "HTTP"; xworkmate-original.md §3.3-§3.6).

Checks on ``/acp/rpc`` run in this order: OPTIONS → 204, other methods → 405, origin → 403, token
→ 401 (from the headers: no body byte of an unauthenticated request is read), body size → 413
(``Content-Length``, then the bytes as they arrive), JSON → 400. Everything after parsing is HTTP 200 (or 204 when nothing
will be answered), JSON-RPC errors included.

Imports ``bridge.*``, Starlette and sse-starlette only; knows nothing about sessions.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import itertools
import logging
import os
import re
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
from starlette.routing import Route
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

import bridge
from bridge.auth import Authenticator, OriginPolicy, rejection
from bridge.config import BridgeConfig
from bridge.connections import ConnectionGuard, connection_guard
from bridge.dialect import WsEditorFactory
from bridge.dispatch import CallContext, Dispatcher
from bridge.rpc import codec
from bridge.rpc.codec import Frame, parse_frame
from bridge.rpc.errors import InvalidRequest, LimitReached, NotFound, OriginNotAllowed, ParseError, Unauthorized
from bridge.rpc.stream import EnvelopeStream
from bridge.settings_page import settings_routes
from bridge.ws import AcpWebSocket, deny
from compat import tracing
from compat.telemetry import METRICS

log = logging.getLogger(__name__)

BANNER = "xworkmate-bridge is running"
BODY_READ_TIMEOUT = 30.0
"""Seconds allowed for reading a request body; a client that stalls mid-body gets 408."""
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
    editor: WsEditorFactory | None = None,
    a2a_app: Any = None,
) -> BridgeApp:
    """Build the bridge's ASGI app.

    Args:
        config: origins, tokens, limits and ``sse_keepalive`` (seconds) are read from it.
        dispatcher: serves every JSON-RPC frame, whatever the transport.
        lifespan: the caller's lifespan (e.g. starting the orchestrator); it is entered first and
            left last, around the task group that runs id-less requests in the background.
        bind_host: the address the server binds (default ``config.host``); with no token
            configured, requests are allowed only when it is loopback (or
            ``allowInsecureNoAuth``).
        mcp_app: an ASGI app served at ``/mcp`` behind the same origin and token checks.
        editor: builds the ACP agent for a WebSocket whose first message is an ACP
            ``initialize`` (docs/api.md "Editor mode").
        a2a_app: the A2A surface (``bridge.a2a_server.A2AApp``): its agent card is public, its
            other routes behind the same origin and token checks.
    """
    auth = Authenticator.from_config(config, bind_host=bind_host)
    origins = OriginPolicy(config.allowed_origins)
    connections = connection_guard(config)
    rpc = RpcEndpoint(dispatcher, auth, origins, config, connections)
    ws = AcpWebSocket(
        dispatcher,
        auth,
        origins,
        queue_size=config.limits.max_connection_queue,
        queue_bytes=config.limits.max_connection_queue_bytes,
        connections=connections,
        editor=editor,
    )
    routes = [  # "/acp/rpc" and "GET /acp" are not routes: BridgeApp sends them to their endpoints
        Route("/api/ping", ping, methods=["GET"]),
        Route("/", banner, methods=["GET"]),
    ]
    if mcp_app is not None:
        routes.append(Route("/mcp", Guarded(mcp_app, auth, origins, connections), methods=["GET", "POST", "DELETE"]))
    if a2a_app is not None:
        routes.extend(a2a_app.routes(lambda inner: Guarded(inner, auth, origins, connections)))
    from bridge.metrics import MetricsEndpoint  # prometheus-client itself loads with the first scrape

    metrics = MetricsEndpoint(frozenset(config.admin_principals), public=config.metrics_public)
    routes.append(Route("/metrics", metrics if config.metrics_public else Guarded(metrics, auth, origins, connections)))
    limit = config.limits.max_message_bytes  # GET /settings and its REST routes:
    routes.extend(settings_routes(dispatcher, lambda inner: Guarded(inner, auth, origins, connections), limit))
    handlers = {404: _http_error, 405: _http_error}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=rpc.lifespan(lifespan))
    app.router.redirect_slashes = False  # "/acp/rpc/" is 404 like any other path, not a redirect
    return BridgeApp(app, ws, connections, rpc)


class BridgeApp:
    """The bridge's ASGI app: ``GET /acp`` WebSockets and every ``/acp/rpc`` request go straight
    to their endpoints, everything else (lifespan, other paths: 404) to Starlette.

    A WebSocket's every frame would otherwise pass Starlette's exception handling, which wraps
    each ``send``: bench case 4 relays 5,000 updates a second on WebSockets, and with the
    WebSocket's own per-frame state checks (``bridge.ws.Connection``) those wrappers were a fifth
    of the bridge's time per update. ``/acp/rpc`` skips Starlette's middleware and router for
    bench case 2 (HTTP requests, target >= 0.5x the baseline server): with them the case measured
    0.44-0.56x; without them (and with the lighter body timeout below, a cached capabilities view
    and no span object when tracing is off) a request in-process fell from 50 to 27.5 us and the
    case measured 0.57-0.73x. Both endpoints answer their own failures (``RpcEndpoint`` every
    method: 405 and OPTIONS are its own). The path is matched as it is: the bridge is served
    with no ``root_path``.

    Attributes:
        starlette: the Starlette app behind it.
        connections: the limits met before the app (``bridge.connections``); ``bridge.server``
            gives uvicorn its protocol classes.
        on_stopping: run (in order) when the server begins to stop, before it closes connections
            (``bridge.server.BridgeServer.shutdown``): the orchestrator lets running turns end.
        stopping: set then; new requests are answered 503 (-32006) and closed.
    """

    def __init__(self, starlette: Starlette, acp: AcpWebSocket, connections: ConnectionGuard, rpc: RpcEndpoint) -> None:
        self.starlette = starlette
        self.connections = connections
        self._acp = acp
        self._rpc = rpc
        self.on_stopping: list[Callable[[], Awaitable[None]]] = []
        self.stopping = False

    async def stop(self) -> None:
        """The server begins to stop: refuse new requests, then run :attr:`on_stopping`."""
        self.stopping = True
        for hook in self.on_stopping:
            try:
                await hook()
            except Exception:
                log.exception("a shutdown hook failed")

    @property
    def router(self) -> Any:
        return self.starlette.router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.starlette(scope, receive, send)
            return
        if self.stopping and scope["type"] in ("http", "websocket"):
            error = LimitReached("the bridge is stopping; retry when it is back", limit="shutdown")
            if scope["type"] == "http":
                await rejection(503, error, {"Connection": "close", "Retry-After": "5"})(scope, receive, send)
            else:
                await deny(WebSocket(scope, receive, send), 503, error)
            return
        client = scope.get("client")
        self.connections.request_started(client)  # its headers are complete: no header timeout now
        if scope["type"] == "websocket":
            await (self._acp if scope["path"] == "/acp" else self.starlette)(scope, receive, send)
            return
        METRICS.connections.add(1, "http")
        try:
            await (self._rpc if scope["path"] == "/acp/rpc" else self.starlette)(scope, receive, send)
        finally:
            METRICS.connections.add(-1, "http")
            self.connections.request_ended(client)


async def banner(request: Request) -> Response:
    return PlainTextResponse(BANNER)


async def ping(request: Request) -> Response:
    return JSONResponse({**image_info(os.environ.get("IMAGE")), "buildDate": build_date()})


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


@functools.cache
def build_date() -> str:
    """``/api/ping``'s ``buildDate`` (the app's About page shows it): ``BUILD_DATE`` when set (an
    image's build sets it), else when this copy of the package was built or checked out (the
    modification time of ``bridge/__init__.py``), as ISO 8601 UTC (``2026-12-01T19:00:00Z``)."""
    if given := os.environ.get("BUILD_DATE", "").strip():
        return given[:64]
    try:
        stamp = os.stat(bridge.__file__).st_mtime
    except (OSError, TypeError):
        return ""
    return datetime.datetime.fromtimestamp(stamp, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    return frame, any(not isinstance(m, codec.Request) or not m.is_notification for m in frame.messages)


class RpcEndpoint:
    """``/acp/rpc`` for every method; also owns the task group for id-less requests."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        auth: Authenticator,
        origins: OriginPolicy,
        config: BridgeConfig,
        connections: ConnectionGuard,
    ) -> None:
        self._connections = connections
        self._dispatcher = dispatcher
        self._auth = auth
        self._origins = origins
        self._limit = config.limits.max_message_bytes
        self._queue_size = config.limits.max_connection_queue
        self._queue_bytes = config.limits.max_connection_queue_bytes
        self._keepalive = config.sse_keepalive
        self._background: TaskGroup | None = None

    def lifespan(self, outer: Lifespan | None) -> Lifespan:
        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[Any]:
            async with outer(app) if outer else nullcontext() as state, anyio.create_task_group() as tg:
                self._background = tg
                try:
                    yield state
                finally:
                    self._background = None
                    tg.cancel_scope.cancel()

        return lifespan

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        with tracing.parent_from(request.headers) if tracing.enabled() else nullcontext():
            response = await self.handle(request)
            await response(scope, receive, send)

    async def handle(self, request: Request) -> Response:
        origins = request.headers.getlist("origin")  # a request carrying two is judged by both
        origin = origins[0] if origins else None
        method = request.method
        headers = {"Vary": "Origin"}
        if origin and self._origins.allows(origin):
            headers.update(CORS_HEADERS, **{"Access-Control-Allow-Origin": origin})
        if method == "OPTIONS":
            return Response(status_code=204, headers=headers)
        if method != "POST":
            error = InvalidRequest("method not allowed")
            return rejection(405, error, {**headers, "Allow": "POST, OPTIONS"})
        if not self._origins.allows_all(origins):
            return rejection(403, OriginNotAllowed(f"origin not allowed: {origin}"[:300]), headers)
        return await self._post(request, headers)

    async def _post(self, request: Request, headers: dict[str, str]) -> Response:
        try:  # from the headers, before any body byte is read: an unauthenticated body is never buffered
            principal = self._auth.authenticate(request.headers.get("authorization"))
        except Unauthorized as exc:
            # Connection: close, so uvicorn does not read (and discard) the rest of the body
            return rejection(401, exc, {**headers, "WWW-Authenticate": "Bearer", "Connection": "close"})
        self._connections.authenticated(request.scope.get("client"))
        body = await self._read(request.receive, request.headers.get("content-length", ""), headers)
        if isinstance(body, Response):
            return body
        try:
            frame, reply_expected = parse_body(body)
        except ParseError as exc:
            return rejection(400, exc, headers)
        ctx = CallContext(
            principal, connection_id=f"http-{next(_ids)}", last_event_id=request.headers.get("last-event-id")
        )
        if not reply_expected:
            return self._detach(frame, ctx, headers)
        if "text/event-stream" in request.headers.get("accept", "").lower():
            from bridge.sse import SseReply  # sse-starlette: ~5 ms of the cold start, imported when first used

            return SseReply(
                self._dispatcher,
                frame,
                ctx,
                headers,
                keepalive=self._keepalive,
                queue_size=self._queue_size,
                queue_bytes=self._queue_bytes,
                connections=self._connections,
            )
        return await self._json(frame, ctx, headers)

    async def _read(self, receive: Receive, declared: str, headers: dict[str, str]) -> bytes | Response:
        """The body, or the response refusing it (413 too large, 408 stalled).

        ``asyncio.timeout`` rather than ``anyio.fail_after``: the bridge runs on asyncio only,
        and the anyio scope cost 9-18 us of a bench case 2 request against 4-9 us."""
        try:
            async with asyncio.timeout(BODY_READ_TIMEOUT):
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

    async def _json(self, body: Frame | bytes, ctx: CallContext, headers: dict[str, str]) -> Response:
        replies: list[bytes] = []  # ctx.notify discards: without SSE notifications have nowhere to go
        await self._dispatcher.run_frame(body, EnvelopeStream(replies.append), ctx)
        if not replies:
            return Response(status_code=204, headers=headers)
        return Response(replies[0], media_type="application/json", headers=headers)


class Guarded:
    """Wraps an ASGI app with the bridge's origin (403, -32003) and token (401, -32001) checks;
    the principal goes to the wrapped app as ``scope["state"]["principal"]``."""

    def __init__(self, app: Any, auth: Authenticator, origins: OriginPolicy, connections: ConnectionGuard) -> None:
        self._app, self._auth, self._origins, self._connections = app, auth, origins, connections

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        origin = request.headers.get("origin")
        if not self._origins.allows_all(request.headers.getlist("origin")):
            response = rejection(403, OriginNotAllowed(f"origin not allowed: {origin}"[:300]))
        else:
            try:
                principal = self._auth.authenticate(request.headers.get("authorization"))
            except Unauthorized as exc:
                response = rejection(401, exc, {"WWW-Authenticate": "Bearer"})
            else:
                self._connections.authenticated(scope.get("client"))
                scope.setdefault("state", {})["principal"] = principal  # the A2A tasks' owner
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
