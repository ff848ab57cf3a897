"""Sessions another live bridge process owns (docs/api.md "Several processes on one state
directory").

Several bridges may share a state directory (each editor window starts its own ``acp-stdio``
beside a running ``serve``). Each session is owned by one process at a time
(``orchestrator.store.SqliteStore.claim``); the others read it from the store: its snapshot, its
turns and results, its history, and its update log, which :func:`tail` follows by polling (the
owner writes it in groups every ``store.LINGER``), so a second process can subscribe too. Only
the owner runs turns on it or closes it; another process answers those with -32005
``SESSION_BUSY``, ``data.reason: "owned_elsewhere"`` and ``data.ownerPid``.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``compat``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import msgspec

from bridge.rpc.codec import loads
from bridge.rpc.errors import SessionBusy
from orchestrator.results import SessionSnapshot, TurnSummary, title_of
from orchestrator.store import process_alive

if TYPE_CHECKING:
    from orchestrator.sessions import Listener
    from orchestrator.store import SessionRecord, Store

POLL = 0.25
"""Seconds between two reads of a followed log: the owner commits its updates every
``store.LINGER`` (0.1 s), so an update reaches a second process's subscriber within ~0.35 s."""
READ_CHUNK = 500  # updates read per query
TURNS_SHOWN = 100


class Foreign(msgspec.Struct, frozen=True):
    """A session as the store has it, not loaded in this process: owned by the live process
    ``owner_pid`` (started at ``owner_started``, seconds since the epoch), or read without
    claiming it (``owner_pid`` None: ``session.get``, ``session.result`` and the history
    claim no session)."""

    record: SessionRecord
    owner_pid: int | None = None
    owner_started: float = 0.0

    def refuse(self, what: str) -> SessionBusy:
        """-32005 for ``what`` (``a turn``, ``closing``): only the owner may."""
        return SessionBusy(
            f"{what} needs the session's owner: another bridge process on this state directory "
            f"(pid {self.owner_pid}) has it; send it there, or retry here once that process has stopped",
            reason="owned_elsewhere",
            ownerPid=self.owner_pid,
            sessionId=self.record.session_id[:200],
        )

    def owner_gone(self) -> bool:
        """Its owner no longer runs (or its pid is another process's now)."""
        return self.owner_pid is not None and not process_alive(self.owner_pid, self.owner_started)


class Follower:
    """One stream following a foreign session's log: its cancel scope and the last ``seq``
    delivered to it (the orchestrator hands the stream over to the session's in-memory log,
    from that ``seq``, when this process takes the session)."""

    __slots__ = ("cursor", "listener", "scope")

    def __init__(self, listener: Listener, cursor: int) -> None:
        self.listener = listener
        self.cursor = cursor
        self.scope = anyio.CancelScope()


async def snapshot(store: Store, foreign: Foreign) -> SessionSnapshot:
    """``session.get`` of a foreign session, read afresh (its owner writes it meanwhile):
    ``running`` while the store has a turn that has not ended."""
    await store.flush()
    record = await store.load_session(foreign.record.principal, foreign.record.session_id) or foreign.record
    stored = await store.turns(record.principal, record.session_id, TURNS_SHOWN)
    running = any(t.ended_at is None for t in stored)
    return SessionSnapshot(
        session_id=record.session_id,
        thread_id=record.thread_id,
        state="running" if running else "closed" if record.closed else "idle",
        provider_id=record.provider_id,
        working_directory=record.working_directory,
        session_state={k: v for k, v in record.state.items() if v is not None},
        turns=[
            TurnSummary(
                turn_id=t.turn_id, status=t.status, started_at=t.started_at, ended_at=t.ended_at, summary=t.summary
            )
            for t in stored
        ],
        last_seq=record.last_seq,
        created_at=record.created_at,
        title=title_of(record.state),
    )


async def replay(store: Store, foreign: Foreign, follower: Follower) -> None:
    """Deliver the stored updates after ``follower.cursor``, in order, advancing it."""
    record = foreign.record
    while True:
        rows = await store.read_updates(record.principal, record.session_id, follower.cursor, None, READ_CHUNK)
        for seq, body in rows:
            follower.listener.deliver(loads(body))
            follower.cursor = seq
        if len(rows) < READ_CHUNK:
            return


async def tail(store: Store, foreign: Foreign, follower: Follower, *, until_idle: bool) -> None:
    """Follow the session's log: deliver each new update once, in order, every :data:`POLL`
    seconds, until cancelled (the stream closed or unsubscribed, or this process took the
    session) or, with ``until_idle``, until no turn runs and every update it logged was
    delivered. An owner found gone while its turn runs is replaced for a moment, which records
    that turn ``BRIDGE_RESTARTED`` (so the follow ends instead of waiting for a turn nobody
    runs), and the session is left to whoever loads it next."""
    record = foreign.record
    recovered = False
    while True:
        await replay(store, foreign, follower)
        if until_idle or not recovered:
            running = any(t.ended_at is None for t in await store.turns(record.principal, record.session_id, 1))
            if running and not recovered and foreign.owner_gone():
                recovered = True
                if (await store.claim(record.principal, record.session_id)).owner_pid is None:
                    store.release(record.principal, record.session_id)
                await store.end_left_behind(look_again=True)  # the agents the gone owner left
                continue
            if until_idle and not running:
                await store.flush()
                return await replay(store, foreign, follower)  # what it logged before it ended
        await anyio.sleep(POLL)  # another process writes this log: the store is read on a clock
