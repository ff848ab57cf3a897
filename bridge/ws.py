"""``GET /acp``: one WebSocket connection is one stream of JSON-RPC frames (docs/api.md
"WebSocket"; field-failures.md #4, #5, #7, #8).

The upgrade is refused before ``accept`` with an HTTP status and a JSON error body (403 origin,
401 token). After that, each text frame goes to ``Dispatcher.serve_frame``; requests run
concurrently in a task group owned by the connection and cancelled when the socket closes.
Outbound envelopes wait in a bounded queue, so a client that stops reading is dropped instead of
stalling the handlers that notify it. The reader sends what a frame's immediate methods answer
before it reads the next frame; a writer task sends what other tasks (turns) queue; one sends at a
time, so ``seq`` order is wire order. Frame size limits and pings are uvicorn's (``ws_max_size``,
``ws_ping_interval``; see ``bridge.server``).

Imports ``bridge.*`` and Starlette only; knows nothing about sessions.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Coroutine
from typing import Any

import anyio
import starlette.websockets
from anyio.abc import TaskGroup
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from bridge.auth import Authenticator, OriginPolicy, rejection
from bridge.dispatch import CallContext, Dispatcher
from bridge.outbox import Outbox
from bridge.rpc.codec import Reply
from bridge.rpc.errors import InvalidRequest, OriginNotAllowed, RpcError, Unauthorized
from bridge.rpc.stream import EnvelopeStream

log = logging.getLogger(__name__)

CLOSE_TIMEOUT = 1.0
"""Seconds to wait for the close frame to go out to a client that may have stopped reading."""
CLOSE_OVERFLOW = 1013  # "try again later": the client did not read fast enough (RFC 6455 §7.4)

# Sending after a close raises this RuntimeError subclass, not WebSocketDisconnect (field-failures
# #5); older Starlette releases raise a bare RuntimeError.
_Disconnected = getattr(starlette.websockets, "WebSocketDisconnected", RuntimeError)
_SEND_FAILURES = (WebSocketDisconnect, _Disconnected, OSError)
_PEER_GONE = (*_SEND_FAILURES, RuntimeError)
"""What a send raises once the peer is gone. RuntimeError: uvicorn's raw ASGI send after it already
closed the socket (a frame with invalid UTF-8 right behind a request makes it send close 1007)."""
_ids = itertools.count(1)


class AcpWebSocket:
    """The ``/acp`` endpoint: admission, then one ``Connection`` per accepted socket.

    Args:
        dispatcher: runs the frames.
        auth: token check; the principal goes into every request's ``CallContext``.
        origins: the ``Origin`` allowlist, checked before the token.
        queue_size: outbound envelopes buffered per connection (``limits.max_connection_queue``).
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        auth: Authenticator,
        origins: OriginPolicy,
        *,
        queue_size: int,
        queue_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self._dispatcher = dispatcher
        self._auth = auth
        self._origins = origins
        self._queue_size = queue_size
        self._queue_bytes = queue_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.serve(WebSocket(scope, receive, send), receive, send)

    async def serve(self, websocket: WebSocket, receive: Receive | None = None, send: Send | None = None) -> None:
        """Admit (403 origin, then 401 token) and serve one socket until it closes; frames then
        go through the raw ASGI ``receive``/``send`` when given (see ``Connection``)."""
        origin = websocket.headers.get("origin")
        if not self._origins.allows_all(websocket.headers.getlist("origin")):
            await _deny(websocket, 403, OriginNotAllowed(f"origin not allowed: {origin}"[:300]))
            return
        try:
            principal, subprotocol = self._auth.authenticate_websocket(
                websocket.headers.get("authorization"), websocket.scope.get("subprotocols", ())
            )
        except Unauthorized as exc:
            await _deny(websocket, 401, exc, {"WWW-Authenticate": "Bearer"})
            return
        await websocket.accept(subprotocol=subprotocol)
        connection = Connection(
            websocket,
            self._dispatcher,
            principal,
            queue_size=self._queue_size,
            queue_bytes=self._queue_bytes,
            receive=receive,
            send=send,
        )
        await connection.run()


