"""Turns end the way ``orchestrator.machine`` says, whatever ends them, over an in-memory adapter:
cancel while starting, while running, and while the result is being finished; close while
queued; the turn timeout; the agent exiting while a permission request is pending; a provider
that raises; bridge shutdown; and never a turn with two ends."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from msgspec import UNSET

from bridge.rpc.errors import InvalidParams, NotFound, SessionBusy
from compat.base import TextDelta
from compat.settings import Limits, Timeouts
from orchestrator.models import PermissionParams, TurnParams
from orchestrator.registry import ProviderRegistry
from orchestrator.results import TurnResult
from orchestrator.service import Orchestrator
from orchestrator.turn import Turn, TurnInput
from tests.helpers import in_background
from tests.orchestrator.fake_adapter import FakeAdapter

WAIT = 10.0
pytestmark = pytest.mark.timeout(30)


class Client:
    """A connection's view: every update it was sent; ``on_update`` runs as each arrives."""

    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []
        self.on_update: Any = None
        self._changed = anyio.Event()

    def __call__(self, method: str, params: dict[str, Any]) -> None:
        self.updates.append(params)
        if self.on_update is not None:
            self.on_update(params)
        self._changed.set()

    async def wait_for(self, kind: str) -> dict[str, Any]:
        with anyio.fail_after(WAIT):
            while not (found := [u for u in self.updates if u["type"] == kind]):
                self._changed = anyio.Event()
                await self._changed.wait()
        return found[0]

    def dones(self) -> list[dict[str, Any]]:
        return [u for u in self.updates if u["type"] == "done"]


class Harness:
    def __init__(self, orch: Orchestrator, adapter: FakeAdapter, tg: anyio.abc.TaskGroup) -> None:
        self.orch, self.adapter, self.tg = orch, adapter, tg

    def start(self, prompt: str, session: str = "s1", *, message: bool = False) -> tuple[Client, Box]:
        client, box = Client(), Box()

        async def run() -> None:
            params = TurnParams.model_validate({"sessionId": session, "taskPrompt": prompt})
            box.result = await self.orch.run_turn(params, "local", client, start=not message)
            box.done.set()

        self.tg.start_soon(run)
        return client, box


class Box:
    def __init__(self) -> None:
        self.done = anyio.Event()
        self.result: TurnResult | Any = None

    async def wait(self) -> TurnResult:
        with anyio.fail_after(WAIT):
            await self.done.wait()
        return self.result


def orchestrator(tmp_path: Path, adapter: FakeAdapter, **timeouts: float) -> Orchestrator:
    registry = ProviderRegistry({"fake": adapter}, {"fake"})
    limits = Limits(max_output_bytes=1000, max_queued_turns=4)
    return Orchestrator(registry, [tmp_path.resolve()], limits, Timeouts(**{"cancel_grace": 0.5, **timeouts}))


async def test_cancel_while_starting_cuts_the_provider_off_at_once(tmp_path: Path) -> None:
    adapter = FakeAdapter()
    async with in_background(orchestrator(tmp_path, adapter)) as orch, anyio.create_task_group() as tg:
        client, box = Harness(orch, adapter, tg).start("slow-start")
        with anyio.fail_after(WAIT):
            await adapter.starting.wait()
        assert orch.cancel("s1", "local").cancelled is True
        result = await box.wait()
    assert result.status == "cancelled" and result.stop_reason == "cancelled"
    assert adapter.sessions[0].cut_off == 1  # no graceful stop before the work began: cut off
    assert [u["type"] for u in client.updates] == ["status", "done"]  # started, then one done


async def test_cancel_while_running_is_graceful_when_the_provider_stops(tmp_path: Path) -> None:
    adapter = FakeAdapter()
    async with in_background(orchestrator(tmp_path, adapter)) as orch, anyio.create_task_group() as tg:
        client, box = Harness(orch, adapter, tg).start("hang")
        await client.wait_for("delta")
        assert orch.cancel("s1", "local").cancelled is True
        result = await box.wait()
    assert result.status == "cancelled" and result.output == "partial"
    assert adapter.sessions[0].cut_off == 0  # it stopped within cancelGrace


