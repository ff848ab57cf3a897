"""The session store and the update log under load and under any interleaving: concurrent turns
write while others read, subscribers resume from any cursor, seq never repeats across restarts."""

from __future__ import annotations

import logging
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compat.settings import Limits, Timeouts
from orchestrator.models import TurnParams
from orchestrator.registry import ProviderRegistry
from orchestrator.service import Orchestrator
from orchestrator.sessions import StreamListener
from orchestrator.store import SEQ_BLOCK, SqliteStore
from tests.helpers import in_background
from tests.orchestrator.fake_adapter import FakeAdapter


def orchestrator(path: Path, **limits: Any) -> Orchestrator:
    registry = ProviderRegistry({"fake": FakeAdapter("fake")}, {"fake"})
    store = SqliteStore(path / "state" / "sessions.db")
    return Orchestrator(registry, [path.resolve()], Limits(**limits), Timeouts(), store=store)


def params(prompt: str, session: str) -> TurnParams:
    return TurnParams.model_validate({"sessionId": session, "taskPrompt": prompt})


class Stream:
    """A stream's view of one session: the updates delivered to it."""

    def __init__(self, key: str) -> None:
        self.got: list[dict[str, Any]] = []
        self.closers: list[Any] = []
        self.listener = StreamListener(lambda _m, p: self.got.append(p), key, self.closers)

    def close(self) -> None:
        while self.closers:
            self.closers.pop()()


async def test_fifty_concurrent_turns_while_another_stream_lists_and_subscribes(tmp_path, caplog):
    caplog.set_level(logging.ERROR)
    async with in_background(orchestrator(tmp_path)) as orch:
        watchers = {f"s{i}": Stream(f"watch-{i}") for i in range(0, 50, 5)}
        listed: list[int] = []

        async def turns(session: str) -> None:
            for n in range(3):
                await orch.run_turn(
                    params(f"echo {session} {n} a b c d", session), "local", lambda *_: None, start=n == 0
                )

        async def reader() -> None:
            for _ in range(20):
                page = await orch.stored.list_sessions("local", None, 200)
                listed.append(len(page.sessions))
                for session, stream in watchers.items():
                    if orch.sessions.get(session, "local") is not None and not stream.got:
                        await orch.stored.subscribe(session, "local", stream.listener, 0, until_idle=False)
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(turns, f"s{i}")
            tg.start_soon(reader)
        assert orch.store is not None
        await orch.store.flush()
        for i in range(50):
            stored = await orch.store.read_updates("local", f"s{i}", 0, None, 10_000)
            seqs = [seq for seq, _ in stored]
            assert (
                seqs == list(range(1, len(seqs) + 1)) and len(seqs) == orch.sessions.get(f"s{i}", "local").log.last_seq
            )
        for session, stream in watchers.items():
            if stream.got:  # it subscribed from 0 while the turns ran: the whole log, once each
                seqs = [u["seq"] for u in stream.got]
                assert seqs == list(range(1, orch.sessions.get(session, "local").log.last_seq + 1))
        assert len((await orch.stored.list_sessions("local", None, 200)).sessions) == 50
    assert listed
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no lock errors, no dropped write


