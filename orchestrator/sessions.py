"""Bridge sessions: who owns each, its provider session, its turn queue, its ordered update log and
the provider session's state; and the table that holds them, bounded and evicting idle ones.

One turn runs at a time per session; further ``session.message`` calls wait in a FIFO queue
(bounded, then -32005 ``queue_full``). Admission is synchronous so requests are queued in the order
they were read (docs/api.md "Precise rules": requests are admitted in order, then run concurrently).

Must not import: ``bridge`` (except ``bridge.rpc``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import anyio

from bridge.rpc.codec import dumps, loads
from bridge.rpc.errors import LimitReached, SessionBusy
from compat.base import ProviderSession
from orchestrator.machine import Trigger

log = logging.getLogger(__name__)
Subscriber = Callable[[dict[str, Any]], None]
HISTORY_KEPT = 50  # (role, text) entries per session


class QueuedTurn(Protocol):
    """What a session needs of the turns it queues (``orchestrator.turn.Turn``)."""

    ended: anyio.Event

    @property
    def stopping(self) -> bool:
        """A stop was asked and the turn is ending."""
        ...

    def stop(self, trigger: Trigger) -> bool: ...


class PendingPermission:
    """A permission request forwarded to the client (policy ``ask``), until it is answered."""

    __slots__ = ("answered", "option_id", "option_ids")

    def __init__(self, option_ids: frozenset[str]) -> None:
        self.option_ids = option_ids
        self.answered = anyio.Event()
        self.option_id: str | None = None

    def answer(self, option_id: str | None) -> None:
        if not self.answered.is_set():
            self.option_id = option_id
            self.answered.set()


class UpdateLog:
    """The per-session ordered log of ``session.update`` params.

    ``seq`` starts at 1, strictly increases and is never reset (not even by ``session.start``).
    The last ``capacity`` updates (at most ``max_bytes`` of their JSON) are kept so a later
    subscriber can resume from a given ``seq``.

    They are kept encoded: bytes are invisible to the garbage collector, while a deque of update
    dicts per session kept every streamed chunk alive through the young generations (bench case 4:
    full collections of 25-40 ms with 100 sessions streaming).
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
        """Number ``params`` (``seq``), keep it, and hand it to the subscribers; returns it."""
        self._seq += 1
        params["seq"] = self._seq
        # A copy of exactly the encoded length: orjson returns its working buffer unshrunk (4 KiB
        # for a 150-byte update), so the log would hold about 30 times its ``max_bytes``.
        encoded = bytes(memoryview(dumps(params)))
        self._recent.append((self._seq, encoded))
        self._bytes += len(encoded)
        # The newest update always stays, even one larger than max_bytes on its own.
        while len(self._recent) > 1 and (len(self._recent) > self._capacity or self._bytes > self._max_bytes):
            self._bytes -= len(self._recent.popleft()[1])
        if self._subscribers:
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


class Session:
    """One bridge session.

    Args:
        session_id: the client's ``sessionId``.
        owner: the principal (token name) that created it; no other may see it.
        thread_id: the client's ``threadId`` (default ``sessionId``).
        max_queued: ``limits.maxQueuedTurns``.
    """

    def __init__(self, session_id: str, owner: str, thread_id: str, *, max_queued: int = 16) -> None:
        self.session_id = session_id
        self.owner = owner
        self.thread_id = thread_id
        self.max_queued = max_queued
        self.created_at = time.time()
        self.last_active = time.monotonic()
        self.provider_id: str | None = None
        self.provider_session: ProviderSession | None = None
        self.working_directory: str | None = None
        self.attachment_folders: list[tuple[str, str]] = []  # (cwd, turnId) of inline attachments written
        self._history: deque[tuple[str, str]] = deque(maxlen=HISTORY_KEPT)
        self._amend: Callable[[deque[tuple[str, str]]], None] | None = None
        self.log = UpdateLog()
        self.permissions: dict[str, PendingPermission] = {}  # requestId → a pending ``ask``
        self.state: dict[str, dict[str, Any] | None] = {}
        """The provider session's state: the latest data of each session-level kind (ACP
        ``available_commands_update`` …), whenever it arrived."""
        self.state_unsent: set[str] = set()
        """State kinds that changed while no turn streamed: sent at the start of the next turn."""
        self.active: QueuedTurn | None = None  # the turn that has (or is about to have) the session
        self._waiting: deque[QueuedTurn] = deque()
        self._admitted: dict[QueuedTurn, anyio.Event] = {}

    @property
    def busy(self) -> bool:
        return self.active is not None or bool(self._waiting)

    @property
    def stopping(self) -> bool:
        """The session's turn is ending after a stop (``session.cancel``) and none waits behind it."""
        return self.active is not None and self.active.stopping and not self._waiting

    @property
    def turns(self) -> Iterator[QueuedTurn]:
        """The active turn, then the queued ones in order."""
        if self.active is not None:
            yield self.active
        yield from tuple(self._waiting)

    def admit(self, turn: QueuedTurn, *, start: bool) -> None:
        """Take a place for ``turn``. Synchronous, so admission follows arrival order.

        Raises:
            SessionBusy: -32005 with ``data.reason`` ``turn_running`` (``session.start`` while a
                turn runs or waits) or ``queue_full`` (more than ``max_queued`` waiting).
        """
        self.last_active = time.monotonic()
        if self.active is None:
            self.active = turn
            return
        if start:
            raise SessionBusy("a turn is running on this session", reason="turn_running", sessionId=self.session_id)
        if len(self._waiting) >= self.max_queued:
            raise SessionBusy("the session's turn queue is full", reason="queue_full", sessionId=self.session_id)
        self._waiting.append(turn)
        self._admitted[turn] = anyio.Event()

    async def wait_turn(self, turn: QueuedTurn) -> None:
        """Wait until ``turn`` has the session (at once when it already has)."""
        admitted = self._admitted.get(turn)
        if admitted is not None:
            await admitted.wait()

    def release(self, turn: QueuedTurn) -> None:
        """``turn`` gives up its place (ended, or never started); the next queued turn gets it."""
        self.last_active = time.monotonic()
        self._admitted.pop(turn, None)
        if turn is not self.active:
            if turn in self._waiting:
                self._waiting.remove(turn)
            return
        self.active = None
        if self._waiting:
            self.active = nxt = self._waiting.popleft()
            self._admitted.pop(nxt).set()

    @property
    def history(self) -> deque[tuple[str, str]]:
        """``(role, text)`` of the latest turns, oldest first (at most ``HISTORY_KEPT``)."""
        if self._amend is not None:
            amend, self._amend = self._amend, None
            amend(self._history)
        return self._history

    def record(self, role: str, text: str) -> None:
        self.history.append((role, text))

    def amend_history(self, amend: Callable[[deque[tuple[str, str]]], None]) -> None:
        """Run ``amend`` on the history before it is next read: chunks an agent writes behind its
        answer are joined into that answer once, not once per chunk (each join copies the whole
        output, up to ``maxOutputBytes``)."""
        self._amend = amend