async def test_a_provider_that_ignores_the_cancel_is_cut_off_after_the_grace(tmp_path: Path) -> None:
    adapter = FakeAdapter()
    async with in_background(orchestrator(tmp_path, adapter)) as orch, anyio.create_task_group() as tg:
        client, box = Harness(orch, adapter, tg).start("ignore-cancel")
        await client.wait_for("delta")
        orch.cancel("s1", "local")
        result = await box.wait()
    assert result.status == "cancelled" and adapter.sessions[0].cut_off == 1


async def test_a_cancel_read_while_the_result_is_being_finished_changes_nothing(tmp_path: Path) -> None:
    """The outcome is known once the provider answered: a cancel arriving as the done update goes
    out answers ``cancelled: false`` and the turn ends as the provider said."""
    adapter = FakeAdapter()
    answers: list[Any] = []
    async with in_background(orchestrator(tmp_path, adapter)) as orch, anyio.create_task_group() as tg:
        client, box = Harness(orch, adapter, tg).start("echo hi")
        client.on_update = lambda u: answers.append(orch.cancel("s1", "local")) if u["type"] == "done" else None
        result = await box.wait()
    assert answers and answers[0].cancelled is False
    assert result.status == "completed" and len(client.dones()) == 1


async def test_close_while_queued_ends_the_queued_turn_before_it_started(tmp_path: Path) -> None:
    adapter = FakeAdapter()
    async with in_background(orchestrator(tmp_path, adapter)) as orch, anyio.create_task_group() as tg:
        harness = Harness(orch, adapter, tg)
        running, first = harness.start("hang")
        await running.wait_for("delta")
        queued, second = harness.start("echo never", message=True)
        await anyio.wait_all_tasks_blocked()
        closed = await orch.close("s1", "local")
        results = [await first.wait(), await second.wait()]
    assert closed.closed is True
    assert results[0].status == "cancelled" and results[0].turn_id is not None
    assert results[1].status == "cancelled" and results[1].turn_id is None
    # it never started: its stream saw only the running turn's updates (one session, one log)
    assert results[1].error.code == "CANCELLED"
    assert {u["turnId"] for u in queued.updates} == {results[0].turn_id}
    assert adapter.sessions[0].closed


async def test_the_turn_timeout_ends_the_turn_as_timeout(tmp_path: Path) -> None:
    adapter = FakeAdapter()
    async with (
        in_background(orchestrator(tmp_path, adapter, turn_timeout=0.2)) as orch,
        anyio.create_task_group() as tg,
    ):
        client, box = Harness(orch, adapter, tg).start("ignore-cancel")
        result = await box.wait()
    assert result.status == "timeout" and result.error.code == "TURN_TIMEOUT"
    assert result.output == "partial" and len(client.dones()) == 1


async def test_the_agent_exiting_while_a_permission_is_pending_fails_the_turn_and_drops_the_request(
    tmp_path: Path,
) -> None:
    adapter = FakeAdapter()
    async with in_background(orchestrator(tmp_path, adapter)) as orch, anyio.create_task_group() as tg:
        client, box = Harness(orch, adapter, tg).start("ask-then-exit")
        asked = await client.wait_for("permission")
        adapter.asked.set()
        result = await box.wait()
        with pytest.raises(NotFound):  # answering it now: it no longer exists
            orch.permission(
                PermissionParams.model_validate(
                    {"sessionId": "s1", "requestId": asked["requestId"], "optionId": "yes"}
                ),
                "local",
            )
    assert result.status == "failed" and result.error.code == "AGENT_EXITED"
    assert orch.sessions.get("s1", "local").permissions == {}


async def test_a_provider_that_raises_fails_only_its_own_turn(tmp_path: Path) -> None:
    adapter = FakeAdapter()
    async with in_background(orchestrator(tmp_path, adapter)) as orch, anyio.create_task_group() as tg:
        harness = Harness(orch, adapter, tg)
        _, box = harness.start("raise")
        result = await box.wait()
        _, after = harness.start("echo still serving", session="s2")
        later = await after.wait()
    assert result.status == "failed" and result.error.code == "INTERNAL_ERROR"
    assert later.status == "completed"


