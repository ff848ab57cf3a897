"""Bridge sessions: who owns each, its provider session, its turn queue, its ordered update log and
the provider session's state; and the table that holds them, bounded and evicting idle ones.

One turn runs at a time per session; further ``session.message`` calls wait in a FIFO queue
(bounded, then -32005 ``queue_full``). Admission is synchronous so requests are queued in the order
they were read (docs/api.md "Precise rules": requests are admitted in order, then run concurrently).

Must not import: ``bridge`` (except ``bridge.rpc``).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Literal, Protocol

import anyio

from bridge.rpc.codec import dumps
from bridge.rpc.errors import LimitReached, SessionBusy
from compat.base import ProviderSession
from compat.telemetry import METRICS
from orchestrator.machine import Trigger
from orchestrator.store import HISTORY_KEPT, SEQ_BLOCK, SessionRecord, Store, TurnRecord, Upstream

log = logging.getLogger(__name__)
Subscriber = Callable[[dict[str, Any]], None]
How = Literal["subscribe", "stream", "turn"]
"""Why a stream receives a session's updates (``UpdateLog.attach``)."""


class QueuedTurn(Protocol):
    """What a session needs of the turns it queues (``orchestrator.turn.Turn``)."""

    ended: anyio.Event
    first_seq: int | None  # the seq of its first update, once it published one

    @property
    def prompt(self) -> str: ...

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


class Listener(Protocol):
    """A stream that receives a session's updates: a WebSocket connection, an SSE response, the
    stdio process (``bridge.methods`` adapts a request's ``CallContext``).

    ``key`` names the stream: a session delivers each update once per key. ``closers`` is where a
    subscription registers its end, run when the stream closes; None for a plain HTTP response,
    which can carry no notification after its reply.
    """

    key: str
    closers: list[Callable[[], None]] | None

    def deliver(self, params: dict[str, Any]) -> None:
        """Send one ``session.update``; never blocks."""
        ...

    def backlog(self) -> int:
        """Bytes the stream has queued and not yet sent (a replay waits while this is large)."""
        ...


_anonymous = itertools.count(1)
STORED_ENTRY_CHARS = 64 * 1024
"""Characters of each history entry stored (an answer can be maxOutputBytes long; a restored
conversation is given to an agent as its latest 64 KiB)."""


class StreamListener:
    """A :class:`Listener` on a ``notify(method, params)`` callable (``bridge.methods`` builds
    one per request from its ``CallContext``; a bare callable is one for a single turn).

    Args:
        notify: sends a notification on the stream; never blocks.
        key: the stream's name (default: one of its own, so it is never merged with another).
        closers: the stream's close hooks (None: it carries notifications only while a turn runs).
        backlog: the stream's queued bytes (default: always 0).
    """

    __slots__ = ("_backlog", "_notify", "closers", "key")

    def __init__(
        self,
        notify: Callable[[str, Any], None],
        key: str | None = None,
        closers: list[Callable[[], None]] | None = None,
        backlog: Callable[[], int] | None = None,
    ) -> None:
        self._notify = notify
        self.key = key or f"anonymous-{next(_anonymous)}"
        self.closers = closers
        self._backlog = backlog

    def deliver(self, params: dict[str, Any]) -> None:
        METRICS.updates_sent.inc()
        self._notify("session.update", params)

    def backlog(self) -> int:
        return self._backlog() if self._backlog is not None else 0


class _Audience:
    __slots__ = ("deliver", "started", "subscribed", "turns")

    def __init__(self, deliver: Subscriber) -> None:
        self.deliver = deliver
        self.subscribed = False  # session.subscribe: keeps the session loaded
        self.started = False  # the stream started a turn here: it listens for the rest of its life
        self.turns = 0  # running turns a stream without a life of its own (plain HTTP) started

    @property
    def empty(self) -> bool:
        return not (self.subscribed or self.started or self.turns)