class SessionTable:
    """The bridge's sessions, keyed by (principal, sessionId): two principals may use the same id
    without meeting, and to each, another's session does not exist (docs/api.md "Sessions").

    Args:
        max_sessions: ``limits.maxSessions``, bridge-wide; the least recently used idle session
            (of any principal) is forgotten to make room.
        max_queued: ``limits.maxQueuedTurns`` of each new session.
        on_forget: called with each session forgotten to make room or for being idle (its
            provider session must be ended).
        max_per_principal: ``limits.maxSessionsPerToken``; a principal at its cap has its own
            least recently used idle session forgotten, never another's.
    """

    def __init__(
        self,
        max_sessions: int,
        max_queued: int,
        on_forget: Callable[[Session], None],
        max_per_principal: int | None = None,
    ) -> None:
        self._sessions: dict[tuple[str, str], Session] = {}
        self._counts: dict[str, int] = {}
        self._max = max_sessions
        self._max_per_principal = max_per_principal or max_sessions
        self._max_queued = max_queued
        self._on_forget = on_forget

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[Session]:
        return iter(tuple(self._sessions.values()))

    def get(self, session_id: str, principal: str) -> Session | None:
        """The principal's session ``session_id``, or None (also when only another principal
        has one by that id)."""
        return self._sessions.get((principal, session_id))

    def open(self, session_id: str, principal: str, thread_id: str) -> Session:
        """The principal's session ``session_id``, created when it does not exist.

        Raises:
            LimitReached: -32006, the principal has ``maxSessionsPerToken`` sessions or the bridge
                ``maxSessions``, and none of them (of the principal's, for the first) is idle.
        """
        session = self._sessions.get((principal, session_id))
        if session is not None:
            session.thread_id = thread_id
            return session
        if self._counts.get(principal, 0) >= self._max_per_principal and not self._evict(principal):
            raise LimitReached(
                "too many sessions for this token", limit="maxSessionsPerToken", value=self._max_per_principal
            )
        if len(self._sessions) >= self._max and not self._evict(None):
            raise LimitReached("too many sessions", limit="maxSessions", value=self._max)
        session = Session(session_id, principal, thread_id, max_queued=self._max_queued)
        self._sessions[(principal, session_id)] = session
        self._counts[principal] = self._counts.get(principal, 0) + 1
        return session

    def pop(self, session_id: str, principal: str) -> Session | None:
        session = self._sessions.pop((principal, session_id), None)
        if session is not None:
            self._uncount(principal)
        return session

    def _uncount(self, principal: str) -> None:
        left = self._counts.get(principal, 1) - 1
        if left:
            self._counts[principal] = left
        else:
            self._counts.pop(principal, None)

    def _evict(self, principal: str | None) -> int:
        """Forget the least recently used idle session (of ``principal`` when given)."""
        idle = [s for s in self._sessions.values() if not s.busy and (principal is None or s.owner == principal)]
        if not idle:
            return 0
        self._forget(min(idle, key=lambda s: s.last_active))
        return 1

    def evict_idle(self, older_than: float) -> int:
        """Forget every session idle for longer than ``older_than`` seconds. Returns how many."""
        limit = time.monotonic() - older_than
        idle = [s for s in self._sessions.values() if not s.busy and s.last_active < limit]
        for session in idle:
            self._forget(session)
        return len(idle)

    def _forget(self, session: Session) -> None:
        if self._sessions.pop((session.owner, session.session_id), None) is not None:
            self._uncount(session.owner)
        self._on_forget(session)
        log.info("forgot idle session %s", session.session_id[:80])