async def test_shutdown_ends_running_turns_with_a_done_update(tmp_path: Path) -> None:
    adapter = FakeAdapter()
    async with anyio.create_task_group() as tg:
        async with in_background(orchestrator(tmp_path, adapter)) as orch:
            client, box = Harness(orch, adapter, tg).start("ignore-cancel")
            await client.wait_for("delta")
        result = await box.wait()
    assert result.status == "cancelled" and [u["status"] for u in client.dones()] == ["cancelled"]


async def test_no_turn_ends_twice_whatever_ends_it(tmp_path: Path) -> None:
    adapter = FakeAdapter()
    async with (
        in_background(orchestrator(tmp_path, adapter, turn_timeout=0.5)) as orch,
        anyio.create_task_group() as tg,
    ):
        harness = Harness(orch, adapter, tg)
        runs = [
            harness.start(prompt, session=f"n{i}")
            for i, prompt in enumerate(["echo a", "fail", "raise", "hang", "ignore-cancel", "big 5000"])
        ]
        await runs[3][0].wait_for("delta")
        orch.cancel("n3", "local")
        results = [await box.wait() for _, box in runs]
    for (client, _), result in zip(runs, results, strict=True):
        if result.turn_id is not None:
            assert [d["turnId"] for d in client.dones()] == [result.turn_id]
    assert [r.status for r in results] == ["completed", "failed", "failed", "cancelled", "timeout", "failed"]


async def test_a_turn_its_provider_refuses_does_not_hold_up_close(tmp_path: Path) -> None:
    """The refused turn was admitted (close waits for admitted turns) but never ran: close once
    waited cancelGrace + 10 s for an end that never came."""
    adapter = FakeAdapter()
    async with in_background(orchestrator(tmp_path, adapter)) as orch, anyio.create_task_group() as tg:
        refused = anyio.Event()

        async def run() -> None:
            params = TurnParams.model_validate({"sessionId": "s1", "taskPrompt": "echo a", "gate": "refuse"})
            with pytest.raises(InvalidParams):
                await orch.run_turn(params, "local", Client(), start=True)
            refused.set()

        tg.start_soon(run)
        with anyio.fail_after(WAIT):
            await adapter.preflighting.wait()
        closed = Box()

        async def close() -> None:
            closed.result = await orch.close("s1", "local")
            closed.done.set()

        tg.start_soon(close)
        await anyio.wait_all_tasks_blocked()  # close waits for the admitted turn
        adapter.gate.set()
        with anyio.fail_after(2.0):  # far less than cancelGrace (0.5 s) + 10 s
            await refused.wait()
            await closed.done.wait()
        assert closed.result.closed is True


async def test_a_turn_asked_for_while_the_bridge_stops_ends_before_it_started(tmp_path: Path) -> None:
    adapter = FakeAdapter()
    results: list[Any] = []
    async with anyio.create_task_group() as tg:
        orch_cm = in_background(orchestrator(tmp_path, adapter))
        orch = await orch_cm.__aenter__()
        params = TurnParams.model_validate({"sessionId": "s1", "taskPrompt": "echo a", "gate": "pass"})
        tg.start_soon(functools.partial(orch.run_turn, params, "local", Client(), start=True))  # holds the shutdown
        with anyio.fail_after(WAIT):
            await adapter.preflighting.wait()

        async def during_shutdown() -> None:
            await anyio.wait_all_tasks_blocked()  # __aexit__ waits for s1's turn
            late = TurnParams.model_validate({"sessionId": "s2", "taskPrompt": "echo b"})
            results.append(await orch.run_turn(late, "local", Client(), start=True))
            adapter.gate.set()

        tg.start_soon(during_shutdown)
        with anyio.fail_after(WAIT):
            await orch_cm.__aexit__(None, None, None)
    (late,) = results
    assert late.status == "cancelled" and late.turn_id is None and late.error.code == "CANCELLED"


