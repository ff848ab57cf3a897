"""The session store: sessions, turns with their results, the update log and the conversation
history, kept in an embedded SQLite database so they outlive the connection and the process
(docs/api.md "Durable sessions").

One writer thread per process takes every write from a queue and commits whatever is queued as one
transaction (group commit): concurrent turns never meet "database is locked", and the event loop
never waits on the disk. A write the caller must know is durable (a ``seq`` reservation) returns a
future. Reads run in worker threads on connections of their own; in WAL mode readers never block
the writer. :meth:`SqliteStore.flush` waits until every write queued before it is committed, so a
read after it sees them.

The update log is kept in segments: the updates one session appended within ``LINGER``, one row,
a line each (``<seq> <json>``), in ordinary rowid tables (the rows are kilobytes: ``WITHOUT
ROWID`` is for small ones). With a row per update, or segments in a ``WITHOUT ROWID`` table, SQLite
was the bridge's largest cost: bench case 4 (100 turns, 5,000 updates a second) spent 12-22% of a
core in the writer and its delay p99 was 6-10x the baseline relay.

The orchestrator sees only :class:`Store`; a replicated store can replace SQLite behind it.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``compat``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import anyio.to_thread
import msgspec

log = logging.getLogger(__name__)

SEQ_BLOCK = 10_000
"""``seq`` values reserved durably at a time. A session restarted after a crash continues one block
past its last reservation, so no ``seq`` a client saw is ever given again (docs/api.md)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    principal TEXT NOT NULL,
    session_id TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    provider_id TEXT,
    working_directory TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    state TEXT NOT NULL DEFAULT '{}',
    history TEXT NOT NULL DEFAULT '[]',
    seq_reserved INTEGER NOT NULL DEFAULT 0,
    seq_exact INTEGER NOT NULL DEFAULT 0,
    closed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (principal, session_id)
);
CREATE INDEX IF NOT EXISTS sessions_by_time ON sessions (principal, updated_at);
CREATE TABLE IF NOT EXISTS turns (
    principal TEXT NOT NULL,
    session_id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    status TEXT NOT NULL,
    summary TEXT NOT NULL DEFAULT '',
    result BLOB,
    prompt TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (principal, session_id, turn_id)
);
CREATE TABLE IF NOT EXISTS segments (
    principal TEXT NOT NULL,
    session_id TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    lines BLOB NOT NULL,
    PRIMARY KEY (principal, session_id, first_seq)
);
CREATE TABLE IF NOT EXISTS processes (
    pid INTEGER NOT NULL,
    started REAL NOT NULL,
    owner_pid INTEGER NOT NULL,
    owner_started REAL NOT NULL,
    PRIMARY KEY (pid, started)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS upstreams (
    principal TEXT NOT NULL,
    session_id TEXT NOT NULL,
    provider_id TEXT NOT NULL,
    upstream_id TEXT NOT NULL,
    working_directory TEXT NOT NULL,
    PRIMARY KEY (principal, session_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS owners (
    principal TEXT NOT NULL,
    session_id TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started REAL NOT NULL,
    PRIMARY KEY (principal, session_id)
) WITHOUT ROWID;
"""


class SessionRecord(msgspec.Struct, kw_only=True):
    """A stored session (times in seconds since the epoch)."""

    principal: str
    session_id: str
    thread_id: str
    provider_id: str | None = None
    working_directory: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    state: dict[str, Any] = {}
    history: list[tuple[str, str]] = []
    closed: bool = False
    next_seq: int = 1  # the first seq the session may use after loading
    last_seq: int = 0  # the last seq it gave that the store kept
    running: bool = False  # a turn of it has not ended (``list_sessions`` only: another process may run it)
    upstream: Upstream | None = None  # the provider's own session, to resume it after a restart


class Upstream(msgspec.Struct, frozen=True):
    """The provider's own session behind a bridge session (an ACP agent's ``sessionId``) and the
    working directory it was opened in: after a restart the agent may load it again
    (``session/load``) instead of being given the stored conversation."""

    provider_id: str
    session_id: str
    working_directory: str


class TurnRecord(msgspec.Struct, kw_only=True):
    """A stored turn: ``result`` is the wire result (None while it runs): a result model when
    it is saved (the store encodes it at once), a dict when it is read back."""

    turn_id: str
    started_at: float
    ended_at: float | None
    status: str
    summary: str = ""
    result: Any = None
    prompt: str = ""  # kept while it runs: a restart adds it, with the output so far, to the history


class Store(Protocol):
    """What the orchestrator needs of a store. Writes never block (they are queued); reads wait."""

    def save_session(self, record: SessionRecord) -> None: ...
    def delete_session(self, principal: str, session_id: str) -> None: ...
    def reserve_seq(self, principal: str, session_id: str, upto: int) -> concurrent.futures.Future[None]: ...
    def close_log(self, principal: str, session_id: str, last_seq: int) -> None: ...
    def append_update(self, principal: str, session_id: str, seq: int, body: bytes) -> None: ...
    def save_turn(self, principal: str, session_id: str, turn: TurnRecord) -> None: ...
    async def flush(self) -> None: ...
    async def load_session(self, principal: str, session_id: str) -> SessionRecord | None: ...
    async def list_sessions(
        self, principal: str, before: tuple[float, str] | None, limit: int
    ) -> list[SessionRecord]: ...
    async def read_updates(
        self, principal: str, session_id: str, after_seq: int, before_seq: int | None, limit: int
    ) -> list[tuple[int, bytes]]: ...
    async def first_seq(self, principal: str, session_id: str) -> int | None: ...
    def record_process(self, pid: int) -> None: ...
    def forget_process(self, pid: int, started: float | None = None) -> None: ...
    def prune(self) -> None: ...
    async def end_left_behind(self, *, look_again: bool = False) -> int: ...
    async def __aenter__(self) -> Store: ...
    async def __aexit__(self, *exc_info: Any) -> None: ...
    @property
    def retention(self) -> Retention: ...
    async def turns(self, principal: str, session_id: str, limit: int) -> list[TurnRecord]: ...
    async def turn(self, principal: str, session_id: str, turn_id: str) -> TurnRecord | None: ...
    async def claim(self, principal: str, session_id: str) -> Claim: ...
    def release(self, principal: str, session_id: str) -> None: ...


class Claim(msgspec.Struct, frozen=True):
    """The outcome of :meth:`SqliteStore.claim`: ``owner_pid`` is None when this process owns
    the session now, else the pid of the live process that does; ``took_over``: this process
    took it from an owner that is gone (whose running turns were recorded ``BRIDGE_RESTARTED``)."""

    owner_pid: int | None = None
    owner_started: float = 0.0
    took_over: bool = False


class Retention(msgspec.Struct, frozen=True):
    """How much the store keeps (docs/api.md "Limits")."""

    max_log_updates: int = 10_000  # per session
    max_log_bytes: int = 16 * 1024 * 1024  # per session
    max_turn_results: int = 100  # per session
    session_retention: float = 30 * 86400.0  # seconds idle before a session is pruned
    max_bytes: int = 1024 * 1024 * 1024  # the database file


_Op = Callable[[sqlite3.Connection], Any]
_STOP = object()
LINGER = 0.1
"""Seconds a session's updates gather in memory before they go to the writer as one segment; also
the most a killed bridge loses of them (docs/api.md)."""
READER_CACHE_KIB = 256
"""Page cache of each reader connection (one per worker thread, up to anyio's 40): at SQLite's
default of 2 MiB each, the soak's RSS grew by 60-68 MiB after warm-up as the readers' caches
filled; the database file is in the OS page cache anyway."""
_PRUNE_EVERY = 256  # appends to one session between two prunings of its log


class SqliteStore:
    """:class:`Store` on one SQLite file (``<stateDir>/sessions.db``), WAL, ``synchronous=NORMAL``.

    Use as ``async with SqliteStore(path) as store``. ``recover`` (called on entry) records the turns
    a stopped bridge left running as failed (``BRIDGE_RESTARTED``) and returns the agent processes
    it left behind.

    Args:
        path: the database file; its folder is created owner-only.
        retention: what is kept.
    """

    def __init__(self, path: Path, retention: Retention | None = None) -> None:
        self.path = path
        self.retention = retention or Retention()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._readers = threading.local()
        self._reader_conns: list[sqlite3.Connection] = []
        self._reader_lock = threading.Lock()
        self._appends: dict[tuple[str, str], int] = {}  # appends since the last pruning (the writer's)
        self._gathering: dict[tuple[str, str], list[bytes]] = {}  # lines not yet handed to the writer
        self._hand_over_at: asyncio.TimerHandle | None = None
        self.left_behind: list[tuple[int, float]] = []  # (pid, start time) of a gone owner's agents
        self._opened = threading.Event()

    @functools.cached_property
    def _me(self) -> tuple[int, float]:
        """This process as an owner: ``(pid, start time)``. Read on first use (the first claim,
        or recovery that finds recorded processes), not while the bridge starts: the psutil
        import it needs, on the writer thread, held the GIL against ``serve``'s start (bench
        case 6: about 7 ms of a 105 ms budget, paired runs)."""
        return (os.getpid(), _start_time(os.getpid()) or 0.0)

    # ---- lifetime ---------------------------------------------------------------------------------

    async def __aenter__(self) -> SqliteStore:
        """Start the writer, which opens the database first (schema, recovery): the bridge is
        ready meanwhile (bench case 6: opening a new database was 57 ms of ``serve``'s cold start);
        reads wait for the opening, writes queue behind it."""
        self._writer = threading.Thread(target=self._write_loop, name="xworkmate-store", daemon=True)
        self._writer.start()
        return self

    async def end_left_behind(self, *, look_again: bool = False) -> int:
        """End the process groups of the agents a bridge that is gone left behind (recorded with
        :meth:`record_process`), each checked by pid and start time so a reused pid is never
        signalled, once the database is open; returns how many were ended. ``look_again``: read
        the recorded processes afresh (an owner sharing this state directory was just found
        gone, after this process's start-up recovery)."""
        if look_again:
            await self.opened()
            rows = await self._read(lambda c: c.execute("SELECT * FROM processes").fetchall())
            me = self._me
            self.left_behind = await anyio.to_thread.run_sync(_left_behind, rows, me)
        return await _end_left_behind(self)

    async def opened(self) -> None:
        """Until the database is open (and the turns a stopped bridge left are recorded)."""
        if not self._opened.is_set():
            await anyio.to_thread.run_sync(self._opened.wait)

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._hand_over_at is not None:
            self._hand_over_at.cancel()
        self._hand_over()
        self._submit(lambda c: c.execute("DELETE FROM owners WHERE pid = ? AND started = ?", self._me))
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._queue.put((_STOP, done))
        with anyio.CancelScope(shield=True):
            await asyncio.wrap_future(done)
            with self._reader_lock:
                for conn in self._reader_conns:
                    conn.close()
                self._reader_conns.clear()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")  # before WAL: it takes effect on a new file only
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=OFF")
        return conn

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        conn = self._connect()
        try:
            conn.executescript(_SCHEMA)
            with contextlib.suppress(OSError):
                os.chmod(self.path, 0o600)
            conn.execute("BEGIN IMMEDIATE")  # one transaction: no claim lands between its steps
            try:
                self._recover(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            self._prune_sessions(conn)
        finally:
            conn.close()

    def _recover(self, conn: sqlite3.Connection) -> None:
        """Record as ``BRIDGE_RESTARTED`` the turns left running by a process that is gone: of the
        sessions it owned, and of those no process owns (a store written before owners were
        recorded). Sessions a live process owns (another bridge on this state directory) keep
        their running turns."""
        for pid, started in conn.execute("SELECT DISTINCT pid, started FROM owners").fetchall():
            if not process_alive(pid, started):
                conn.execute("DELETE FROM owners WHERE pid = ? AND started = ?", (pid, started))
        orphaned = conn.execute(
            "SELECT DISTINCT principal, session_id FROM turns t WHERE ended_at IS NULL AND NOT EXISTS "
            "(SELECT 1 FROM owners o WHERE o.principal = t.principal AND o.session_id = t.session_id)"
        )
        for principal, session_id in orphaned.fetchall():
            _fail_running(conn, principal, session_id)
        rows = conn.execute("SELECT * FROM processes").fetchall()
        self.left_behind = _left_behind(rows, self._me) if rows else []

    # ---- writes (queued) --------------------------------------------------------------------------

    def _submit(self, op: _Op, done: concurrent.futures.Future[None] | None = None) -> None:
        self._queue.put((op, done))

    async def claim(self, principal: str, session_id: str) -> Claim:
        """Make this process the session's owner unless a live process owns it (docs/api.md
        "Several processes on one state directory"): the owner record holds a pid and its
        start time, so a reused pid is never taken for the owner. An owner that is gone is
        replaced, and the turns it left running are recorded ``BRIDGE_RESTARTED`` first. Returns
        once the claim is committed (the writer's transactions are ``BEGIN IMMEDIATE``, so two
        processes claiming at once are serialised), and with it every write queued before, as
        :meth:`flush` would."""
        outcome: list[Claim] = []

        def op(c: sqlite3.Connection) -> None:
            row = c.execute(
                "SELECT pid, started FROM owners WHERE principal = ? AND session_id = ?", (principal, session_id)
            ).fetchone()
            mine = row is not None and (row[0], row[1]) == self._me
            if row is not None and not mine and process_alive(row[0], row[1]):
                outcome.append(Claim(owner_pid=row[0], owner_started=row[1]))
                return
            if row is not None and not mine:
                _fail_running(c, principal, session_id)
            c.execute("INSERT OR REPLACE INTO owners VALUES (?, ?, ?, ?)", (principal, session_id, *self._me))
            outcome.append(Claim(took_over=row is not None and not mine))

        await self.opened()
        self._hand_over()  # the gathered updates go first: they are committed when the claim is
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._submit(op, done)
        await asyncio.wrap_future(done)
        return outcome[0] if outcome else Claim()

    def release(self, principal: str, session_id: str) -> None:
        """This process no longer owns the session (it unloaded or closed it)."""
        self._submit(
            lambda c: c.execute(
                "DELETE FROM owners WHERE principal = ? AND session_id = ? AND pid = ? AND started = ?",
                (principal, session_id, *self._me),
            )
        )

    def save_session(self, record: SessionRecord) -> None:
        values = (
            record.principal,
            record.session_id,
            record.thread_id,
            record.provider_id,
            record.working_directory,
            record.created_at,
            record.updated_at,
            _json(record.state).decode(),
            _json(record.history).decode(),
            int(record.closed),
        )
        upstream = record.upstream
        if upstream is not None:
            self._submit(
                lambda c: c.execute(
                    "INSERT OR REPLACE INTO upstreams VALUES (?, ?, ?, ?, ?)",
                    (
                        record.principal,
                        record.session_id,
                        upstream.provider_id,
                        upstream.session_id,
                        upstream.working_directory,
                    ),
                )
            )
        self._submit(
            lambda c: c.execute(
                "INSERT INTO sessions (principal, session_id, thread_id, provider_id, working_directory, "
                "created_at, updated_at, state, history, closed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (principal, session_id) DO UPDATE SET thread_id = excluded.thread_id, "
                "provider_id = excluded.provider_id, working_directory = excluded.working_directory, "
                "updated_at = excluded.updated_at, state = excluded.state, history = excluded.history, "
                "closed = excluded.closed",
                values,
            )
        )

    def delete_session(self, principal: str, session_id: str) -> None:
        self._hand_over()  # its gathered updates go first, so none outlives it
        self._submit(lambda c: _delete(c, principal, session_id))

    def reserve_seq(self, principal: str, session_id: str, upto: int) -> concurrent.futures.Future[None]:
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._submit(
            lambda c: c.execute(
                "UPDATE sessions SET seq_reserved = max(seq_reserved, ?), seq_exact = 0 "
                "WHERE principal = ? AND session_id = ?",
                (upto, principal, session_id),
            ),
            done,
        )
        return done

    def close_log(self, principal: str, session_id: str, last_seq: int) -> None:
        """A clean stop: the session continues right after ``last_seq`` (no block skipped)."""
        self._hand_over()
        self._submit(
            lambda c: c.execute(
                "UPDATE sessions SET seq_reserved = ?, seq_exact = 1 WHERE principal = ? AND session_id = ?",
                (last_seq, principal, session_id),
            )
        )

    def append_update(self, principal: str, session_id: str, seq: int, body: bytes) -> None:
        """Add one update (``body``, its JSON) to the session's log: gathered for :data:`LINGER`
        seconds with the session's next ones, then handed to the writer as one segment. Call it
        on the event loop, in ``seq`` order."""
        key = (principal, session_id)
        self._gathering.setdefault(key, []).append(b"%d %s" % (seq, body))
        if self._hand_over_at is None:
            self._hand_over_at = asyncio.get_running_loop().call_later(LINGER, self._hand_over)

    def _hand_over(self) -> None:
        """Queue every gathered segment for the writer (a write queued after this sees them)."""
        self._hand_over_at = None
        if not self._gathering:
            return
        gathered, self._gathering = self._gathering, {}
        segments = [
            (principal, session_id, _seq_of(lines[0]), _seq_of(lines[-1]), b"\n".join(lines))
            for (principal, session_id), lines in gathered.items()
        ]
        self._submit(lambda c: self._insert_segments(c, segments))

    def save_turn(self, principal: str, session_id: str, turn: TurnRecord) -> None:
        """Record a turn (running, or ended with its result). The updates gathered so far go to
        the writer first, so an ended turn is never committed before its last updates (a
        process following the log from the store stops once the turn has ended)."""
        if turn.ended_at is not None:
            self._hand_over()
        keep = self.retention.max_turn_results
        values = (
            principal,
            session_id,
            turn.turn_id,
            turn.started_at,
            turn.ended_at,
            turn.status,
            turn.summary,
            None if turn.result is None else _json(turn.result),
            turn.prompt if turn.result is None else "",
        )

        def op(c: sqlite3.Connection) -> None:
            c.execute(
                "INSERT OR REPLACE INTO turns (principal, session_id, turn_id, started_at, ended_at, status, "
                "summary, result, prompt) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                values,
            )
            c.execute(
                "DELETE FROM turns WHERE principal = ? AND session_id = ? AND turn_id NOT IN (SELECT turn_id "
                "FROM turns WHERE principal = ? AND session_id = ? ORDER BY started_at DESC LIMIT ?)",
                (principal, session_id, principal, session_id, keep),
            )

        self._submit(op)

    def record_process(self, pid: int) -> None:
        """An agent process this bridge started (found and ended at the next start if this
        bridge dies without ending it); its start time is read in the writer thread."""
        me = os.getpid()

        def op(c: sqlite3.Connection) -> None:
            started, mine = _start_time(pid), _start_time(me)
            if started is not None and mine is not None:
                c.execute("INSERT OR REPLACE INTO processes VALUES (?, ?, ?, ?)", (pid, started, me, mine))

        self._submit(op)

    def forget_process(self, pid: int, started: float | None = None) -> None:
        """The agent ``pid`` was reaped (any start time when ``started`` is None)."""
        if started is None:
            self._submit(lambda c: c.execute("DELETE FROM processes WHERE pid = ?", (pid,)))
        else:
            self._submit(lambda c: c.execute("DELETE FROM processes WHERE pid = ? AND started = ?", (pid, started)))

    def prune(self) -> None:
        """Prune idle sessions and keep the file under its bound (in the writer, off the loop)."""
        self._submit(self._prune_sessions)

    async def flush(self) -> None:
        """Until every write queued before this call, gathered updates included, is committed."""
        self._hand_over()
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._submit(lambda c: None, done)
        await asyncio.wrap_future(done)

    def _write_loop(self) -> None:
        try:
            self._open()
        except Exception:  # every read and write then fails with the reason; the bridge runs on
            log.exception("the session store %s could not be opened", self.path)
        finally:
            self._opened.set()
        conn = self._connect()
        try:
            while True:
                group = [self._queue.get()]
                while True:  # whatever else is queued goes in the same transaction
                    try:
                        group.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                stop = next((done for op, done in group if op is _STOP), None)
                self._commit(conn, [(op, done) for op, done in group if op is not _STOP])
                if stop is not None:
                    stop.set_result(None)
                    return
        finally:
            conn.close()

    def _commit(
        self, conn: sqlite3.Connection, group: Sequence[tuple[_Op, concurrent.futures.Future[None] | None]]
    ) -> None:
        try:
            conn.execute("BEGIN IMMEDIATE")  # the write lock first: a claim reads, then writes
            for op, _ in group:
                op(conn)
            conn.execute("COMMIT")
        except Exception:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            log.exception("the session store could not commit %d writes; retrying them one by one", len(group))
            for op, done in group:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    op(conn)
                    conn.execute("COMMIT")
                except Exception as exc:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    log.error("the session store dropped a write: %s", exc)
                    if done is not None and not done.done():
                        done.set_exception(exc)
        for _, done in group:
            if done is not None and not done.done():
                done.set_result(None)

    def _insert_segments(self, conn: sqlite3.Connection, segments: list[tuple[str, str, int, int, bytes]]) -> None:
        """Write ``(principal, session_id, first_seq, last_seq, lines)`` segments; a session's
        log is pruned to its bounds every :data:`_PRUNE_EVERY` updates."""
        conn.executemany(
            "INSERT OR REPLACE INTO segments (principal, session_id, first_seq, last_seq, lines) VALUES (?, ?, ?, ?, ?)",
            segments,
        )
        for principal, session_id, first, last, _lines in segments:
            key = (principal, session_id)
            count = self._appends.get(key, 0) + last - first + 1
            self._appends[key] = count
            if count >= _PRUNE_EVERY:
                self._appends[key] = 0
                _prune_log(conn, principal, session_id, last, self.retention)

    def _prune_sessions(self, conn: sqlite3.Connection) -> None:
        cutoff = time.time() - self.retention.session_retention
        for principal, session_id in conn.execute(
            "SELECT principal, session_id FROM sessions WHERE updated_at < ?", (cutoff,)
        ).fetchall():
            _delete(conn, principal, session_id)
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]

        def used() -> int:  # bytes in use: free pages wait for the vacuum
            pages = (
                conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]
            )
            return pages * page_size

        while used() > self.retention.max_bytes:
            # the oldest session of the principal storing the most: one token filling the
            # database prunes its own sessions first, not everyone's oldest
            oldest = (
                conn.execute(
                    "SELECT principal, session_id FROM sessions WHERE principal = (SELECT principal FROM "
                    "(SELECT principal, sum(length(lines)) AS bytes FROM segments GROUP BY principal "
                    "UNION ALL SELECT principal, sum(length(result)) FROM turns GROUP BY principal) "
                    "GROUP BY principal ORDER BY sum(bytes) DESC LIMIT 1) ORDER BY updated_at LIMIT 1"
                ).fetchone()
                or conn.execute("SELECT principal, session_id FROM sessions ORDER BY updated_at LIMIT 1").fetchone()
            )
            if oldest is None:
                break
            _delete(conn, *oldest)
            log.info("state database over stateMaxBytes: pruned session %s", oldest[1][:80])
        if conn.execute("PRAGMA freelist_count").fetchone()[0]:
            conn.execute("PRAGMA incremental_vacuum").fetchall()  # gives the free pages back

    # ---- reads (worker threads) -------------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._readers, "conn", None)
        if conn is None:
            conn = self._readers.conn = self._connect()
            conn.execute(f"PRAGMA cache_size=-{READER_CACHE_KIB}")
            with self._reader_lock:
                self._reader_conns.append(conn)
        return conn

    async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        await self.opened()
        return await anyio.to_thread.run_sync(lambda: fn(self._reader()))

    async def load_session(self, principal: str, session_id: str) -> SessionRecord | None:
        def read(c: sqlite3.Connection) -> SessionRecord | None:
            row = c.execute(
                "SELECT thread_id, provider_id, working_directory, created_at, updated_at, state, history, "
                "closed, seq_reserved, seq_exact, (SELECT max(last_seq) FROM segments u WHERE u.principal = s.principal "
                "AND u.session_id = s.session_id) FROM sessions s WHERE principal = ? AND session_id = ?",
                (principal, session_id),
            ).fetchone()
            if row is None:
                return None
            upstream = c.execute(
                "SELECT provider_id, upstream_id, working_directory FROM upstreams "
                "WHERE principal = ? AND session_id = ?",
                (principal, session_id),
            ).fetchone()
            record = _session(principal, session_id, row)
            return record if upstream is None else msgspec.structs.replace(record, upstream=Upstream(*upstream))

        return await self._read(read)

    async def list_sessions(self, principal: str, before: tuple[float, str] | None, limit: int) -> list[SessionRecord]:
        def read(c: sqlite3.Connection) -> list[SessionRecord]:
            where, args = "principal = ?", [principal]
            if before is not None:
                where += " AND (updated_at < ? OR (updated_at = ? AND session_id < ?))"
                args += [before[0], before[0], before[1]]
            rows = c.execute(
                "SELECT session_id, thread_id, provider_id, working_directory, created_at, updated_at, state, "
                f"'[]', closed, seq_reserved, seq_exact, NULL, EXISTS (SELECT 1 FROM turns t WHERE "
                "t.principal = s.principal AND t.session_id = s.session_id AND t.ended_at IS NULL) "
                f"FROM sessions s WHERE {where} ORDER BY updated_at DESC, session_id DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
            return [msgspec.structs.replace(_session(principal, r[0], r[1:12]), running=bool(r[12])) for r in rows]

        return await self._read(read)

    async def read_updates(
        self, principal: str, session_id: str, after_seq: int, before_seq: int | None, limit: int
    ) -> list[tuple[int, bytes]]:
        def read(c: sqlite3.Connection) -> list[tuple[int, bytes]]:
            before = before_seq if before_seq is not None else 2**62
            found: list[tuple[int, bytes]] = []
            for (lines,) in c.execute(
                "SELECT lines FROM segments WHERE principal = ? AND session_id = ? AND last_seq > ? "
                "AND first_seq < ? ORDER BY first_seq",
                (principal, session_id, after_seq, before),
            ):
                for seq, body in _lines(lines):
                    if after_seq < seq < before:
                        found.append((seq, body))
                        if len(found) >= limit:
                            return found
            return found

        return await self._read(read)

    async def first_seq(self, principal: str, session_id: str) -> int | None:
        def read(c: sqlite3.Connection) -> int | None:
            return c.execute(
                "SELECT min(first_seq) FROM segments WHERE principal = ? AND session_id = ?", (principal, session_id)
            ).fetchone()[0]

        return await self._read(read)

    async def turns(self, principal: str, session_id: str, limit: int) -> list[TurnRecord]:
        def read(c: sqlite3.Connection) -> list[TurnRecord]:
            rows = c.execute(
                "SELECT turn_id, started_at, ended_at, status, summary FROM turns WHERE principal = ? "
                "AND session_id = ? ORDER BY started_at DESC LIMIT ?",
                (principal, session_id, limit),
            ).fetchall()
            return [TurnRecord(turn_id=r[0], started_at=r[1], ended_at=r[2], status=r[3], summary=r[4]) for r in rows]

        return await self._read(read)

    async def turn(self, principal: str, session_id: str, turn_id: str) -> TurnRecord | None:
        def read(c: sqlite3.Connection) -> TurnRecord | None:
            r = c.execute(
                "SELECT turn_id, started_at, ended_at, status, summary, result FROM turns WHERE principal = ? "
                "AND session_id = ? AND turn_id = ?",
                (principal, session_id, turn_id),
            ).fetchone()
            if r is None:
                return None
            result = msgspec.json.decode(r[5]) if r[5] is not None else None
            return TurnRecord(turn_id=r[0], started_at=r[1], ended_at=r[2], status=r[3], summary=r[4], result=result)

        return await self._read(read)


# ---- helpers -------------------------------------------------------------------------------------------


def _json(value: Any) -> bytes:
    return msgspec.json.encode(value)


def _session(principal: str, session_id: str, row: Sequence[Any]) -> SessionRecord:
    thread_id, provider_id, cwd, created, updated, state, history, closed, reserved, exact, max_seq = row
    base = max(reserved or 0, max_seq or 0)
    next_seq = base + 1 if exact or not reserved else base + SEQ_BLOCK + 1
    return SessionRecord(
        principal=principal,
        session_id=session_id,
        thread_id=thread_id,
        provider_id=provider_id,
        working_directory=cwd,
        created_at=created,
        updated_at=updated,
        state=msgspec.json.decode(state),
        history=[tuple(h) for h in msgspec.json.decode(history)],
        closed=bool(closed),
        next_seq=next_seq,
        last_seq=max_seq or 0,
    )


HISTORY_KEPT = 50  # (role, text) entries of a session's conversation kept


def _add_history(conn: sqlite3.Connection, principal: str, session_id: str, entries: list[tuple[str, str]]) -> None:
    row = conn.execute(
        "SELECT history FROM sessions WHERE principal = ? AND session_id = ?", (principal, session_id)
    ).fetchone()
    if row is not None:
        history = [*msgspec.json.decode(row[0]), *entries][-HISTORY_KEPT:]
        conn.execute(
            "UPDATE sessions SET history = ? WHERE principal = ? AND session_id = ?",
            (_json(history).decode(), principal, session_id),
        )


def _seq_of(line: bytes) -> int:
    return int(line.split(b" ", 1)[0])


def _lines(lines: bytes) -> list[tuple[int, bytes]]:
    """A segment's ``(seq, json)`` pairs (JSON text never holds a raw newline)."""
    pairs = []
    for line in lines.split(b"\n"):
        seq, _, body = line.partition(b" ")
        pairs.append((int(seq), body))
    return pairs


def _fail_running(conn: sqlite3.Connection, principal: str, session_id: str) -> None:
    """Record the session's running turns as failed (``BRIDGE_RESTARTED``), with the output they
    had streamed, and add them to its conversation history."""
    now = time.time()
    rows = conn.execute(
        "SELECT turn_id, prompt FROM turns WHERE principal = ? AND session_id = ? AND ended_at IS NULL",
        (principal, session_id),
    )
    for turn_id, prompt in rows.fetchall():
        output = "".join(_deltas(conn, principal, session_id, turn_id))
        _add_history(conn, principal, session_id, [("user", prompt)] + ([("assistant", output)] if output else []))
        result = {
            "success": False,
            "status": "failed",
            "turnId": turn_id,
            "sessionId": session_id,
            "output": output,
            "summary": output.strip()[:200],
            "error": {"code": "BRIDGE_RESTARTED", "message": "the bridge stopped while the turn ran"},
        }
        conn.execute(
            "UPDATE turns SET ended_at = ?, status = 'failed', result = ? "
            "WHERE principal = ? AND session_id = ? AND turn_id = ?",
            (now, _json(result), principal, session_id, turn_id),
        )
        log.info("turn %s of session %s was running when its bridge stopped", turn_id, session_id[:80])


def _delete(conn: sqlite3.Connection, principal: str, session_id: str) -> None:
    for table in ("segments", "turns", "sessions", "owners", "upstreams"):
        conn.execute(f"DELETE FROM {table} WHERE principal = ? AND session_id = ?", (principal, session_id))


def _prune_log(conn: sqlite3.Connection, principal: str, session_id: str, seq: int, retention: Retention) -> None:
    """Keep the segments holding the last ``max_log_updates`` updates of the session, and of those
    at most ``max_log_bytes`` (the newest); a segment goes whole."""
    conn.execute(
        "DELETE FROM segments WHERE principal = ? AND session_id = ? AND last_seq <= ?",
        (principal, session_id, seq - retention.max_log_updates),
    )
    row = conn.execute(
        "SELECT first_seq FROM (SELECT first_seq, sum(length(lines)) OVER (ORDER BY first_seq DESC) AS kept "
        "FROM segments WHERE principal = ? AND session_id = ?) WHERE kept > ? ORDER BY first_seq DESC LIMIT 1",
        (principal, session_id, retention.max_log_bytes),
    ).fetchone()
    if row is not None:
        conn.execute(
            "DELETE FROM segments WHERE principal = ? AND session_id = ? AND first_seq <= ?",
            (principal, session_id, row[0]),
        )


def _deltas(conn: sqlite3.Connection, principal: str, session_id: str, turn_id: str) -> list[str]:
    texts = []
    for (lines,) in conn.execute(
        "SELECT lines FROM segments WHERE principal = ? AND session_id = ? ORDER BY first_seq", (principal, session_id)
    ):
        for _seq, body in _lines(lines):
            update = msgspec.json.decode(body)
            if (
                update.get("turnId") == turn_id
                and update.get("type") == "delta"
                and isinstance(update.get("delta"), str)
            ):
                texts.append(update["delta"])
    return texts


def _start_time(pid: int) -> float | None:
    """When ``pid`` started (psutil's ``create_time``), or None when it is gone."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _left_behind(rows: Sequence[Sequence[Any]], me: tuple[int, float]) -> list[tuple[int, float]]:
    """Of the recorded ``(pid, started, owner, owner_started)`` processes, those whose owner is
    another process that is gone."""
    return [
        (pid, started)
        for pid, started, owner, owner_started in rows
        if (owner, owner_started) != me and not process_alive(owner, owner_started)
    ]


def process_alive(pid: int, started: float) -> bool:
    """``pid`` runs and is the same process (its start time matches, so a reused pid is not)."""
    now = _start_time(pid)
    return now is not None and abs(now - started) < 0.5


async def _end_left_behind(store: SqliteStore) -> int:
    await store.opened()

    def end() -> int:
        import signal

        ended = 0
        for pid, started in store.left_behind:
            if process_alive(pid, started):
                with contextlib.suppress(OSError):
                    if os.getpgid(pid) == pid:  # it still leads its own group: end the group
                        os.killpg(pid, signal.SIGKILL)
                    else:
                        os.kill(pid, signal.SIGKILL)
                    ended += 1
                    log.info("ended agent process %d left behind by a bridge that is gone", pid)
            store.forget_process(pid, started)
        store.left_behind = []
        return ended

    return await anyio.to_thread.run_sync(end)
