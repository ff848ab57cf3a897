"""``GET /acp``: one WebSocket connection is one stream of JSON-RPC frames (docs/api.md
"WebSocket"; field-failures.md #4, #5, #7, #8).

The upgrade is refused before ``accept`` with an HTTP status and a JSON error body (403 origin,
401 token). After that, each text frame goes to ``Dispatcher.serve_frame``; requests run
concurrently in a task group owned by the connection and cancelled when the socket closes.
Every outbound envelope (a reply, a turn's update) waits in one bounded queue, and one writer task
sends them in the order they were numbered, so ``seq`` order is wire order and a client that stops
reading is dropped instead of stalling the handlers that notify it. Frame size limits and pings
are uvicorn's (``ws_max_size``, ``ws_ping_interval``; see ``bridge.server``).

Imports ``bridge.*`` and Starlette only; knows nothing about sessions.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

import anyio
import anyio.abc
import starlette.websockets
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from bridge.auth import Authenticator, OriginPolicy, rejection
from bridge.connections import ConnectionGuard
from bridge.dialect import WsEditorFactory, is_acp_initialize
from bridge.dispatch import CallContext, Dispatcher, run_closers
from bridge.outbox import Outbox
from bridge.rpc.codec import Reply
from bridge.rpc.errors import InvalidRequest, OriginNotAllowed, RpcError, Unauthorized
from bridge.rpc.stream import EnvelopeStream
from compat.telemetry import METRICS

log = logging.getLogger(__name__)

CLOSE_TIMEOUT = 1.0
"""Seconds to wait for the close frame to go out to a client that may have stopped reading."""
DROP_ABORT_AFTER = 5.0
"""Seconds after a slow client is dropped until its socket is aborted if still open."""
CLOSE_OVERFLOW = 1013  # "try again later": the client did not read fast enough (RFC 6455 §7.4)

# Sending after a close raises this RuntimeError subclass, not WebSocketDisconnect (field-failures
# #5); older Starlette releases raise a bare RuntimeError.
_Disconnected = getattr(starlette.websockets, "WebSocketDisconnected", RuntimeError)
_SEND_FAILURES = (WebSocketDisconnect, _Disconnected, OSError)
_PEER_GONE = (*_SEND_FAILURES, RuntimeError)
"""What a send raises once the peer is gone. RuntimeError: uvicorn's raw ASGI send after it already
closed the socket (a frame with invalid UTF-8 right behind a request makes it send close 1007)."""
_ids = itertools.count(1)
_EMPTY_REFUSED = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error: empty frame"}}'
_BINARY_REFUSED = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request: binary frames are not supported; send text"}}'


class AcpWebSocket:
    """The ``/acp`` endpoint: admission, then one ``Connection`` per accepted socket.

    Args:
        dispatcher: runs the frames.
        auth: token check; the principal goes into every request's ``CallContext``.
        origins: the ``Origin`` allowlist, checked before the token.
        queue_size: outbound envelopes buffered per connection (``limits.max_connection_queue``).
        connections: told of each valid token, and asked to abort a dropped client's socket
            :data:`DROP_ABORT_AFTER` seconds later (``bridge.connections``).
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        auth: Authenticator,
        origins: OriginPolicy,
        *,
        queue_size: int,
        queue_bytes: int = 16 * 1024 * 1024,
        connections: ConnectionGuard | None = None,
        editor: WsEditorFactory | None = None,
    ) -> None:
        self._editor = editor
        self._dispatcher = dispatcher
        self._auth = auth
        self._origins = origins
        self._queue_size = queue_size
        self._queue_bytes = queue_bytes
        self._connections = connections

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.serve(WebSocket(scope, receive, send), receive, send)

    async def serve(self, websocket: WebSocket, receive: Receive | None = None, send: Send | None = None) -> None:
        """Admit (403 origin, then 401 token) and serve one socket until it closes; once accepted,
        frames go through the ASGI ``receive``/``send`` when given (see ``Connection``)."""
        origin = websocket.headers.get("origin")
        if not self._origins.allows_all(websocket.headers.getlist("origin")):
            await deny(websocket, 403, OriginNotAllowed(f"origin not allowed: {origin}"[:300]))
            return
        try:
            principal, subprotocol = self._auth.authenticate_websocket(
                websocket.headers.get("authorization"), websocket.scope.get("subprotocols", ())
            )
        except Unauthorized as exc:
            await deny(websocket, 401, exc, {"WWW-Authenticate": "Bearer"})
            return
        client = websocket.scope.get("client")
        guard = self._connections
        if guard is not None:
            guard.authenticated(client)
        await websocket.accept(subprotocol=subprotocol)
        connection = Connection(
            websocket,
            self._dispatcher,
            principal,
            queue_size=self._queue_size,
            queue_bytes=self._queue_bytes,
            receive=receive,
            send=send,
            on_drop=(lambda: guard.abort_later(client, DROP_ABORT_AFTER)) if guard is not None else None,
            editor=self._editor,
        )
        await connection.run()