async def test_a_turn_cut_off_from_outside_is_cancelled_not_timed_out(tmp_path: Path) -> None:
    """Only the deadline passing is a timeout; the task that runs the turn being cancelled from
    outside (here: a task group of the test's, not the orchestrator's) is not."""
    adapter = FakeAdapter()
    async with in_background(orchestrator(tmp_path, adapter)) as orch:
        client = Client()
        session = orch.sessions.open("s1", "local", "s1")
        spec = TurnInput(
            prompt="ignore-cancel",
            cwd=str(tmp_path),
            attachments=(),
            resolution=orch._route("ignore-cancel", None, None, ""),
            principal="local",
            start=True,
            extra={},
        )
        turn = Turn(orch, session, spec)
        session.admit(turn, start=True)
        session.log.attach("client", lambda params: client("session.update", params), "stream")
        async with anyio.create_task_group() as outside:
            outside.start_soon(turn.run)
            await client.wait_for("delta")
            outside.cancel_scope.cancel()
    assert turn.result is not None and turn.result.status == "cancelled" and turn.result.error is UNSET
    assert [d["status"] for d in client.dones()] == ["cancelled"]


async def test_a_provider_session_that_fails_to_close_disturbs_no_other_turn(tmp_path: Path) -> None:
    """Forgetting an idle session ends its provider session in the orchestrator's task group: an
    error there once cancelled every running turn."""
    adapter = FakeAdapter()
    async with in_background(orchestrator(tmp_path, adapter)) as orch, anyio.create_task_group() as tg:
        harness = Harness(orch, adapter, tg)
        _, idle = harness.start("fail-to-close", session="idle")
        assert (await idle.wait()).status == "completed"
        client, running = harness.start("ask", session="busy")
        asked = await client.wait_for("permission")
        assert orch.sessions.evict_idle(older_than=0) == 1  # "idle" is forgotten, its aclose raises
        await anyio.wait_all_tasks_blocked()
        answer = {"sessionId": "busy", "requestId": asked["requestId"], "optionId": "yes"}
        orch.permission(PermissionParams.model_validate(answer), "local")
        result = await running.wait()
    assert result.status == "completed" and result.output == "option=yes"


async def test_a_failure_while_a_turn_ends_fails_that_turn_only(tmp_path: Path) -> None:
    """Ending a turn (publishing ``done``, building the result) runs after the turn's own error
    handling: a bug there once escaped into the orchestrator's task group."""
    adapter = FakeAdapter()

    class BrokenClient(Client):
        def __call__(self, method: str, params: dict[str, Any]) -> None:
            if params["type"] == "done":
                raise RuntimeError("a bug while sending done")
            super().__call__(method, params)

    async with in_background(orchestrator(tmp_path, adapter)) as orch:
        params = TurnParams.model_validate({"sessionId": "s1", "taskPrompt": "echo a"})
        with anyio.fail_after(WAIT):
            broken = await orch.run_turn(params, "local", BrokenClient(), start=True)
            params = TurnParams.model_validate({"sessionId": "s2", "taskPrompt": "echo b"})
            later = await orch.run_turn(params, "local", Client(), start=True)
    assert broken.status == "failed" and broken.error.code == "INTERNAL_ERROR" and broken.turn_id is not None
    assert later.status == "completed"


async def test_chunks_behind_the_result_cost_no_more_than_the_output_they_add(tmp_path: Path) -> None:
    """Late chunks are streamed and recorded in the session's history; past maxOutputBytes none is
    kept, and the answer is joined once when the history is read, not once per chunk."""
    adapter = FakeAdapter()
    async with in_background(orchestrator(tmp_path, adapter)) as orch:
        client = Client()
        params = TurnParams.model_validate({"sessionId": "s1", "taskPrompt": "echo a"})
        result = await orch.run_turn(params, "local", client, start=True)
        turn_sink = adapter.sessions[0].sink
        for _ in range(5000):
            turn_sink.emit(TextDelta("x" * 100))  # 500 KB against maxOutputBytes 1000
        session = orch.sessions.get("s1", "local")
        assert len(turn_sink._parts) <= 11  # not one entry per chunk past the limit
        role, answer = session.history[-1]
    assert result.status == "completed" and role == "assistant"
    assert answer.startswith("a ") and len(answer.encode()) == 1000
    late = [u for u in client.updates if u["type"] == "delta"][1:]
    assert sum(len(u["delta"]) for u in late) == 1000 - len("a ")


# ---- waits that look like hangs ---------------------------------------------------------------------


def waits(client: Client) -> list[str]:
    return [u["reason"] for u in client.updates if u.get("event") == "waiting"]


