"""ACP turns as the bridge runs them: the real orchestrator (its turn state machine) over the real
ACP adapter and the fake agent. How a turn ends (cancel, close, timeout) is the orchestrator's;
what the agent's process does about it is the adapter's. Plus the field failures the old design
lost: updates before ``session/new`` answered, a chunk after the prompt's answer, session state
between turns, lone surrogates.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import anyio
import anyio.abc
import orjson

from bridge.rpc.codec import encode_notification, encode_result
from orchestrator.models import TurnParams
from orchestrator.results import TurnResult
from orchestrator.service import Orchestrator

from .conftest import AgentFactory, process_alive, read_log, received, wait_gone, wait_log

WAIT = 10.0


class Client:
    """What one connection of a client sees: every ``session.update`` it was sent."""

    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []
        self._changed = anyio.Event()

    def __call__(self, method: str, params: Any) -> None:
        assert method == "session.update"
        # What a strict client decodes: the envelope exactly as the bridge encodes it.
        self.updates.append(orjson.loads(encode_notification(method, params, 0))["params"])
        self._changed.set()

    async def wait_for(self, predicate: Any) -> None:
        with anyio.fail_after(WAIT):
            while not predicate(self.updates):
                self._changed = anyio.Event()
                await self._changed.wait()

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [u for u in self.updates if u["type"] == kind]

    @property
    def text(self) -> str:
        return "".join(u["delta"] for u in self.of("delta"))


def turn(prompt: str = "hello", session: str = "s1") -> TurnParams:
    return TurnParams.model_validate({"sessionId": session, "taskPrompt": prompt, "workingDirectory": "/tmp"})


class Running:
    """One turn run in a task of the test's, as a request handler runs it."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.result: TurnResult | Any = None

    async def wait(self) -> TurnResult:
        with anyio.fail_after(WAIT):
            await self.done.wait()
        return self.result


def start(tg: anyio.abc.TaskGroup, orch: Orchestrator, client: Client, prompt: str = "hello") -> Running:
    running = Running()

    async def go() -> None:
        running.result = await orch.run_turn(turn(prompt), "local", client, start=True)
        running.done.set()

    tg.start_soon(go)
    return running


def agent_pid(orch: Orchestrator, session: str = "s1") -> int | None:
    found = orch.sessions.get(session, "local")
    provider = found.provider_session if found is not None else None
    return getattr(provider, "pid", None)


# ---- how turns end ---------------------------------------------------------------------------------


async def test_turn_timeout_ends_the_turn_and_kills_the_agent(make_agent: AgentFactory) -> None:
    orch = await make_agent.orchestrator("slow", timeouts={"turn_timeout": 0.5})
    result = await orch.run_turn(turn(), "local", Client(), start=True)
    assert result.status == "timeout" and result.error.code == "TURN_TIMEOUT"
    started = await wait_log(make_agent.log, lambda e: e.get("event") == "start")
    await wait_gone([started["pid"]])  # cut off mid-prompt: its state is unknown


async def test_cancel_ends_a_slow_turn_and_keeps_the_agent(make_agent: AgentFactory) -> None:
    orch = await make_agent.orchestrator("slow")
    async with anyio.create_task_group() as tg:
        client = Client()
        box = start(tg, orch, client)
        await client.wait_for(lambda u: any(x["type"] == "delta" for x in u))
        pid = agent_pid(orch)
        began = time.monotonic()
        assert orch.cancel("s1", "local").cancelled
        await box.wait()
        assert box.result.status == "cancelled" and box.result.stop_reason == "cancelled"
        assert time.monotonic() - began < 1.0  # the agent answered the cancel: no kill needed
        assert agent_pid(orch) == pid and process_alive(pid)
        assert len(received(make_agent.log, "session/cancel")) == 1


async def test_cancel_ignored_by_the_agent_kills_its_group_within_the_grace(make_agent: AgentFactory) -> None:
    orch = await make_agent.orchestrator("ignore-cancel", "ignore-term", timeouts={"cancel_grace": 0.5})
    async with anyio.create_task_group() as tg:
        client = Client()
        box = start(tg, orch, client)
        await client.wait_for(lambda u: any(x["type"] == "delta" for x in u))
        pid = agent_pid(orch)
        began = time.monotonic()
        orch.cancel("s1", "local")
        await box.wait()
        assert box.result.status == "cancelled" and time.monotonic() - began < 0.5 + 5
        assert not process_alive(pid)