async def deny(websocket: WebSocket, status: int, error: RpcError, headers: dict[str, str] | None = None) -> None:
    """Refuse the upgrade with ``status`` and a JSON envelope body (ASGI denial-response
    extension); servers without it can only answer a bare 403."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(rejection(status, error, headers))
    else:
        await websocket.close(1008)


class Connection:
    """One accepted socket: a reader loop, a bounded outbound queue and one writer task.

    Args:
        websocket: an accepted Starlette WebSocket.
        dispatcher: runs each text frame.
        principal: the authenticated name, passed to handlers.
        queue_size: outbound envelopes that may wait for the writer; one more drops the client
            with close code 1013.
        queue_bytes: outbound bytes that may wait (``limits.maxConnectionQueueBytes``).
        receive, send: the connection's ASGI callables, for frames once it is accepted (default:
            the WebSocket's own). Starlette's wrappers re-check the connection's state on every
            frame and pass each send through its exception handling: bench case 4 relays 5,000
            updates a second, and those wrappers were a fifth of the bridge's time per update.
        on_drop: called when the client is dropped for not reading.
        editor: builds the ACP agent that serves the socket when its first text frame is an ACP
            ``initialize``; its turns keep running when the socket goes, as the app's do.
    """

    def __init__(
        self,
        websocket: WebSocket,
        dispatcher: Dispatcher,
        principal: str,
        *,
        queue_size: int,
        queue_bytes: int = 16 * 1024 * 1024,
        receive: Receive | None = None,
        send: Send | None = None,
        on_drop: Callable[[], None] | None = None,
        editor: WsEditorFactory | None = None,
    ) -> None:
        self._on_drop = on_drop
        self._editor = editor
        self._principal = principal
        self._ws = websocket
        self._receive = receive or websocket.receive
        self._send = send or websocket.send
        self._dispatcher = dispatcher
        self._outbox = Outbox(queue_size, queue_bytes)
        self._stream = EnvelopeStream(self._enqueue)
        self._closers: list[Callable[[], None]] = []
        self._ctx = CallContext(
            principal,
            self._stream.notify,
            f"ws-{next(_ids)}",
            closers=self._closers,
            backlog=lambda: self._outbox.buffered_bytes,
        )
        self._scope = anyio.CancelScope()
        self._close_code: int | None = None

    async def run(self) -> None:
        """Serve until the peer leaves or is dropped; in-flight handlers are then cancelled, and
        the connection's subscriptions end."""
        METRICS.connections.add(1, "websocket")
        try:
            with self._scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._write_loop)
                    await self._read_loop(tg)
                    tg.cancel_scope.cancel()
        finally:
            METRICS.connections.add(-1, "websocket")
            run_closers(self._closers)
        self._outbox.close()
        if self._close_code is not None:
            await self._close(self._close_code)

    async def _read_loop(self, tg: anyio.abc.TaskGroup) -> None:
        first = True
        while True:
            message = await self._receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:  # a binary frame: answer it and keep the socket (field-failures #4)
                error = InvalidRequest("Invalid Request: binary frames are not supported; send text")
                self._stream.reply(Reply.from_error(None, error))
                continue
            if first and self._editor is not None and is_acp_initialize(text):
                await self._serve_editor(text, tg)
                return
            first = False
            self._dispatcher.serve_frame(text, self._stream, self._ctx, tg)

    async def _serve_editor(self, first: str, tg: anyio.abc.TaskGroup) -> None:
        """The ACP dialect (docs/api.md "Editor mode"): each text frame is one plain JSON-RPC
        message for the agent, each of its lines one frame back."""
        assert self._editor is not None
        agent = self._editor(
            self._write_line, lambda: self._outbox.buffered_bytes, self._principal, self._ctx.connection_id
        )
        self._closers.extend([lambda: run_closers(agent.closers)])
        await tg.start(agent.run)
        agent.feed(first.encode())
        while True:
            message = await self._receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                self._enqueue(_BINARY_REFUSED)
                continue
            if not text.strip():  # field-failures #4: an empty frame is not JSON
                self._enqueue(_EMPTY_REFUSED)
                continue
            await agent.room()  # a pipelining editor waits in its socket
            agent.feed(text.encode())

    def _write_line(self, line: bytes) -> None:
        self._enqueue(line.removesuffix(b"\n"))

    async def _write_loop(self) -> None:
        try:
            async for batch in self._outbox.batches():
                for envelope in batch:  # the send waits only while the socket's buffer is full
                    await self._send({"type": "websocket.send", "text": envelope.decode()})
        except _PEER_GONE as exc:  # the error's text shows, should a RuntimeError be a bug of ours
            log.info("%s: peer left while sending (%s: %s); stopping", self._ctx.connection_id, type(exc).__name__, exc)
            self._scope.cancel()

    def _enqueue(self, envelope: bytes) -> None:
        """The stream's sink: never blocks the handler that produced ``envelope``."""
        if not self._outbox.offer(envelope):
            log.warning("%s: client is not reading; dropping it", self._ctx.connection_id)
            self._close_code = CLOSE_OVERFLOW
            self._outbox.close()
            self._scope.cancel()
            if self._on_drop is not None:  # the close frame may never leave: the socket is aborted
                self._on_drop()

    async def _close(self, code: int) -> None:
        # The client is not reading, so the close frame may never leave: bounded, and shielded
        # because this is teardown.
        with anyio.move_on_after(CLOSE_TIMEOUT, shield=True):
            try:
                await self._ws.close(code)
            except _SEND_FAILURES:
                pass