class UpdateLog:
    """The per-session ordered log of ``session.update`` params, and the streams it goes to.

    ``seq`` strictly increases and is never reset (not even by ``session.start``, nor by a restart:
    see ``orchestrator.store.SEQ_BLOCK``). Each update is handed to ``persist`` (the store's
    writer queue) before any stream gets it. The last ``capacity`` updates (at most ``max_bytes``
    of their JSON) stay in memory: a subscriber that resumes inside them is served at once, one
    that resumes further back reads the store first.

    They are kept encoded: bytes are invisible to the garbage collector, while a deque of update
    dicts per session kept every streamed chunk alive through the young generations (bench case 4:
    full collections of 25-40 ms with 100 sessions streaming).

    Args:
        first_seq: the first ``seq`` to give (a session loaded from the store continues its own).
        persist: ``persist(seq, json)`` for each update.
        reserve: ``reserve(upto)`` makes ``seq`` values up to ``upto`` durable before they are
            used (one block ahead).
    """

    def __init__(
        self,
        capacity: int = 256,
        max_bytes: int = 128 * 1024,
        *,
        first_seq: int = 1,
        last_seq: int = 0,
        persist: Callable[[int, bytes], None] | None = None,
        reserve: Callable[[int], object] | None = None,
    ) -> None:
        self._seq = first_seq - 1  # the last number given or skipped (after a crash, a block is)
        self._last = last_seq  # the last update logged
        self._reserved = self._seq
        self._recent: deque[tuple[int, bytes]] = deque()  # (seq, the update's JSON)
        self._capacity = capacity
        self._max_bytes = max_bytes
        self._bytes = 0
        self._persist = persist
        self._reserve = reserve
        self._audience: dict[str, _Audience] = {}

    @property
    def last_seq(self) -> int:
        """The ``seq`` of the last update logged (0 before any)."""
        return self._last

    @property
    def numbered(self) -> int:
        """The last ``seq`` given or skipped: the next update gets a greater one."""
        return self._seq

    @property
    def first_kept(self) -> int | None:
        """The oldest ``seq`` still in memory (None before the first update)."""
        return self._recent[0][0] if self._recent else None

    def append(self, params: dict[str, Any]) -> dict[str, Any]:
        """Number ``params`` (``seq``), persist and keep it, and deliver it to every stream once;
        returns it."""
        if self._reserve is not None and self._seq + SEQ_BLOCK // 2 >= self._reserved:
            self._reserved = max(self._reserved, self._seq) + SEQ_BLOCK
            self._reserve(self._reserved)
        self._seq += 1
        self._last = self._seq
        params["seq"] = self._seq
        # A copy of exactly the encoded length: orjson returns its working buffer unshrunk (4 KiB
        # for a 150-byte update), so the log would hold about 30 times its ``max_bytes``.
        encoded = bytes(memoryview(dumps(params)))
        if self._persist is not None:
            self._persist(self._seq, encoded)
        self._recent.append((self._seq, encoded))
        self._bytes += len(encoded)
        # The newest update always stays, even one larger than max_bytes on its own.
        while len(self._recent) > 1 and (len(self._recent) > self._capacity or self._bytes > self._max_bytes):
            self._bytes -= len(self._recent.popleft()[1])
        if self._audience:
            for audience in tuple(self._audience.values()):
                audience.deliver(params)
        return params

    def kept_after(self, after_seq: int) -> list[tuple[int, bytes]]:
        """The updates in memory with ``seq > after_seq``, oldest first."""
        return [(seq, encoded) for seq, encoded in self._recent if seq > after_seq]

    def attach(self, key: str, deliver: Subscriber, how: How) -> bool:
        """Deliver the next updates to ``key`` too, ``how``: ``subscribe`` (``session.subscribe``),
        ``stream`` (it started a turn: for the rest of the stream's life) or ``turn`` (while one
        turn runs). Returns whether ``key`` is new here (then the caller registers its end)."""
        audience = self._audience.get(key)
        new = audience is None
        if audience is None:
            audience = self._audience[key] = _Audience(deliver)
        if how == "subscribe":
            audience.subscribed = True
        elif how == "stream":
            audience.started = True
        else:
            audience.turns += 1
        return new

    def detach(self, key: str, how: How | None = None) -> None:
        """End what ``attach(key, how=…)`` began; ``how`` None: everything of ``key`` (its stream
        closed)."""
        audience = self._audience.get(key)
        if audience is None:
            return
        if how == "subscribe":
            audience.subscribed = False
        elif how == "stream":
            audience.started = False
        elif how == "turn":
            audience.turns = max(0, audience.turns - 1)
        if how is None or audience.empty:
            del self._audience[key]

    @property
    def listened(self) -> bool:
        """Some stream receives the session's updates."""
        return bool(self._audience)

    @property
    def subscribed(self) -> bool:
        """A stream subscribed with ``session.subscribe``."""
        return any(a.subscribed for a in self._audience.values())

    def listening(self, key: str) -> bool:
        return key in self._audience


