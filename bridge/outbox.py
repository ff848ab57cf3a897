"""A connection's outbound queue, bounded by envelopes and by bytes (field-failures #7).

Producers (turns streaming updates) never wait on a client: ``offer`` either queues an envelope or
says the client is too far behind, and the transport drops that client. A byte bound rather than
only a count lets a fast reader absorb a burst of small updates while one slow reader of large
ones still cannot hold more than ``max_bytes`` of memory.

A deque and one asyncio future per wait-for-more rather than an anyio memory object stream:
the stream's receive (an anyio ``Event`` per wait, a checkpoint per item, task lookups) was a
quarter of the bridge's CPU per request in bench case 1 (py-spy, 10 connections, 1 in flight:
``MemoryObjectReceiveStream.receive`` 14%, ``checkpoint`` 5%, ``Event`` 3%). The bridge's
transports run on asyncio only (uvicorn).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator


class Outbox:
    """Encoded envelopes waiting for one connection's writer.

    Args:
        max_items: envelopes that may wait (``limits.maxConnectionQueue``).
        max_bytes: bytes that may wait (``limits.maxConnectionQueueBytes``).
    """

    __slots__ = ("_bytes", "_closed", "_max_bytes", "_max_items", "_queue", "_waiter")

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self._queue: deque[bytes] = deque()
        self._bytes = 0
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._queue)

    def offer(self, envelope: bytes) -> bool:
        """Queue ``envelope``; False when the client is too far behind (drop it). Offers after
        ``close`` are ignored (a turn may outlive its connection) and count as accepted."""
        if self._closed:
            return True
        if len(self._queue) >= self._max_items or self._bytes + len(envelope) > self._max_bytes:
            return False
        self._queue.append(envelope)
        self._bytes += len(envelope)
        self._wake()
        return True

    def take(self) -> list[bytes]:
        """Everything queued now, oldest first (possibly nothing)."""
        batch = list(self._queue)
        self._queue.clear()
        self._bytes = 0
        return batch

    def close(self) -> None:
        """No more envelopes: the writer drains what is queued, then its iteration ends."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def batches(self) -> AsyncIterator[list[bytes]]:
        """Everything queued at each wake-up, oldest first; ends once closed and drained.

        One envelope per wake-up yields to the event loop once per envelope, so a writer takes
        one envelope per loop pass while a turn reading a full pipe buffer from its agent queues
        hundreds (bench case 3: relay at about half the baseline's rate); a batch per wake-up
        lets the writer keep up.
        """
        while await self.wait():
            yield self.take()

    async def wait(self) -> bool:
        """Wait until something is queued (True) or the outbox is closed and drained (False)."""
        while not self._queue:
            if self._closed:
                return False
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return True