async def test_seq_never_repeats_after_a_crash_and_continues_exactly_after_a_clean_stop(tmp_path):
    path = tmp_path / "sessions.db"
    async with SqliteStore(path) as store:
        from orchestrator.sessions import Session

        session = Session("s1", "local", "s1", store=store)
        for i in range(3):
            session.log.append({"type": "delta", "delta": str(i)})
        await store.flush()  # a crash after this: the reservation is durable, the close is not
    async with SqliteStore(path) as store:
        record = await store.load_session("local", "s1")
        assert record is not None and record.next_seq == 2 * SEQ_BLOCK + 1  # past a block beyond the reserved one
        used = record.next_seq
        from orchestrator.sessions import Session

        again = Session("s1", "local", "s1", store=store, record=record)
        again.log.append({"type": "delta", "delta": "x"})
        again.close_log()
    async with SqliteStore(path) as store:
        record = await store.load_session("local", "s1")
        assert record is not None and record.next_seq == used + 1  # a clean stop: right after the last


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(1, 40)),
            st.tuples(st.just("subscribe"), st.integers(0, 3), st.integers(0, 120)),
            st.tuples(st.just("close"), st.integers(0, 3)),
        ),
        max_size=30,
    )
)
def test_any_interleaving_gives_each_subscriber_exactly_the_updates_after_its_cursor(tmp_path, steps):
    """Appends, subscribes from any cursor (the memory keeps only 8 updates: the rest come from
    the store) and streams closing, in any order: each subscription gets every update after its
    cursor, in order, once, until its stream closes."""

    async def main() -> None:
        # A state directory of its own per example: id(steps) was reused once an example's list
        # was freed, and the next example then replayed the last one's stored updates (the
        # intermittent failure of this test).
        async with in_background(orchestrator(Path(tempfile.mkdtemp(dir=tmp_path)))) as orch:
            from orchestrator.sessions import UpdateLog

            session = orch.sessions.open("s1", "local", "s1")
            session.log = UpdateLog(capacity=8, max_bytes=1 << 20, persist=session.log._persist)
            streams: dict[int, tuple[Stream, int]] = {}  # stream -> (its view, the seq it resumed after)
            ended: dict[int, tuple[Stream, int, int]] = {}
            for step in steps:
                if step[0] == "append":
                    for _ in range(step[1]):
                        session.log.append({"type": "delta", "delta": "x"})
                elif step[0] == "subscribe" and step[1] not in streams:
                    stream = Stream(f"k{step[1]}-{len(ended)}")
                    after = min(step[2], session.log.last_seq)
                    await orch.stored.subscribe("s1", "local", stream.listener, after, until_idle=False)
                    streams[step[1]] = (stream, after)
                elif step[0] == "close" and step[1] in streams:
                    stream, after = streams.pop(step[1])
                    stream.close()
                    ended[len(ended)] = (stream, after, session.log.last_seq)
            for stream, after in streams.values():
                ended[len(ended)] = (stream, after, session.log.last_seq)
            for stream, after, last in ended.values():
                assert [u["seq"] for u in stream.got] == list(range(after + 1, last + 1))

    anyio.run(main)


async def test_a_session_unloaded_for_being_idle_is_loaded_again_with_its_log(tmp_path):
    async with in_background(orchestrator(tmp_path)) as orch:
        first = await orch.run_turn(params("echo one two", "s1"), "local", lambda *_: None, start=True)
        last = orch.sessions.get("s1", "local").log.last_seq
        assert orch.sessions.evict_idle(older_than=0) == 1 and orch.sessions.get("s1", "local") is None
        stream = Stream("late")
        answer = await orch.stored.subscribe("s1", "local", stream.listener, 0, until_idle=False)
        assert answer.last_seq == last and [u["seq"] for u in stream.got] == list(range(1, last + 1))
        assert answer.state.turns[0].turn_id == first.turn_id
        assert orjson.loads(orjson.dumps(stream.got[-1]))["type"] == "done"


async def stored_session(store: SqliteStore, principal: str, session_id: str, *, updates: int) -> None:
    """A session of ``principal`` with ``updates`` deltas of 2,000 bytes, committed."""
    from orchestrator.sessions import Session

    session = Session(session_id, principal, session_id, store=store)
    for _ in range(updates):
        session.log.append({"type": "delta", "delta": "x" * 2000})
    session.save()
    await store.flush()


async def test_pruning_past_state_max_bytes_keeps_the_newest_sessions_and_the_bound(tmp_path):
    """The database over stateMaxBytes loses its least recently active sessions, only as many as
    it takes (free pages are given back: they do not count)."""
    from orchestrator.store import Retention

    path = tmp_path / "sessions.db"
    async with SqliteStore(path, Retention(max_bytes=300_000)) as store:
        for i in range(12):
            await stored_session(store, "local", f"s{i}", updates=20)
        store.prune()
        await store.flush()
        kept = [r.session_id for r in await store.list_sessions("local", None, 100)]
    assert 0 < len(kept) < 12 and "s11" in kept and "s0" not in kept  # the newest stay
    async with SqliteStore(path, Retention(max_bytes=300_000)) as store:  # a restart prunes nothing more
        assert [r.session_id for r in await store.list_sessions("local", None, 100)] == kept


async def test_pruning_past_state_max_bytes_takes_from_the_principal_storing_the_most(tmp_path):
    """One token filling the database loses its own oldest sessions, not another token's older,
    smaller ones (one token never disturbs another's sessions)."""
    from orchestrator.store import Retention

    path = tmp_path / "sessions.db"
    async with SqliteStore(path, Retention(max_bytes=300_000)) as store:
        for i in range(2):  # alice's sessions are the oldest in the database
            await stored_session(store, "alice", f"a{i}", updates=1)
        for i in range(12):
            await stored_session(store, "mallory", f"m{i}", updates=20)
        store.prune()
        await store.flush()
        alice = [r.session_id for r in await store.list_sessions("alice", None, 100)]
        mallory = [r.session_id for r in await store.list_sessions("mallory", None, 100)]
    assert sorted(alice) == ["a0", "a1"]
    assert 0 < len(mallory) < 12 and "m11" in mallory and "m0" not in mallory