async def test_cancel_answers_a_pending_permission_cancelled_after_session_cancel(make_agent: AgentFactory) -> None:
    orch = await make_agent.orchestrator("permission", permission_policy="ask")
    async with anyio.create_task_group() as tg:
        client = Client()
        box = start(tg, orch, client)
        await client.wait_for(lambda u: any(x["type"] == "permission" for x in u))
        orch.cancel("s1", "local")
        await box.wait()
        assert box.result.status == "cancelled"
        entry = await wait_log(make_agent.log, lambda e: e.get("event") == "permission")
        assert entry["outcome"] == {"outcome": "cancelled"}
        assert len(received(make_agent.log, "session/cancel")) == 1
        log = [e for e in read_log(make_agent.log) if e.get("event") == "recv"]
        order = [e["method"] or e["id"] for e in log]
        assert order.index("session/cancel") < order.index("perm-1")  # ACP: cancel first, then the answer


async def test_a_cancel_after_a_turn_ended_does_not_touch_the_next_turn(make_agent: AgentFactory) -> None:
    orch = await make_agent.orchestrator()
    assert (await orch.run_turn(turn("A"), "local", Client(), start=True)).status == "completed"
    assert orch.cancel("s1", "local").cancelled is False
    client = Client()
    result = await orch.run_turn(turn("B"), "local", client, start=False)
    assert result.status == "completed" and result.output == "echo: B"
    assert received(make_agent.log, "session/cancel") == []


async def test_grandchildren_are_gone_after_a_cancel_that_kills(make_agent: AgentFactory) -> None:
    orch = await make_agent.orchestrator(
        "grandchild", "grandchild-setsid", "ignore-cancel", timeouts={"cancel_grace": 0.3}
    )
    async with anyio.create_task_group() as tg:
        client = Client()
        box = start(tg, orch, client)
        await client.wait_for(lambda u: any(x["type"] == "delta" for x in u))
        pids = (await wait_log(make_agent.log, lambda e: e.get("event") == "grandchildren"))["pids"]
        agent = agent_pid(orch)
        orch.cancel("s1", "local")
        await box.wait()
        assert box.result.status == "cancelled"
        await wait_gone([agent, *pids])


async def test_close_mid_turn_ends_it_cancelled_and_leaves_nothing(make_agent: AgentFactory) -> None:
    orch = await make_agent.orchestrator("grandchild", "grandchild-setsid")
    async with anyio.create_task_group() as tg:
        client = Client()
        box = start(tg, orch, client)
        await client.wait_for(lambda u: any(x["type"] == "delta" for x in u))
        pids = (await wait_log(make_agent.log, lambda e: e.get("event") == "grandchildren"))["pids"]
        agent = agent_pid(orch)
        assert (await orch.close("s1", "local")).closed
        assert box.done.is_set() and box.result.status == "cancelled"  # close answers after the turn ended
        assert client.updates[-1]["type"] == "done"
        await wait_gone([agent, *pids])

    # ---- the field failures the old design lost --------------------------------------------------------


async def test_updates_written_before_session_new_answered_reach_the_turn(make_agent: AgentFactory) -> None:
    orch = await make_agent.orchestrator("early-updates")
    client = Client()
    result = await orch.run_turn(turn("hi"), "local", client, start=True)
    assert result.status == "completed"
    assert result.output == "early echo: hi"  # the early chunk is this turn's first text
    commands = [u for u in client.of("status") if u["event"] == "available_commands_update"]
    assert commands[0]["data"]["availableCommands"][0]["name"] == "early"
    assert orch.sessions.get("s1", "local").state["available_commands_update"] is not None


async def test_a_chunk_after_the_prompt_answer_is_a_delta_of_that_turn(make_agent: AgentFactory) -> None:
    orch = await make_agent.orchestrator("late-chunk")
    client = Client()
    result = await orch.run_turn(turn("hi"), "local", client, start=True)
    assert result.output == "echo: hi"  # the result did not wait for it
    await client.wait_for(lambda u: u[-1].get("delta") == "late")
    done, late = client.updates[-2], client.updates[-1]
    assert done["type"] == "done" and late["type"] == "delta"
    assert late["turnId"] == result.turn_id and late["seq"] == done["seq"] + 1
    assert orch.sessions.get("s1", "local").history[-1] == ("assistant", "echo: hilate")