class Session:
    """One bridge session.

    Args:
        session_id: the client's ``sessionId``.
        owner: the principal (token name) that created it; no other may see it.
        thread_id: the client's ``threadId`` (default ``sessionId``).
        max_queued: ``limits.maxQueuedTurns``.
        store: where the session, its turns and its update log are kept (None: memory only).
        record: the stored session this one continues (after a restart, or an eviction).
    """

    def __init__(
        self,
        session_id: str,
        owner: str,
        thread_id: str,
        *,
        max_queued: int = 16,
        store: Store | None = None,
        record: SessionRecord | None = None,
    ) -> None:
        self.session_id = session_id
        self.owner = owner
        self.thread_id = thread_id
        self.max_queued = max_queued
        self.store = store
        self.created_at = record.created_at if record is not None else time.time()
        self.restored = record is not None and bool(record.history)  # the conversation is stored, not in an agent
        self.closed = record.closed if record is not None else False  # session.close ended it; still readable
        self.last_active = time.monotonic()
        self.provider_id: str | None = None
        self.provider_session: ProviderSession | None = None
        self.working_directory: str | None = None
        self.attachment_folders: list[tuple[str, str]] = []  # (cwd, turnId) of inline attachments written
        self._history: deque[tuple[str, str]] = deque(maxlen=HISTORY_KEPT)
        self._amend: Callable[[deque[tuple[str, str]]], None] | None = None
        if store is None:
            self.log = UpdateLog()
        else:
            self.log = UpdateLog(
                first_seq=record.next_seq if record is not None else 1,
                last_seq=record.last_seq if record is not None else 0,
                persist=lambda seq, body: store.append_update(owner, session_id, seq, body),
                reserve=lambda upto: store.reserve_seq(owner, session_id, upto),
            )
        self.permissions: dict[str, PendingPermission] = {}  # requestId → a pending ``ask``
        self.state: dict[str, dict[str, Any] | None] = {}
        """The provider session's state: the latest data of each session-level kind (ACP
        ``available_commands_update`` …), whenever it arrived."""
        self.state_unsent: set[str] = set()
        """State kinds that changed while no turn streamed: sent at the start of the next turn."""
        self.active: QueuedTurn | None = None  # the turn that has (or is about to have) the session
        self._waiting: deque[QueuedTurn] = deque()
        self._admitted: dict[QueuedTurn, anyio.Event] = {}
        self.provider_id_before = record.provider_id if record is not None else None  # of the stored conversation
        self.upstream: Upstream | None = record.upstream if record is not None else None
        if record is not None:
            self.working_directory = record.working_directory
            self._history.extend(record.history)
            self.state.update(record.state)
        if store is not None and record is None:
            self.save()

    @property
    def watched(self) -> bool:
        """A stream subscribed to it: it is not unloaded for being idle."""
        return self.log.subscribed

    def save_turn(self, turn: Any, result: Any = None) -> None:
        """Hand ``turn``'s record to the store: running (no result yet) or ended with ``result``
        (a ``TurnResult``)."""
        if self.store is None or not turn.turn_id:
            return
        if result is None:
            record = TurnRecord(
                turn_id=turn.turn_id, started_at=turn.started_at, ended_at=None, status="running", prompt=turn.prompt
            )
        else:
            record = TurnRecord(
                turn_id=turn.turn_id,
                started_at=turn.started_at,
                ended_at=time.time(),
                status=result.status,
                summary=result.summary,
                result=result,  # encoded by the store as it is handed over: no copy as builtins first
            )
        self.store.save_turn(self.owner, self.session_id, record)

    def close_log(self) -> None:
        """The bridge stops cleanly (or the session closed): the next ``seq`` after a restart
        is the next one, no block skipped."""
        if self.store is not None and self.log.numbered:
            self.store.close_log(self.owner, self.session_id, self.log.numbered)

    def save(self) -> None:
        """Hand the session's record (history, state, provider) to the store (queued)."""
        if self.store is None:
            return
        self.store.save_session(
            SessionRecord(
                principal=self.owner,
                session_id=self.session_id,
                thread_id=self.thread_id,
                provider_id=self.provider_id or self.provider_id_before,
                working_directory=self.working_directory,
                created_at=self.created_at,
                updated_at=time.time(),
                state={k: v for k, v in self.state.items() if v is not None},
                # each entry's end (a new agent session is given the latest 64 KiB of it, at most)
                history=[(role, text[-STORED_ENTRY_CHARS:]) for role, text in self.history],
                closed=self.closed,
                upstream=self.upstream,
            )
        )

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
        store: where sessions are kept; one forgotten here (unloaded) stays there.
    """

    def __init__(
        self,
        max_sessions: int,
        max_queued: int,
        on_forget: Callable[[Session], None],
        max_per_principal: int | None = None,
        store: Store | None = None,
    ) -> None:
        self.store = store
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

    def open(self, session_id: str, principal: str, thread_id: str, *, record: SessionRecord | None = None) -> Session:
        """The principal's session ``session_id``, created when it does not exist (continuing
        ``record``, the stored one, when given).

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
        session = Session(
            session_id, principal, thread_id, max_queued=self._max_queued, store=self.store, record=record
        )
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
        idle = [s for s in self._sessions.values() if not s.busy and not s.watched and s.last_active < limit]
        for session in idle:
            self._forget(session)
        return len(idle)

    def _forget(self, session: Session) -> None:
        if self._sessions.pop((session.owner, session.session_id), None) is not None:
            self._uncount(session.owner)
        self._on_forget(session)
        log.info("forgot idle session %s", session.session_id[:80])
