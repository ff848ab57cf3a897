"""The SSE reply of ``POST /acp/rpc`` with ``Accept: text/event-stream`` (docs/api.md "HTTP";
xworkmate-original.md §3.3).

Imported by bridge.http_app when a client first asks for SSE, not at start (bench case 6).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import anyio
from sse_starlette import EventSourceResponse
from starlette.types import Receive, Scope, Send

from bridge.connections import ConnectionGuard
from bridge.dispatch import CallContext, Dispatcher
from bridge.outbox import Outbox
from bridge.rpc.codec import Frame
from bridge.rpc.stream import EnvelopeStream

log = logging.getLogger(__name__)


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
        self._ctx = CallContext(ctx.principal, self._stream.notify, ctx.connection_id)
        self._rpc_scope: anyio.CancelScope | None = None
        headers = {**headers, "Cache-Control": CACHE_CONTROL}
        super().__init__(_events(self._outbox), headers=headers, ping=keepalive, sep="\n")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._client = scope.get("client")
        async with anyio.create_task_group() as tg:
            self._rpc_scope = tg.cancel_scope
            tg.start_soon(self._produce)
            await super().__call__(scope, receive, send)
            tg.cancel_scope.cancel()

    async def _produce(self) -> None:
        try:
            await self._dispatcher.run_frame(self._frame, self._stream, self._ctx)
        finally:
            self._outbox.close()

    def _offer(self, envelope: bytes) -> None:
        if not self._outbox.offer(envelope):  # the client stopped reading: abort the response
            log.warning("%s: SSE client is not reading; dropping it", self._ctx.connection_id)
            self._outbox.close()  # later envelopes are ignored: one warning, not one per envelope
            if self._rpc_scope is not None:
                self._rpc_scope.cancel()
            if self._connections is not None:  # its unread bytes would hold the socket: abort it
                self._connections.abort_later(self._client, DROP_ABORT_AFTER)


async def _events(outbox: Outbox) -> AsyncIterator[bytes]:
    async for batch in outbox.batches():  # one body chunk per batch: a send costs more than its bytes
        yield b"".join(b"data: " + envelope + b"\n\n" for envelope in batch)
    yield b"data: [DONE]\n\n"
