"""A bridge session: its owner, provider session, turn queue and ordered update log.

One turn runs at a time per session; further ``session.message`` calls wait in a FIFO queue
(bounded, then -32005 ``queue_full``). Admission is synchronous so requests are queued in the order
they were read (docs/api.md "Precise rules": requests are admitted in order, then run concurrently).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
import msgspec

from bridge.rpc.codec import dumps, loads
from bridge.rpc.errors import SessionBusy
from compat.base import ProviderSession

Subscriber = Callable[[dict[str, Any]], None]


class UpdateLog:
    """The per-session ordered log of ``session.update`` params.

    ``seq`` starts at 1, strictly increases and is never reset (not even by ``session.start``).
    The last ``capacity`` updates (at most ``max_bytes`` of their JSON) are kept so a later
    subscriber can resume from a given ``seq``.

    They are kept encoded: bytes are invisible to the garbage collector, while a deque of update
    dicts per session kept every streamed chunk alive through the young generations. With 100
    sessions streaming (bench case 4) that drove full collections of ~25-40 ms each, and every
    chunk in flight waited for them.
    """

    def __init__(self, capacity: int = 256, max_bytes: int = 128 * 1024) -> None:
        self._seq = 0
        self._recent: deque[tuple[int, bytes]] = deque()  # (seq, the update's JSON)
        self._capacity = capacity
        self._max_bytes = max_bytes
        self._bytes = 0
        self._subscribers: list[Subscriber] = []

    @property
    def last_seq(self) -> int:
        return self._seq

    def append(self, params: dict[str, Any]) -> dict[str, Any]:
        self._seq += 1
        params["seq"] = self._seq
        # A copy of exactly the encoded length: orjson (3.12+) returns its working buffer
        # unshrunk, 4 KiB for a 150-byte chunk update, so the log held about 30 times its
        # ``max_bytes`` (bench case 4: RSS grew 21 MB/s, ~1 MiB per streaming session).
        encoded = bytes(memoryview(dumps(params)))
        self._recent.append((self._seq, encoded))
        self._bytes += len(encoded)
        # The newest update always stays, even one larger than max_bytes on its own.
        while len(self._recent) > 1 and (len(self._recent) > self._capacity or self._bytes > self._max_bytes):
            self._bytes -= len(self._recent.popleft()[1])
        for subscriber in tuple(self._subscribers):
            subscriber(params)
        return params

    def subscribe(self, subscriber: Subscriber, after_seq: int | None = None) -> Callable[[], None]:
        """Deliver updates after ``after_seq`` (replayed from the kept ones), then live ones.

        Returns:
            A function that ends the subscription.
        """
        if after_seq is not None:
            for seq, encoded in tuple(self._recent):
                if seq > after_seq:
                    subscriber(loads(encoded))
        self._subscribers.append(subscriber)
        return lambda: self._subscribers.remove(subscriber) if subscriber in self._subscribers else None


class Ticket(msgspec.Struct, eq=False):
    """A turn's place in its session's queue."""

    ready: anyio.Event = msgspec.field(default_factory=anyio.Event)
    cancelled: bool = False


class Session(msgspec.Struct, eq=False):
    session_id: str
    owner: str
    thread_id: str
    max_queued: int = 16
    created_at: float = msgspec.field(default_factory=time.time)
    provider_id: str | None = None
    provider_session: ProviderSession | None = None
    working_directory: str | None = None
    history: deque[tuple[str, str]] = msgspec.field(default_factory=lambda: deque(maxlen=50))
    log: UpdateLog = msgspec.field(default_factory=UpdateLog)
    permissions: dict[str, Any] = msgspec.field(default_factory=dict)  # requestId → PendingPermission
    current_turn: Any = None  # the running TurnRunner, if any
    _active: Ticket | None = None
    _waiting: deque[Ticket] = msgspec.field(default_factory=deque)

    last_active: float = msgspec.field(default_factory=time.monotonic)

    @property
    def busy(self) -> bool:
        return self._active is not None or bool(self._waiting)

    def cancel_active(self) -> bool:
        """Cancel the admitted turn that has not started its provider turn yet (it may be waiting
        for a probe or for the previous agent to end). Returns whether there was one."""
        if self._active is None or self.current_turn is not None or self._active.cancelled:
            return False
        self._active.cancelled = True
        return True

    def admit(self, *, start: bool) -> Ticket:
        """Take a place for one turn. Synchronous, so admission follows arrival order.

        Raises:
            SessionBusy: -32005 with ``data.reason`` ``turn_running`` (``session.start`` while a
                turn runs or waits) or ``queue_full`` (more than ``max_queued`` waiting).
        """
        self.last_active = time.monotonic()
        if self._active is None:
            ticket = Ticket()
            ticket.ready.set()
            self._active = ticket
            return ticket
        if start:
            raise SessionBusy("a turn is running on this session", reason="turn_running", sessionId=self.session_id)
        if len(self._waiting) >= self.max_queued:
            raise SessionBusy("the session's turn queue is full", reason="queue_full", sessionId=self.session_id)
        ticket = Ticket()
        self._waiting.append(ticket)
        return ticket

    def release(self, ticket: Ticket) -> None:
        """Give up a place (finished, cancelled or abandoned); wakes the next waiting turn."""
        self.last_active = time.monotonic()
        if ticket is not self._active:
            if ticket in self._waiting:
                self._waiting.remove(ticket)
            return
        self._active = None
        while self._waiting:
            nxt = self._waiting.popleft()
            if nxt.cancelled:
                nxt.ready.set()
                continue
            self._active = nxt
            nxt.ready.set()
            return

    def cancel_waiting(self) -> int:
        """Mark every queued turn cancelled and wake it; returns how many there were."""
        count = 0
        for ticket in self._waiting:
            ticket.cancelled = True
            ticket.ready.set()
            count += 1
        self._waiting.clear()
        return count

    def record(self, role: str, text: str) -> None:
        self.history.append((role, text))