async def test_session_state_between_turns_is_kept_and_sent_with_the_next_turn(make_agent: AgentFactory) -> None:
    orch = await make_agent.orchestrator("between-turns")
    first = Client()
    await orch.run_turn(turn("one"), "local", first, start=True)
    await wait_log(make_agent.log, lambda e: e.get("event") == "between-turns")
    session = orch.sessions.get("s1", "local")
    with anyio.fail_after(WAIT):
        while "current_mode_update" not in session.state:
            await anyio.sleep(0.01)  # the agent's line crosses a pipe; no event marks its arrival
    assert session.state["current_mode_update"] == {"currentModeId": "plan"}
    assert not [u for u in first.updates if u["event"] == "current_mode_update"]  # no turn streamed it
    second = Client()
    await orch.run_turn(turn("two"), "local", second, start=False)
    events = [u["event"] for u in second.updates]
    assert events[:2] == ["started", "current_mode_update"]  # at the start of the next turn's stream


async def test_lone_surrogates_from_an_agent_reach_clients_as_replacement_characters(make_agent: AgentFactory) -> None:
    orch = await make_agent.orchestrator("surrogate")
    client = Client()
    result = await orch.run_turn(turn("hi"), "local", client, start=True)
    assert client.text == "smile \ufffd"
    envelope = encode_result(1, result, 0)
    assert "\ufffd" in orjson.loads(envelope)["result"]["output"]  # orjson, a strict parser, takes it


async def test_a_lone_surrogate_in_the_prompt_results_meta_does_not_break_the_turn(make_agent: AgentFactory) -> None:
    orch = await make_agent.orchestrator("surrogate")
    result = await orch.run_turn(turn("hi"), "local", Client(), start=True)
    assert result.status == "completed" and result.usage["inputTokens"] == 10


async def test_bytes_that_are_not_utf8_cost_neither_the_chunk_nor_the_prompt_answer(make_agent: AgentFactory) -> None:
    """A Latin-1 byte in a line once dropped the whole line: a chunk vanished, and a prompt answer
    carrying one left the turn waiting for ``turnTimeout``."""
    orch = await make_agent.orchestrator("bad-utf8")
    client = Client()
    with anyio.fail_after(WAIT):
        result = await orch.run_turn(turn("hi"), "local", client, start=True)
    assert result.status == "completed" and result.usage["inputTokens"] == 10
    assert client.text == "a\ufffd\ufffdb"


async def test_an_agent_killed_while_its_permission_request_waits_fails_the_turn_and_drops_it(
    make_agent: AgentFactory,
) -> None:
    orch = await make_agent.orchestrator("permission", permission_policy="ask")
    async with anyio.create_task_group() as tg:
        client = Client()
        box = start(tg, orch, client)
        await client.wait_for(lambda u: any(x["type"] == "permission" for x in u))
        os.kill(agent_pid(orch), signal.SIGKILL)
        result = await box.wait()
    assert result.status == "failed" and result.error.code == "AGENT_EXITED"
    assert orch.sessions.get("s1", "local").permissions == {}  # nobody can answer it any more


async def test_an_idle_reaper_that_fails_disturbs_no_other_session(
    make_agent: AgentFactory, monkeypatch: Any, caplog: Any
) -> None:
    """The idle reaper runs in the adapter's task group, which hosts every agent's pumps: an error
    there once ended them all."""
    from compat.acp.session import AcpSession

    orch = await make_agent.orchestrator(timeouts={"idle_timeout": 0.2})
    reaped = anyio.Event()

    async def broken_drop(self: AcpSession) -> None:
        reaped.set()
        raise RuntimeError("a bug while ending an idle agent")

    assert (await orch.run_turn(turn("first", "idle"), "local", Client(), start=True)).status == "completed"
    monkeypatch.setattr(AcpSession, "_drop_conn", broken_drop)
    with anyio.fail_after(WAIT):
        await reaped.wait()
    monkeypatch.undo()
    result = await orch.run_turn(turn("second", "other"), "local", Client(), start=True)
    assert result.status == "completed" and "ending the idle agent failed" in caplog.text