async def until_waiting(client: Client, reason: str) -> dict[str, Any]:
    with anyio.fail_after(WAIT):
        while reason not in waits(client):
            client._changed = anyio.Event()
            await client._changed.wait()
    return next(u for u in client.updates if u.get("reason") == reason)


@pytest.mark.parametrize(("prompt", "reason"), [("slow-start", "starting"), ("hang", "output"), ("ask", "permission")])
async def test_a_silent_turn_says_what_it_waits_for(tmp_path: Path, prompt: str, reason: str) -> None:
    """OpenCode with no reachable model sat at "session started" for 69 s: a client could not
    tell a wait from a hang."""
    adapter = FakeAdapter()
    async with (
        in_background(orchestrator(tmp_path, adapter, progress_interval=0.05)) as orch,
        anyio.create_task_group() as tg,
    ):
        client, box = Harness(orch, adapter, tg).start(prompt)
        update = await until_waiting(client, reason)
        await until_waiting(client, reason)  # again, each interval the silence lasts
        orch.cancel("s1", "local")
        await box.wait()
    assert update["type"] == "status" and update["turnId"] == client.updates[0]["turnId"]
    assert update["message"].startswith("waiting for ") and isinstance(update["waitedSeconds"], int)
    assert set(waits(client)) == {reason}
    seqs = [u["seq"] for u in client.updates]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # ordinary updates, numbered


async def test_a_turn_waiting_for_a_running_slot_says_so(tmp_path: Path) -> None:
    adapter = FakeAdapter()
    registry = ProviderRegistry({"fake": adapter}, {"fake"})
    limits = Limits(max_running_turns=1)
    timeouts = Timeouts(cancel_grace=0.5, progress_interval=0.05)
    async with (
        in_background(Orchestrator(registry, [tmp_path.resolve()], limits, timeouts)) as orch,
        anyio.create_task_group() as tg,
    ):
        harness = Harness(orch, adapter, tg)
        busy, first = harness.start("hang", session="busy")
        await busy.wait_for("delta")
        client, second = harness.start("echo later", session="later")
        await until_waiting(client, "capacity")
        orch.cancel("busy", "local")
        result = await second.wait()
        await first.wait()
    assert result.status == "completed" and waits(client)[0] == "capacity"
    assert client.updates[0]["type"] == "status" and client.updates[0]["event"] == "started"


async def test_no_waiting_update_while_output_streams(tmp_path: Path) -> None:
    adapter = FakeAdapter()
    async with in_background(orchestrator(tmp_path, adapter, progress_interval=0.05)) as orch:
        client = Client()
        params = TurnParams.model_validate({"sessionId": "s1", "taskPrompt": "echo a b c"})
        result = await orch.run_turn(params, "local", client, start=True)
    assert result.status == "completed" and waits(client) == []


async def test_a_start_sent_while_a_cancelled_turn_ends_waits_for_that_end(tmp_path: Path) -> None:
    """The app's Stop, then send: the next ``session.start`` arrives while the cancelled turn is
    still ending (here: its provider ignores the cancel until cancelGrace cuts it off)."""
    adapter = FakeAdapter()
    async with in_background(orchestrator(tmp_path, adapter)) as orch, anyio.create_task_group() as tg:
        harness = Harness(orch, adapter, tg)
        client, first = harness.start("ignore-cancel")
        await client.wait_for("delta")
        assert orch.cancel("s1", "local").cancelled is True
        _, second = harness.start("echo after stop")
        stopped, after = await first.wait(), await second.wait()
    assert stopped.status == "cancelled"
    assert after.status == "completed" and after.output == "after stop "


async def test_a_start_on_a_running_turn_that_was_not_stopped_is_still_busy(tmp_path: Path) -> None:
    adapter = FakeAdapter()
    async with in_background(orchestrator(tmp_path, adapter)) as orch:
        async with anyio.create_task_group() as tg:
            client, first = Harness(orch, adapter, tg).start("hang")
            await client.wait_for("delta")
            with pytest.raises(SessionBusy):
                await orch.run_turn(
                    TurnParams.model_validate({"sessionId": "s1", "taskPrompt": "x"}), "local", Client(), start=True
                )
            orch.cancel("s1", "local")
            await first.wait()
