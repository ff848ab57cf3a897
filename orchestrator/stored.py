"""The sessions as the store keeps them: loaded and claimed on first use, read (``session.get``,
``session.result``, ``session.list``), and followed (``session.subscribe``: a replay from the
store, then the live log; a session another process owns is followed in the store).

docs/api.md "Resumable streams and durable sessions". ``Orchestrator.stored`` is the one
instance; the orchestrator's turns and closes load their sessions through it.

Must not import: ``bridge`` (except ``bridge.rpc``).
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskGroup
from msgspec import UNSET, UnsetType

from bridge.rpc.codec import loads
from bridge.rpc.errors import InvalidParams, LimitReached, NotFound
from orchestrator import foreign
from orchestrator.foreign import Foreign
from orchestrator.results import (
    SessionListEntry,
    SessionListResult,
    SessionSnapshot,
    SubscribeResult,
    TurnSummary,
    UnsubscribeResult,
    title_of,
)
from orchestrator.sessions import Listener, Session, SessionTable
from orchestrator.store import SessionRecord, Store
from orchestrator.turn import Turn

log = logging.getLogger(__name__)
REPLAY_CHUNK = 512  # updates read from the store at a time by a resuming subscriber
REPLAY_BACKLOG = 4 * 1024 * 1024  # bytes a stream may have queued before a replay waits for it


class StoredSessions:
    """Loads, reads and follows the sessions of :class:`SessionTable` and the store.

    Args:
        sessions: the sessions in memory (the orchestrator's).
        store: the session store, or None (memory only: what is not in memory is unknown).
    """

    def __init__(self, sessions: SessionTable, store: Store | None) -> None:
        self.sessions = sessions
        self.store = store
        self._loading: dict[tuple[str, str], _Loading] = {}
        self._following: dict[tuple[str, str, str], foreign.Follower] = {}  # (stream, principal, session)
        self._tg: TaskGroup | None = None

    def start(self, tg: TaskGroup) -> None:
        """Loads and store followers run in ``tg`` (the orchestrator's task group) from now on."""
        self._tg = tg

    async def load(
        self, principal: str, session_id: str, *, claim: bool, create: bool = False
    ) -> Session | Foreign | None:
        """The principal's session: in memory; else, with ``claim`` (turns, subscriptions,
        close), loaded from the store and owned by this process, or a :class:`Foreign` with its
        owner when another live process owns it; else (reads) a :class:`Foreign` read from the
        store, claiming nothing. ``create``: claim the session even when the store does not
        have it (a turn will make it). Callers that wait for the same load resume in the order
        they asked (admission order holds).

        Raises:
            LimitReached: -32006, no room to load it (``maxSessionsPerToken``, all busy).
        """
        key = (principal, session_id)
        while True:
            session = self.sessions.get(session_id, principal)
            if session is not None or self.store is None:
                return session
            if not claim:
                if (in_flight := self._loading.get(key)) is not None:  # a turn read before may open it
                    await in_flight.done.wait()
                    continue
                await self.store.flush()  # what this process wrote (an unloaded session's last turn)
                record = await self.store.load_session(principal, session_id)
                return Foreign(record) if record is not None else None
            loading = self._loading.get(key)
            if loading is None:
                loading = self._loading[key] = _Loading(create)
                assert self._tg is not None, "use the Orchestrator as an async context manager"
                self._tg.start_soon(self._fetch, principal, session_id, loading)
            await loading.done.wait()
            if loading.error is not None:
                raise loading.error
            if loading.foreign is not None:
                return loading.foreign
            if not create or loading.create:
                return self.sessions.get(session_id, principal)
            # a load that claims no unknown session was in flight: claim it now

    def opening(self, principal: str, session_id: str) -> anyio.Event | None:
        """Set once the session's load ends, when a turn (``session.start``/``session.message``)
        is loading it now (the turn is admitted as soon as the load ends); else None. Who waits
        for it resumes after the turn (waiters resume in the order they asked)."""
        loading = self._loading.get((principal, session_id))
        return loading.done if loading is not None and loading.create else None

    async def _fetch(self, principal: str, session_id: str, loading: _Loading) -> None:
        store = self.store
        assert store is not None
        claimed = False
        try:
            record = None
            if not loading.create:  # claims no session the store does not have
                await store.flush()  # what this process wrote (an unloaded session's last turn) is readable
                if (record := await store.load_session(principal, session_id)) is None:
                    return
            # the claim commits what this process queued before it, and records the running
            # turns of an owner that is gone: read after it, the record has both
            claim = await store.claim(principal, session_id)
            if record is None or claim.took_over:
                record = await store.load_session(principal, session_id)
            if claim.owner_pid is not None:
                record = record or SessionRecord(principal=principal, session_id=session_id, thread_id=session_id)
                loading.foreign = Foreign(record, claim.owner_pid, claim.owner_started)
                return
            claimed = True
            if claim.took_over:  # its owner is gone: end the agents it left
                await store.end_left_behind(look_again=True)
            if record is not None and self.sessions.get(session_id, principal) is None:
                followers = await self._stop_following(Foreign(record))
                session = self.sessions.open(session_id, principal, record.thread_id, record=record)
                for follower in followers:  # they go on with the session's own log, from where they were
                    self._subscribe_stream(session, follower.listener)
        except LimitReached as exc:  # no room to load it (maxSessionsPerToken, all busy): -32006
            loading.error = exc
        except Exception:
            log.exception("loading session %s from the store failed", session_id[:80])
        finally:
            # claimed but not loaded (a turn on an unknown id opens it itself, unless refused here)
            refused = not loading.create or loading.error is not None
            if claimed and refused and self.sessions.get(session_id, principal) is None:
                store.release(principal, session_id)  # nobody here owns it
            self._loading.pop((principal, session_id), None)
            loading.done.set()

    async def _stop_following(self, session: Foreign) -> list[foreign.Follower]:
        """End the store followers of ``session`` (this process has just taken it): each is
        given what the store logged after its cursor, so it can go on with the in-memory log."""
        assert self.store is not None
        record = session.record
        followers = [
            self._following.pop(key)
            for key in list(self._following)
            if key[1] == record.principal and key[2] == record.session_id
        ]
        for follower in followers:
            follower.scope.cancel()
            await foreign.replay(self.store, session, follower)
        return followers

    def _subscribe_stream(self, session: Session, listener: Listener) -> None:
        """``listener`` receives the session's updates until its stream closes or unsubscribes."""
        assert listener.closers is not None
        if session.log.attach(listener.key, listener.deliver, "subscribe"):
            log_ = session.log
            listener.closers.append(lambda: log_.detach(listener.key))

    async def known(self, principal: str, session_id: str, *, claim: bool = False) -> Session | Foreign:
        session = await self.load(principal, session_id, claim=claim)
        if session is None:
            raise NotFound("unknown session", sessionId=session_id[:200])
        return session

    async def get(self, session_id: str, principal: str) -> SessionSnapshot:
        """``session.get``: the session's state, provider, session-level state, turns (newest
        first) and ``lastSeq``.

        Raises:
            NotFound: -32004, no such session for this principal (another's is unknown too).
        """
        session = await self.known(principal, session_id)
        if isinstance(session, Foreign):
            assert self.store is not None
            return await foreign.snapshot(self.store, session)
        return await self.snapshot(session)

    async def history(self, session_id: str, principal: str) -> list[tuple[str, str]]:
        """The session's stored conversation, oldest first: ``(role, text)`` with role ``user``
        or ``assistant`` (editor mode's ``session/load`` replays it).

        Raises:
            NotFound: -32004, no such session for this principal.
        """
        session = await self.known(principal, session_id)
        return list(session.record.history if isinstance(session, Foreign) else session.history)

    def running_turn(self, session_id: str, principal: str) -> tuple[str, int] | None:
        """The running turn of a loaded session: its prompt and the ``seq`` of its first update
        (editor mode's ``session/load`` replays it), or None."""
        session = self.sessions.get(session_id, principal)
        turn = session.active if session is not None else None
        if turn is None or turn.first_seq is None:
            return None
        return turn.prompt, turn.first_seq

    async def snapshot(self, session: Session) -> SessionSnapshot:
        turns: list[TurnSummary] = []
        if self.store is not None:
            await self.store.flush()
            stored = await self.store.turns(session.owner, session.session_id, self.store.retention.max_turn_results)
            turns = [
                TurnSummary(
                    turn_id=t.turn_id, status=t.status, started_at=t.started_at, ended_at=t.ended_at, summary=t.summary
                )
                for t in stored
            ]
        state = "running" if session.busy else "closed" if session.closed else "idle"
        return SessionSnapshot(
            session_id=session.session_id,
            thread_id=session.thread_id,
            state=state,
            provider_id=session.provider_id or session.provider_id_before,
            working_directory=session.working_directory,
            session_state={k: v for k, v in session.state.items() if v is not None},
            turns=turns,
            last_seq=session.log.last_seq,
            created_at=session.created_at,
            title=title_of(session.state),
        )

    async def subscribe(
        self, session_id: str, principal: str, listener: Listener, after_seq: int | None, *, until_idle: bool
    ) -> SubscribeResult:
        """``session.subscribe``: replay the logged updates after ``after_seq`` to ``listener``,
        then deliver the live ones, each once, in order (docs/api.md "Resumable streams").

        ``until_idle`` (SSE, whose response ends the stream): answer once the running turn ended,
        with its result. A stream without ``closers`` (plain HTTP) cannot subscribe: the answer
        has ``subscribed: false`` and the snapshot.

        Raises:
            NotFound: -32004, no such session for this principal.
        """
        session = await self.known(principal, session_id, claim=listener.closers is not None)
        if isinstance(session, Foreign):
            return await self._follow(session, listener, after_seq, until_idle=until_idle)
        if listener.closers is None:
            snapshot = await self.snapshot(session)
            return SubscribeResult(subscribed=False, last_seq=snapshot.last_seq, state=snapshot)
        gap: bool | UnsetType = UNSET
        first: int | UnsetType = UNSET
        if after_seq is not None and not session.log.listening(listener.key):
            missed = await self._replay(session, listener, after_seq)
            if missed is not None:
                gap, first = True, missed
        self._subscribe_stream(session, listener)
        running = session.active
        result: dict[str, Any] | UnsetType = UNSET
        if until_idle and isinstance(running, Turn):
            await running.ended.wait()
            if running.result is not None:
                result = msgspec.to_builtins(running.result)
        snapshot = await self.snapshot(session)
        return SubscribeResult(
            subscribed=True, last_seq=snapshot.last_seq, state=snapshot, gap=gap, first_seq=first, result=result
        )

    async def _follow(
        self, session: Foreign, listener: Listener, after_seq: int | None, *, until_idle: bool
    ) -> SubscribeResult:
        """``session.subscribe`` to a session another process owns: its log is followed in the
        store (``orchestrator.foreign.tail``) until the stream closes or unsubscribes; over SSE
        until its running turn ends, with that turn's result."""
        store = self.store
        assert store is not None and self._tg is not None
        record = session.record
        if listener.closers is None:
            snapshot = await foreign.snapshot(store, session)
            return SubscribeResult(subscribed=False, last_seq=snapshot.last_seq, state=snapshot)
        gap: bool | UnsetType = UNSET
        first: int | UnsetType = UNSET
        cursor = record.last_seq if after_seq is None else after_seq
        oldest = await store.first_seq(record.principal, record.session_id)
        if after_seq is not None and oldest is not None and oldest > after_seq + 1 and after_seq < record.last_seq:
            gap, first = True, oldest
        result: dict[str, Any] | UnsetType = UNSET
        if until_idle:
            await foreign.tail(store, session, foreign.Follower(listener, cursor), until_idle=True)
            stored = await store.turns(record.principal, record.session_id, 1)
            ended = await store.turn(record.principal, record.session_id, stored[0].turn_id) if stored else None
            if ended is not None and ended.result is not None:
                result = ended.result
        elif (key := (listener.key, record.principal, record.session_id)) not in self._following:
            follower = self._following[key] = foreign.Follower(listener, cursor)
            listener.closers.append(follower.scope.cancel)

            async def follow() -> None:
                try:
                    with follower.scope:
                        await foreign.tail(store, session, follower, until_idle=False)
                except Exception:  # a failed read ends this follow, never the orchestrator's task group
                    log.exception("following session %s in the store failed", record.session_id[:80])
                finally:
                    if self._following.get(key) is follower:
                        del self._following[key]

            self._tg.start_soon(follow)
        snapshot = await foreign.snapshot(store, session)
        return SubscribeResult(
            subscribed=True, last_seq=snapshot.last_seq, state=snapshot, gap=gap, first_seq=first, result=result
        )

    async def _replay(self, session: Session, listener: Listener, after_seq: int) -> int | None:
        """Deliver the logged updates after ``after_seq``: from the store while the memory's tail
        does not reach back that far, then from the tail. Returns the oldest ``seq`` kept when
        updates after ``after_seq`` were already pruned (a jump in the numbering after a crash is
        no gap: nothing was given in it). Ends synchronously with the tail, so the caller
        attaches the listener with nothing in between."""
        store = self.store
        oldest = session.log.first_kept
        if store is not None:
            await store.flush()
            stored = await store.first_seq(session.owner, session.session_id)
            oldest = stored if stored is not None else oldest
        missed = oldest if oldest is not None and oldest > after_seq + 1 and after_seq < session.log.last_seq else None
        cursor = after_seq
        for passes in range(64):  # each pass catches up with what was appended meanwhile
            kept = session.log.first_kept
            if kept is None:  # nothing in memory (a session loaded again): the store has it all
                kept = session.log.numbered + 1
            if store is None or cursor >= kept - 1:
                break
            if passes:  # what was appended during the last pass (the first was flushed above)
                await store.flush()
            rows = await store.read_updates(session.owner, session.session_id, cursor, kept, REPLAY_CHUNK)
            if not rows:
                cursor = kept - 1
                break
            for seq, body in rows:
                listener.deliver(loads(body))
                cursor = seq
            while listener.backlog() > REPLAY_BACKLOG:  # let the stream drain before the next chunk
                await anyio.sleep(0.01)
        for _seq, body in session.log.kept_after(cursor):
            listener.deliver(loads(body))
        return missed

    def unsubscribe(self, session_id: str, principal: str, key: str) -> UnsubscribeResult:
        """``session.unsubscribe``: this stream stops receiving the session's updates."""
        session = self.sessions.get(session_id, principal)
        listening = session is not None and session.log.listening(key)
        if (following := self._following.pop((key, principal, session_id), None)) is not None:
            following.scope.cancel()
            listening = True
        if session is not None:
            session.log.detach(key, "subscribe")
            session.log.detach(key, "stream")
        return UnsubscribeResult(accepted=True, unsubscribed=listening)

    async def turn_result(self, session_id: str, principal: str, turn_id: str | None) -> dict[str, Any]:
        """``session.result``: the full result of a finished turn, or the state of a running one;
        ``turn_id`` None names the session's latest turn (the running one, else the newest kept).

        Raises:
            NotFound: -32004, no such session or turn (pruned turns are unknown), or no turn yet.
        """
        session = await self.known(principal, session_id)
        active = session.active if isinstance(session, Session) else None  # admitted: running, or about to
        for turn in session.turns if isinstance(session, Session) else ():
            if not isinstance(turn, Turn) or turn.result is not None:
                continue
            if (turn is active) if turn_id is None else (turn.planned_turn_id == turn_id):
                return {
                    "sessionId": session_id,
                    "turnId": turn.planned_turn_id,
                    "status": "running",
                    "output": turn.output,
                }
        if self.store is None:
            raise NotFound(
                ("unknown turn" if turn_id else "the session has no running turn") + _UNKEPT,
                sessionId=session_id[:200],
                **({"turnId": turn_id[:200]} if turn_id else {}),
            )
        await self.store.flush()
        if turn_id is None:
            if not (newest := await self.store.turns(principal, session_id, 1)):
                raise NotFound("the session has no turn yet", sessionId=session_id[:200])
            turn_id = newest[0].turn_id
        record = await self.store.turn(principal, session_id, turn_id)
        if record is None:
            raise NotFound("unknown turn", sessionId=session_id[:200], turnId=turn_id[:200])
        if record.result is None:
            return {"sessionId": session_id, "turnId": turn_id, "status": record.status, "output": ""}
        return record.result

    async def list_sessions(self, principal: str, cursor: str | None, limit: int) -> SessionListResult:
        """``session.list``: the principal's sessions, most recently active first, ``limit`` at a
        time; ``nextCursor`` (opaque) asks for the next page.

        Raises:
            InvalidParams: -32602, a cursor this bridge did not give.
        """
        before = _decode_cursor(cursor)
        entries: list[SessionListEntry] = []
        if self.store is not None:
            await self.store.flush()
            records = await self.store.list_sessions(principal, before, limit + 1)
            for record in records[:limit]:
                live = self.sessions.get(record.session_id, principal)
                busy = live.busy if live is not None else record.running  # another process's turn
                state = "running" if busy else "closed" if record.closed else "idle"
                entries.append(
                    SessionListEntry(
                        session_id=record.session_id,
                        thread_id=record.thread_id,
                        state=state,
                        provider_id=record.provider_id,
                        created_at=record.created_at,
                        updated_at=record.updated_at,
                        title=title_of(record.state),
                        working_directory=record.working_directory,
                    )
                )
            more = len(records) > limit
        else:
            offset = int(before[0]) if before is not None else 0  # memory only: a cursor is an offset
            live = sorted((s for s in self.sessions if s.owner == principal), key=lambda s: s.last_active, reverse=True)
            for session in live[offset : offset + limit]:
                entries.append(
                    SessionListEntry(
                        session_id=session.session_id,
                        thread_id=session.thread_id,
                        state="running" if session.busy else "idle",
                        provider_id=session.provider_id,
                        created_at=session.created_at,
                        updated_at=session.created_at,
                        working_directory=session.working_directory,
                    )
                )
            if len(live) > offset + limit:
                return SessionListResult(sessions=entries, next_cursor=_encode(float(offset + limit), ""))
            more = False
        last = entries[-1] if entries and more else None
        return SessionListResult(sessions=entries, next_cursor=_encode_cursor(last) if last else None)


def _encode_cursor(entry: SessionListEntry) -> str:
    return _encode(entry.updated_at, entry.session_id)


def _encode(updated_at: float, session_id: str) -> str:
    import base64

    raw = msgspec.json.encode([updated_at, session_id])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str | None) -> tuple[float, str] | None:
    if not cursor:
        return None
    import base64

    try:
        updated, session_id = msgspec.json.decode(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        return float(updated), str(session_id)
    except (ValueError, TypeError, msgspec.DecodeError) as exc:
        raise InvalidParams("Invalid params: unknown cursor", field="cursor") from exc


_UNKEPT = " (finished turns are kept only with persistSessions: true)"


class _Loading:
    """One load of a session from the store, shared by every caller that asks meanwhile."""

    __slots__ = ("create", "done", "error", "foreign")

    def __init__(self, create: bool) -> None:
        self.create = create
        self.done = anyio.Event()
        self.error: LimitReached | None = None
        self.foreign: Foreign | None = None
