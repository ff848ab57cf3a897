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

import math
from typing import TYPE_CHECKING

import anyio
import msgspec

from bridge.rpc.codec import loads
from bridge.rpc.errors import SessionBusy
from orchestrator.results import SessionSnapshot, TurnSummary, title_of

if TYPE_CHECKING:
    from orchestrator.sessions import Listener
    from orchestrator.store import SessionRecord, Store

POLL = 0.25
"""Seconds between two reads of a followed log: the owner commits its updates every
``store.LINGER`` (0.1 s), so an update reaches a second process's subscriber within ~0.35 s."""
READ_CHUNK = 500  # updates read per query
TURNS_SHOWN = 100


class Foreign(msgspec.Struct, frozen=True):
    """A session as the store has it, owned by the live process ``owner_pid``."""

    record: SessionRecord
    owner_pid: int

    def refuse(self, what: str) -> SessionBusy:
        """-32005 for ``what`` (``a turn``, ``closing``): only the owner may."""
        return SessionBusy(
            f"{what} needs the session's owner: another bridge process on this state directory "
            f"(pid {self.owner_pid}) has it; continue there, or once that process has ended",
            reason="owned_elsewhere",
            ownerPid=self.owner_pid,
            sessionId=self.record.session_id[:200],
        )


async def snapshot(store: Store, foreign: Foreign) -> SessionSnapshot:
    """``session.get`` of a foreign session: ``running`` while the store has a turn that has not
    ended."""
    record = foreign.record
    await store.flush()
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


async def replay(store: Store, foreign: Foreign, listener: Listener, after_seq: int, until: float = math.inf) -> int:
    """Deliver the stored updates with ``after_seq < seq < until``, in order; returns the last
    ``seq`` delivered (``after_seq`` when none)."""
    record, cursor = foreign.record, after_seq
    while True:
        rows = await store.read_updates(record.principal, record.session_id, cursor, None, READ_CHUNK)
        for seq, body in rows:
            if seq >= until:
                return cursor
            listener.deliver(loads(body))
            cursor = seq
        if len(rows) < READ_CHUNK:
            return cursor


async def tail(store: Store, foreign: Foreign, listener: Listener, cursor: int, *, until_idle: bool) -> int:
    """Follow the session's log from ``cursor``: deliver each new update once, in order, every
    :data:`POLL` seconds, until cancelled (the stream closed or unsubscribed) or, with
    ``until_idle``, until no turn runs and every update it logged was delivered. Returns the
    last ``seq`` delivered."""
    record = foreign.record
    while True:
        cursor = await replay(store, foreign, listener, cursor)
        if until_idle:
            stored = await store.turns(record.principal, record.session_id, 1)
            if not any(t.ended_at is None for t in stored):
                return await replay(store, foreign, listener, cursor)  # what it logged before it ended
        await anyio.sleep(POLL)  # another process writes this log: the store is read on a clock
