"""The SSE reply of ``POST /acp/rpc`` with ``Accept: text/event-stream`` (docs/api.md "HTTP";
xworkmate-original.md §3.3).

Imported by bridge.http_app when a client first asks for SSE, not at start (bench case 6).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from sse_starlette import EventSourceResponse
from sse_starlette.sse import AppStatus
from starlette.types import Receive, Scope, Send

from bridge.connections import ConnectionGuard
from bridge.dispatch import CallContext, Dispatcher, run_closers
from bridge.outbox import Outbox
from bridge.rpc.codec import Frame
from bridge.rpc.stream import EnvelopeStream
from compat.telemetry import METRICS

log = logging.getLogger(__name__)

# sse-starlette ends every stream as soon as uvicorn is told to exit; the bridge ends its own: its
# running turns get shutdownGrace, then each SSE response ends with its result and [DONE]
# (bridge.server.BridgeServer.shutdown). Streams still open after that are cut by uvicorn's
# graceful-shutdown timeout.
AppStatus.disable_automatic_graceful_drain()


DROP_ABORT_AFTER = 5.0  # seconds after a slow client is dropped until its socket is aborted
CACHE_CONTROL = "no-cache, no-transform"
"""Proxies and CDNs that transform responses (compression, buffering) hold an event stream back
unless told ``no-transform``; sse-starlette's own ``no-store`` does not say it. sse-starlette also
sends ``X-Accel-Buffering: no`` (nginx)."""


class SseReply(EventSourceResponse):
    """An SSE response: the request's notifications as they happen, then its reply (or the batch
    array), then ``data: [DONE]``; a comment line every ``keepalive`` seconds keeps idle streams
    open (xworkmate-original.md §3.3). ``seq`` counts from 0 within the response.

    A client that stops reading overflows the bounded queue and the response is aborted; a client
    that disconnects cancels the request's handlers.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        frame: Frame | bytes,
        ctx: CallContext,
        headers: dict[str, str],
        *,
        keepalive: float,
        queue_size: int,
        queue_bytes: int = 16 * 1024 * 1024,
        connections: ConnectionGuard | None = None,
    ) -> None:
        self._connections = connections
        self._client: object = None
        self._dispatcher, self._frame = dispatcher, frame
        self._outbox = Outbox(queue_size, queue_bytes)
        self._stream = EnvelopeStream(self._offer)
        self._event_id: bytes | None = None  # the id: of the envelope being offered
        self._closers: list[Callable[[], None]] = []
        self._ctx = CallContext(
            ctx.principal,
            self._notify,
            ctx.connection_id,
            closers=self._closers,
            backlog=lambda: self._outbox.buffered_bytes,
            until_idle=True,
            last_event_id=ctx.last_event_id,
        )
        self._rpc_scope: anyio.CancelScope | None = None
        headers = {**headers, "Cache-Control": CACHE_CONTROL}
        super().__init__(_events(self._outbox), headers=headers, ping=keepalive, sep="\n")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._client = scope.get("client")
        METRICS.connections.add(1, "sse")
        try:
            async with anyio.create_task_group() as tg:
                self._rpc_scope = tg.cancel_scope
                tg.start_soon(self._produce)
                await super().__call__(scope, receive, send)
                tg.cancel_scope.cancel()
        finally:
            METRICS.connections.add(-1, "sse")

    async def _produce(self) -> None:
        try:
            await self._dispatcher.run_frame(self._frame, self._stream, self._ctx)
        finally:
            run_closers(self._closers)
            self._outbox.close()

    def _notify(self, method: str, params: Any) -> None:
        """A ``session.update`` event carries ``id: <sessionId>:<seq>``, which a client that lost
        the stream sends back as ``Last-Event-ID`` with ``session.subscribe``."""
        if method == "session.update" and isinstance(params, dict):
            event_id = f"{params.get('sessionId', '')}:{params.get('seq', '')}"
            self._event_id = event_id.translate(_NO_LINE_BREAKS).encode()
        self._stream.notify(method, params)

    def _offer(self, envelope: bytes) -> None:
        event_id, self._event_id = self._event_id, None
        event = (b"id: " + event_id + b"\n" if event_id else b"") + b"data: " + envelope + b"\n\n"
        if not self._outbox.offer(event):  # the client stopped reading: abort the response
            log.warning("%s: SSE client is not reading; dropping it", self._ctx.connection_id)
            self._outbox.close()  # later envelopes are ignored: one warning, not one per envelope
            if self._rpc_scope is not None:
                self._rpc_scope.cancel()
            if self._connections is not None:  # its unread bytes would hold the socket: abort it
                self._connections.abort_later(self._client, DROP_ABORT_AFTER)


_NO_LINE_BREAKS = {ord("\r"): None, ord("\n"): None, ord("\0"): None}


async def _events(outbox: Outbox) -> AsyncIterator[bytes]:
    async for batch in outbox.batches():  # one body chunk per batch: a send costs more than its bytes
        yield b"".join(batch)
    yield b"data: [DONE]\n\n"