async def test_a_failure_while_ending_an_agent_that_broke_the_framing_disturbs_no_other_session(
    make_agent: AgentFactory, monkeypatch: Any, caplog: Any
) -> None:
    from compat.process.child import AgentProcess

    orch = await make_agent.orchestrator("hugeline", limits={"max_agent_line_bytes": 64 * 1024})
    real_terminate = AgentProcess.terminate

    async def terminate_then_fail(self: AgentProcess, grace: float) -> None:
        await real_terminate(self, grace)  # the agent still ends: only the error is new
        raise RuntimeError("a bug while ending the agent")

    monkeypatch.setattr(AgentProcess, "terminate", terminate_then_fail)
    with anyio.fail_after(WAIT):
        broken = await orch.run_turn(turn("huge", "s1"), "local", Client(), start=True)
    monkeypatch.undo()
    assert broken.status == "failed" and "ending the agent failed" in caplog.text
    # and the adapter's task group, which hosts every agent's pumps, closes cleanly (the fixture)


async def test_session_state_sent_while_the_next_turn_starts_is_streamed_in_that_turn(
    make_agent: AgentFactory,
) -> None:
    """A warm turn that changes the model: the agent's config_option_update comes before the
    prompt is out, and once went to the previous turn (held back until the turn after)."""
    orch = await make_agent.orchestrator("configoptions")
    first = TurnParams.model_validate({**turn("one").model_dump(by_alias=True), "model": "m-default"})
    assert (await orch.run_turn(first, "local", Client(), start=True)).status == "completed"
    client = Client()
    second = TurnParams.model_validate({**turn("two").model_dump(by_alias=True), "model": "m-fast"})
    result = await orch.run_turn(second, "local", client, start=False)
    assert result.status == "completed" and result.resolved_model == "m-fast"
    kinds = [u.get("event") if u["type"] == "status" else u["type"] for u in client.updates]
    assert "config_option_update" in kinds and kinds.index("config_option_update") < kinds.index("done")


async def test_updates_for_unknown_sessions_are_bounded_in_all_and_warned_of_once(
    make_agent: AgentFactory, caplog: Any
) -> None:
    """While session/new is out, updates naming any session id are kept (one may be the new
    session's): at most EARLY_UPDATES in all, whatever the number of ids, and one warning."""
    from compat.acp.session import EARLY_UPDATES

    adapter = make_agent._adapter((), None, None, {})
    session = adapter.open_session("s1")
    session._opening = True  # as while session/new is out
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}}
    for i in range(10 * EARLY_UPDATES):
        session._on_update({"sessionId": f"made-up-{i}", "update": update})
    assert len(session._early) == EARLY_UPDATES
    assert caplog.text.count("before session/new answered") == 1


async def test_a_line_too_long_right_behind_the_answer_ends_the_agent(
    make_agent: AgentFactory, monkeypatch: Any
) -> None:
    """The drain after the answer met the line (the reader had not read it yet): the turn keeps
    its answer, and the agent, which can no longer be understood, is ended instead of idling on."""
    from compat.process.child import AgentProcess
    from compat.process.lines import LineTooLong

    orch = await make_agent.orchestrator("ignore-term")  # stdin's end does not end it
    real_drain = AgentProcess.drain

    def drain_meets_a_long_line(self: AgentProcess) -> None:
        real_drain(self)
        raise LineTooLong("a stdout line passed 8388608 bytes")

    monkeypatch.setattr(AgentProcess, "drain", drain_meets_a_long_line)
    result = await orch.run_turn(turn("hi"), "local", Client(), start=True)
    monkeypatch.undo()
    pid = next(e["pid"] for e in read_log(make_agent.log) if e.get("event") == "prompt")
    assert result.status == "completed"
    await wait_gone([pid])


async def test_an_agent_silent_after_the_prompt_is_reported_as_waited_for(make_agent: AgentFactory) -> None:
    orch = await make_agent.orchestrator("silent", timeouts={"progress_interval": 0.1})
    client = Client()
    async with anyio.create_task_group() as tg:
        box = start(tg, orch, client)
        await client.wait_for(lambda u: any(x.get("reason") == "output" for x in u))
        orch.cancel("s1", "local")
        result = await box.wait()
    reasons = [u["reason"] for u in client.updates if u.get("event") == "waiting"]
    assert result.status == "cancelled" and set(reasons) <= {"starting", "output"}  # as the agent starts, then answers