async def test_a_resume_from_before_a_crash_sees_no_gap_in_the_skipped_numbers(tmp_path):
    from orchestrator.sessions import Session

    path = tmp_path / "sessions.db"
    async with SqliteStore(path) as store:
        session = Session("s1", "local", "s1", store=store)
        for _ in range(5):
            session.log.append({"type": "delta", "delta": "x"})
        await store.flush()  # killed here: no clean close
    registry = ProviderRegistry({"fake": FakeAdapter("fake")}, {"fake"})
    orch = Orchestrator(registry, [tmp_path.resolve()], Limits(), Timeouts(), store=SqliteStore(path))
    async with in_background(orch):
        stream = Stream("late")
        answer = await orch.stored.subscribe("s1", "local", stream.listener, 3, until_idle=False)
        assert answer.last_seq == 5 and answer.gap is msgspec.UNSET  # nothing was given in the jump
        assert [u["seq"] for u in stream.got] == [4, 5]
        await orch.run_turn(params("echo again", "s1"), "local", stream.listener, start=False)
        assert stream.got[-1]["seq"] > 5 + SEQ_BLOCK  # past the reserved block: never a seq twice


async def test_past_the_principals_cap_a_read_still_works_and_a_subscribe_is_a_limit_error(tmp_path):
    """Reads are served from the store without loading the session (they count against no
    cap); a subscription loads it, and past maxSessionsPerToken that is -32006, not unknown."""
    from bridge.rpc.errors import LimitReached

    async with in_background(orchestrator(tmp_path, max_sessions_per_token=1)) as orch:
        await orch.run_turn(params("echo one", "s1"), "local", lambda *_: None, start=True)
        assert orch.sessions.evict_idle(older_than=0) == 1
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(orch.run_turn, params("hang", "s2"), "local", lambda *_: None, start=True))
            await anyio.wait_all_tasks_blocked()
            assert (await orch.stored.get("s1", "local")).state == "idle"
            listener = StreamListener(lambda *_: None, "stream-1", closers=[])
            try:
                await orch.stored.subscribe("s1", "local", listener, None, until_idle=False)
            except LimitReached as exc:
                assert exc.code == -32006
            else:
                raise AssertionError("loading past maxSessionsPerToken must fail -32006")
            orch.cancel("s2", "local")


async def test_listing_without_a_store_pages_too(tmp_path):
    registry = ProviderRegistry({"fake": FakeAdapter("fake")}, {"fake"})
    async with in_background(Orchestrator(registry, [tmp_path.resolve()], Limits(), Timeouts())) as orch:
        for i in range(3):
            await orch.run_turn(params("echo x", f"s{i}"), "local", lambda *_: None, start=True)
        first = await orch.stored.list_sessions("local", None, 2)
        rest = await orch.stored.list_sessions("local", first.next_cursor, 2)
    assert len(first.sessions) == 2 and first.next_cursor and len(rest.sessions) == 1 and rest.next_cursor is None
    assert {s.session_id for s in first.sessions + rest.sessions} == {"s0", "s1", "s2"}


async def test_a_start_refused_at_the_cap_leaves_no_session_claimed(tmp_path: Path) -> None:
    """A ``session.start`` refused with -32006 (``maxSessionsPerToken``, every session busy)
    claims nothing it keeps: neither an unknown id nor one only the store holds, so another
    process sharing the state directory may take it."""
    import sqlite3

    from bridge.rpc.errors import LimitReached

    async def owners(orch: Orchestrator) -> list[str]:
        assert orch.store is not None
        await orch.store.flush()
        with sqlite3.connect(orch.store.path) as conn:
            return sorted(row[0] for row in conn.execute("SELECT session_id FROM owners"))

    async with in_background(orchestrator(tmp_path, max_sessions_per_token=1)) as orch:
        await orch.run_turn(params("echo one", "s1"), "local", lambda *_: None, start=True)
        assert orch.sessions.evict_idle(older_than=0) == 1  # s1 now lives only in the store
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(orch.run_turn, params("hang", "s2"), "local", lambda *_: None, start=True))
            await anyio.wait_all_tasks_blocked()  # s2 is busy: the cap is reached
            for session_id in ("s3", "s1"):  # an unknown id, then one only the store holds
                with pytest.raises(LimitReached):
                    await orch.run_turn(params("echo two", session_id), "local", lambda *_: None, start=True)
            assert await owners(orch) == ["s2"]
            orch.cancel("s2", "local")