async def _deny(websocket: WebSocket, status: int, error: RpcError, headers: dict[str, str] | None = None) -> None:
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
        receive, send: the socket's raw ASGI callables, for frames once accepted (default: the
            WebSocket's own). Starlette's wrappers re-check the handshake state on every frame,
            ~1 us per request of the bridge's ~20 in bench case 1; uvicorn still raises on a send
            after the peer left (``ClientDisconnected``, an ``OSError``).
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
    ) -> None:
        self._ws = websocket
        self._receive = receive or websocket.receive
        self._send = send or websocket.send
        self._dispatcher = dispatcher
        self._outbox = Outbox(queue_size, queue_bytes)
        self._stream = EnvelopeStream(self._enqueue)
        self._ctx = CallContext(principal, self._stream.notify, f"ws-{next(_ids)}")
        self._scope = anyio.CancelScope()
        self._close_code: int | None = None
        # One sender at a time keeps seq order on the wire: the reader (for what a frame's immediate
        # methods answer) or the writer task (for everything else). Set while nobody sends.
        self._idle = asyncio.Event()
        self._idle.set()
        self._direct: list[bytes] | None = None  # see _read_loop
        self._tg: TaskGroup | None = None  # while the connection runs

    async def run(self) -> None:
        """Serve until the peer leaves or is dropped; in-flight handlers are then cancelled."""
        with self._scope:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._write_loop)
                await self._read_loop(tg)
                tg.cancel_scope.cancel()
        self._tg = None
        self._outbox.close()
        if self._close_code is not None:
            await self._close(self._close_code)

    async def _read_loop(self, tg: TaskGroup) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:  # a binary frame: answer it and keep the socket (field-failures #4)
                error = InvalidRequest("Invalid Request: binary frames are not supported; send text")
                self._stream.reply(Reply.from_error(None, error))
                continue
            # What this frame's immediate methods (acp.capabilities, session.cancel) answer goes
            # from the handler straight to the socket when nothing else is being sent or waits:
            # through the queue and the writer task it cost a task switch and two queue
            # operations per request, a third of the bridge's CPU per request in bench case 1.
            self._direct = direct = []
            try:
                self._dispatcher.serve_frame(text, self._stream, self._ctx, tg)
            finally:
                self._direct = None
            if not direct:
                continue
            if not self._idle.is_set() or len(self._outbox):
                for envelope in direct:  # behind what was numbered before them
                    self._enqueue(envelope)
            else:
                await self._send_all(direct)

    async def _write_loop(self) -> None:
        while await self._outbox.wait():
            if not self._idle.is_set():  # the reader is sending; it also sends what is queued meanwhile
                await self._idle.wait()
            else:
                await self._send_all()

    async def _send_all(self, first: list[bytes] | None = None) -> None:
        """Send ``first``, then everything queued, including what is queued meanwhile."""
        self._idle.clear()
        batch = first or self._outbox.take()
        try:
            while batch:
                for envelope in batch:  # uvicorn's send waits only when the socket buffer is full
                    await self._send({"type": "websocket.send", "text": envelope.decode()})
                batch = self._outbox.take()
        except _PEER_GONE:
            self._peer_left()
        finally:
            self._idle.set()

    def _peer_left(self) -> None:
        log.info("%s: peer left while sending; stopping", self._ctx.connection_id)
        self._scope.cancel()

    def _enqueue(self, envelope: bytes) -> None:
        """The stream's sink: never blocks the handler that produced ``envelope``."""
        if self._direct is not None:  # the reader sends it once the frame's handlers return
            self._direct.append(envelope)
        elif self._idle.is_set() and not len(self._outbox) and self._tg is not None:
            self._send_now(envelope, self._tg)
        elif not self._outbox.offer(envelope):
            log.warning("%s: client is not reading; dropping it", self._ctx.connection_id)
            self._close_code = CLOSE_OVERFLOW
            self._outbox.close()
            self._scope.cancel()

    def _send_now(self, envelope: bytes, tg: TaskGroup) -> None:
        """Send ``envelope`` from the caller, as far as the send goes without waiting.

        uvicorn's send waits only while the socket's buffer is full, so nearly always it runs to
        its end in one step, like a Python 3.12 eager task. Through the queue and the writer task
        every streamed update cost one more pass of the event loop and a task switch (bench case
        4, 100 paced sessions: server CPU 28-31%, 24-26% sending so, 21-23% with the pushed
        agent lines of compat._lines too). When the send does wait, a task finishes it and the
        writer sends what was queued meanwhile, in order, once it is done; the connection's end
        cancels it.
        """
        self._idle.clear()
        send = self._send({"type": "websocket.send", "text": envelope.decode()})
        try:
            awaited = send.send(None)
        except StopIteration:  # sent: the usual case
            self._idle.set()
            return
        except BaseException as exc:
            self._idle.set()  # whatever failed, the writer must never wait for this send
            if not isinstance(exc, _PEER_GONE):
                raise
            self._peer_left()
            return
        tg.start_soon(self._finish_send, send, awaited)

    async def _finish_send(self, send: Coroutine[Any, Any, None], awaited: Any) -> None:
        try:
            await _resume(send, awaited)
        except _PEER_GONE:
            self._peer_left()
        finally:
            self._idle.set()

    async def _close(self, code: int) -> None:
        # The client is not reading, so the close frame may never leave: bounded, and shielded
        # because this is teardown.
        with anyio.move_on_after(CLOSE_TIMEOUT, shield=True):
            try:
                await self._ws.close(code)
            except _SEND_FAILURES:
                pass


async def _resume(coroutine: Coroutine[Any, Any, None], awaited: Any) -> None:
    """Run ``coroutine``, stopped after yielding ``awaited`` to its first caller, to its end.

    ``awaited`` is what an ``await`` inside it handed to the event loop: an asyncio future to
    wait for, or None for one pass of the loop. The future is waited for with ``asyncio.wait``,
    not awaited: its ``await`` already started inside the coroutine (a second one raises "await
    wasn't used with future"), and resuming the coroutine finishes that ``await``, with the
    future's result or exception where the coroutine expects it. Should waiting fail
    (cancelled), the coroutine is closed, so its ``finally`` blocks run.
    """
    try:
        while True:
            if awaited is None:
                await asyncio.sleep(0)
            else:
                await asyncio.wait((awaited,))
            awaited = coroutine.send(None)
    except StopIteration:
        pass
    finally:
        coroutine.close()
