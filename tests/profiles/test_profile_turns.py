"""One exec-profile turn against real subprocesses (``scripts/modes.py`` and small shell profiles):
the protocol environment, placeholders, stdin, failures, timeouts, cancel, malformed output,
limits and per-profile concurrency. Waits are on sink events or OS state, bounded; no sleeps.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from compat.base import TurnOutcome
from compat.profile.adapter import ProfileAdapter, ProfileSession
from compat.profile.protocol import ENV_MESSAGE_MAX_BYTES
from compat.profile.run import STDERR_HINT

from .conftest import ProfileFactory, RecordingSink, deltas, group_members, pids_in, request, run_turn, wait_gone

KIB = 1024


def _body(sink: RecordingSink) -> dict:
    return json.loads("".join(deltas(sink)))


# ---- the protocol environment -------------------------------------------------------------------


async def test_profile_gets_the_protocol_environment_and_only_allowed_variables(
    make_profile: ProfileFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("BRIDGE_AUTH_TOKEN", "bridge-secret-token")
    monkeypatch.setenv("SECRET_OF_PARENT", "not-allow-listed")
    session = make_profile.modes("env", env={"GREETING": "hi there"}).open_session("ctx-1")
    outcome, sink = await run_turn(
        session, "what's up?", session_id="ctx-1", thread_id="thread-9", principal="alice", cwd=tmp_path
    )
    assert outcome.status == "completed"
    env = _body(sink)
    assert env == {
        "AGENT_MESSAGE": "what's up?",
        "AGENT_SESSION_ID": "",
        "AGENT_SESSION_NAME": "thread-9",
        "AGENT_FROM_USER": "alice",
        "AGENT_CONTEXT_TOKEN": "ctx-1",
        "AGENT_STREAMING": "1",
        "AGENT_PROTOCOL_VERSION": "0.1",
        "GREETING": "hi there",
        "argv": [],
        "cwd": str(tmp_path),
    }


async def test_streaming_off_is_announced_and_an_empty_thread_is_named_default(make_profile: ProfileFactory) -> None:
    session = make_profile.modes("env", streaming=False).open_session("s1")
    outcome, sink = await run_turn(session, "x", thread_id="")
    env = _body(sink)
    assert env["AGENT_STREAMING"] == "0" and env["AGENT_SESSION_NAME"] == "default"
    assert env["AGENT_FROM_USER"] == "local"


async def test_args_placeholders_and_variables_are_filled(
    make_profile: ProfileFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PROFILE_TEST_FLAG", "--flag-from-env")
    adapter = make_profile.modes(
        "env",
        args=["{{MESSAGE}}", "{{SESSION_ID}}", "{{SESSION_NAME}}", "{{PROFILE_DIR}}", "${PROFILE_TEST_FLAG}"],
        cwd="{{PROFILE_DIR}}",
        profile_dir=tmp_path,
    )
    (tmp_path / "modes.py").write_bytes((Path(__file__).parent / "scripts" / "modes.py").read_bytes())
    outcome, sink = await run_turn(adapter.open_session("s1"), "a message; $(rm -rf /)", thread_id="th")
    env = _body(sink)
    assert env["argv"] == ["a message; $(rm -rf /)", "", "th", str(tmp_path.resolve()), "--flag-from-env"]
    assert env["cwd"] == str(tmp_path.resolve())


# ---- stdin ----------------------------------------------------------------------------------------


async def test_a_child_reading_stdin_sees_eof_at_once_by_default(make_profile: ProfileFactory) -> None:
    outcome, sink = await run_turn(make_profile.modes("stdin").open_session("s1"), "hello")
    assert outcome.status == "completed"
    assert _body_after_partial(sink)["bytes"] == 0


async def test_stdin_message_writes_the_message_then_closes_stdin(make_profile: ProfileFactory) -> None:
    outcome, sink = await run_turn(make_profile.modes("stdin", stdin="message").open_session("s1"), "hëllo\nworld")
    report = _body_after_partial(sink)
    assert report["bytes"] == len("hëllo\nworld".encode()) and report["truncated"] == ""


@pytest.mark.parametrize("message", ["m" * (200 * KIB), "é" * (100 * KIB), "before\0after"])
async def test_a_message_the_environment_cannot_hold_is_cut_there_and_sent_whole_on_stdin(
    message: str, make_profile: ProfileFactory
) -> None:
    outcome, sink = await run_turn(make_profile.modes("stdin").open_session("s1"), message)
    assert outcome.status == "completed", outcome
    report = _body_after_partial(sink)
    whole = message.encode()
    assert report["bytes"] == len(whole) and report["sha256"] == hashlib.sha256(whole).hexdigest()
    assert report["truncated"] == "1" and report["env_bytes"] <= ENV_MESSAGE_MAX_BYTES
    assert report["env_bytes"] == (len(b"before") if "\0" in message else report["env_bytes"])


def _body_after_partial(sink: RecordingSink) -> dict:
    assert deltas(sink)[0] == "read"
    return json.loads("".join(deltas(sink)[1:]))


# ---- failures ---------------------------------------------------------------------------------


async def test_agent_error_fails_the_turn_with_profile_error_and_replies_with_it(make_profile: ProfileFactory) -> None:
    outcome, sink = await run_turn(make_profile.modes("error").open_session("s1"))
    assert outcome.status == "failed" and outcome.error.code == "PROFILE_ERROR"
    assert outcome.error.message == 'boom "quoted"' and outcome.error.data == {"exitCode": 1}
    assert deltas(sink) == ["working", '\nboom "quoted"']  # send_error_reply: the error is the reply


async def test_non_zero_exit_is_profile_exit_without_stderr_unless_asked(make_profile: ProfileFactory) -> None:
    outcome, sink = await run_turn(make_profile.modes("exit").open_session("s1"))
    assert outcome.status == "failed" and outcome.error.code == "PROFILE_EXIT"
    assert outcome.error.data == {"exitCode": 3, "hint": STDERR_HINT} and "it broke" not in outcome.error.message
    assert "include_stderr_in_reply" in outcome.error.message
    assert "".join(deltas(sink)) == f"the profile exited with code 3 ({STDERR_HINT})\n--- stdout ---\nsome stdout"

    outcome, sink = await run_turn(make_profile.modes("exit", include_stderr_in_reply=True).open_session("s2"))
    assert outcome.error.data["exitCode"] == 3 and outcome.error.data["stderrTail"] == "trace: it broke\n"
    assert "trace: it broke" in outcome.error.message and "trace: it broke" in "".join(deltas(sink))


async def test_send_error_reply_off_leaves_the_output_to_what_was_streamed(make_profile: ProfileFactory) -> None:
    outcome, sink = await run_turn(make_profile.modes("error", send_error_reply=False).open_session("s1"))
    assert outcome.error.code == "PROFILE_ERROR" and deltas(sink) == ["working"]
    outcome, sink = await run_turn(make_profile.modes("exit", send_error_reply=False).open_session("s2"))
    assert outcome.error.code == "PROFILE_EXIT" and deltas(sink) == []


async def test_stderr_is_appended_to_a_successful_reply_only_when_asked(make_profile: ProfileFactory) -> None:
    outcome, sink = await run_turn(make_profile.modes("stderr-ok").open_session("s1"))
    assert "".join(deltas(sink)) == "fine"
    outcome, sink = await run_turn(make_profile.modes("stderr-ok", include_stderr_in_reply=True).open_session("s2"))
    assert "".join(deltas(sink)) == "fine\n--- stderr ---\nnote on stderr\n"


async def test_a_missing_command_fails_the_turn_not_the_bridge(make_profile: ProfileFactory, tmp_path: Path) -> None:
    script = tmp_path / "gone.py"
    script.write_text("print('x')")
    adapter = make_profile(script=str(script))
    script.unlink()
    assert adapter.probe_cheap().status == "not_found" and "script" in adapter.probe_cheap().detail
    outcome, sink = await run_turn(adapter.open_session("s1"))
    assert outcome.status == "failed" and outcome.error.code == "PROFILE_ERROR"
    assert "".join(deltas(sink)) == outcome.error.message


# ---- timeout, cancel and process trees -----------------------------------------------------------


async def test_timeout_ends_the_whole_process_tree_and_keeps_the_streamed_output(
    make_profile: ProfileFactory, tmp_path: Path
) -> None:
    session = make_profile.modes("hang", timeout_secs=2).open_session("s1")
    outcome, sink = await run_turn(session)
    assert outcome.status == "timeout" and outcome.error.code == "PROFILE_TIMEOUT"
    assert outcome.error.data == {"timeoutSecs": 2}
    assert deltas(sink) == ["started"]  # nothing added to what was streamed
    pids = pids_in(tmp_path / "pids")
    assert len(pids) == 2  # the profile and its SIGTERM-ignoring grandchild
    await wait_gone(pids)


async def test_a_profile_timeout_at_the_turn_timeout_leaves_the_end_to_the_turn(make_profile: ProfileFactory) -> None:
    """``timeout_secs`` equal to ``turnTimeout`` starts no timer of the profile's own: the turn's
    deadline (the orchestrator's) ends the run as TURN_TIMEOUT, never a race of two timers."""
    session = make_profile.modes("hang", timeout_secs=1, timeouts={"turn_timeout": 1}).open_session("s1")
    outcomes: list[Any] = []
    with anyio.move_on_after(3) as turn_deadline:  # stands in for the turn's deadline
        outcomes.append(await run_turn(session))
    assert turn_deadline.cancelled_caught and outcomes == []


async def test_cancel_ends_the_process_group_and_the_turn_is_cancelled(
    make_profile: ProfileFactory, tmp_path: Path
) -> None:
    session = make_profile.modes("hang").open_session("s1")
    turn = Turn(session)
    async with anyio.create_task_group() as tg:
        tg.start_soon(turn)
        await turn.sink.wait_for(lambda s: deltas(s) == ["started"], timeout=20)
        pgid = session.pid
        assert pgid is not None and group_members(pgid)
        turn.cancel()
        outcome = await turn.wait(10)  # cancelGrace (1 s) plus the kill
    assert outcome.status == "cancelled" and outcome.stop_reason == "cancelled"
    assert deltas(turn.sink) == ["started"]
    await wait_gone(pids_in(tmp_path / "pids"))
    assert group_members(pgid) == []


class Turn:
    """A turn running in the background: ``done`` is set with ``outcome``. :meth:`cancel` does what
    the orchestrator does: a graceful stop when the provider offers one, else the turn is cut off
    (its scope cancelled), which a profile ends with its process group; a cut-off turn's outcome is
    ``cancelled``, as the orchestrator records it."""

    def __init__(self, session: ProfileSession, sink: RecordingSink | None = None) -> None:
        self.session = session
        self.sink = sink or RecordingSink()
        self.outcome: TurnOutcome | None = None
        self.done = anyio.Event()
        self._scope = anyio.CancelScope()

    async def __call__(self, order: list[Turn] | None = None) -> None:
        with self._scope:
            self.outcome = await self.session.run_turn(request(), self.sink)
        if self._scope.cancelled_caught:
            self.outcome = TurnOutcome("cancelled", stop_reason="cancelled")
        if order is not None:
            order.append(self)
        self.done.set()

    def cancel(self) -> None:
        if not self.session.request_cancel():
            self._scope.cancel()

    async def wait(self, timeout: float = 10) -> TurnOutcome:
        with anyio.fail_after(timeout):
            await self.done.wait()
        assert self.outcome is not None
        return self.outcome


async def test_a_grandchild_holding_stdout_does_not_hold_the_turn(make_profile: ProfileFactory, tmp_path: Path) -> None:
    session = make_profile.modes("grandchild").open_session("s1")
    with anyio.fail_after(5):  # not the 600 s the grandchild sleeps (field-failures #15)
        outcome, sink = await run_turn(session)
    assert outcome.status == "completed" and outcome.upstream_session_id == "s1"
    assert "".join(deltas(sink)) == "hi\nok"
    await wait_gone(pids_in(tmp_path / "pids"))


async def test_aclose_during_a_turn_leaves_no_process(make_profile: ProfileFactory, tmp_path: Path) -> None:
    """The bridge stops a session's turn before it closes its provider session; an adapter closed
    under a running turn still ends the process group, and the turn ends with it (killed)."""
    adapter = make_profile.modes("hang")
    session = adapter.open_session("s1")
    turn = Turn(session)
    async with anyio.create_task_group() as tg:
        tg.start_soon(turn)
        await turn.sink.wait_for(lambda s: deltas(s) == ["started"], timeout=20)
        with anyio.fail_after(10):
            await adapter.aclose()
    ended = await turn.wait()
    assert ended.status == "failed" and ended.error.code == "PROFILE_EXIT" and ended.error.data["exitCode"] < 0
    await wait_gone(pids_in(tmp_path / "pids"))
    outcome, _ = await run_turn(session)
    assert outcome.status == "failed" and outcome.error.code == "PROFILE_ERROR"  # the session is closed


# ---- malformed output and limits -------------------------------------------------------------------


async def test_malformed_markers_lose_nothing_else_and_stay_wire_safe(make_profile: ProfileFactory) -> None:
    outcome, sink = await run_turn(make_profile.modes("malformed").open_session("s1"))
    assert outcome.status == "completed" and outcome.upstream_session_id == "kept"
    parts = deltas(sink)
    assert parts[:5] == ["not json", "123", "\U0001f600 ok", "lone \ufffd low", "\ufffd"]
    assert parts[5] == "\ufffd"
    rest = "".join(parts[6:])
    assert rest == "\nbody \ufffd\ufffd bytes\nAGENT_ERRORX: not a marker\ntail without newline"
    orjson.dumps(parts)  # no lone surrogates reach the wire encoder


async def test_streamed_output_past_max_output_bytes_fails_output_limit_and_keeps_the_prefix(
    make_profile: ProfileFactory, tmp_path: Path
) -> None:
    session = make_profile.modes("flood-partials", limits={"max_output_bytes": 4500}).open_session("s1")
    outcome, sink = await run_turn(session)
    assert outcome.status == "failed" and outcome.error.code == "OUTPUT_LIMIT"
    assert outcome.error.data == {"maxOutputBytes": 4500}
    assert "".join(deltas(sink)) == "x" * 4500


async def test_a_body_past_max_output_bytes_is_not_held_in_memory(make_profile: ProfileFactory) -> None:
    session = make_profile.modes("flood-body", limits={"max_output_bytes": 10_000}).open_session("s1")
    with anyio.fail_after(10):
        outcome, sink = await run_turn(session)
    assert outcome.error.code == "OUTPUT_LIMIT"
    output = "".join(deltas(sink))
    assert len(output) == 10_000 and output.startswith("y" * 99 + "\n" + "y")


async def test_a_line_past_max_agent_line_bytes_ends_the_turn_with_output_so_far(make_profile: ProfileFactory) -> None:
    session = make_profile.modes("long-line", limits={"max_agent_line_bytes": 4096}).open_session("s1")
    with anyio.fail_after(10):
        outcome, sink = await run_turn(session)
    assert outcome.status == "failed" and outcome.error.code == "OUTPUT_LIMIT"
    assert outcome.error.data == {"maxAgentLineBytes": 4096}
    assert deltas(sink) == ["before"]


async def test_a_stderr_flood_is_drained_and_only_its_tail_kept(make_profile: ProfileFactory) -> None:
    session = make_profile.modes("stderr-flood", limits={"stderr_tail_bytes": 1024}).open_session("s1")
    with anyio.fail_after(10):
        outcome, sink = await run_turn(session)
    assert outcome.status == "completed" and "".join(deltas(sink)) == "survived"


# ---- reply assembly ------------------------------------------------------------------------------


async def test_a_body_that_differs_from_the_partials_follows_them_on_a_new_line(make_profile: ProfileFactory) -> None:
    outcome, sink = await run_turn(make_profile.modes("differs").open_session("s1"))
    assert deltas(sink) == ["progress...", "\nfinal answer"]


async def test_cli_session_first_line_prefix_takes_the_session_from_the_first_line(
    make_profile: ProfileFactory,
) -> None:
    outcome, sink = await run_turn(
        make_profile.modes("session-prefix", cli_session_first_line_prefix="SESSION=").open_session("s1")
    )
    assert outcome.upstream_session_id == "abc-123" and "".join(deltas(sink)) == "the reply"
    outcome, sink = await run_turn(make_profile.modes("session-prefix").open_session("s2"))
    assert outcome.upstream_session_id is None and "".join(deltas(sink)) == "SESSION=abc-123\nthe reply"


# ---- concurrency ------------------------------------------------------------------------------


@pytest.mark.parametrize("max_concurrent", [1, 2])
async def test_sessions_of_one_profile_run_in_parallel_up_to_max_concurrent(
    max_concurrent: int, make_profile: ProfileFactory, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    adapter = make_profile.modes("gate", env={"GATE_FILE": str(gate)}, max_concurrent=max_concurrent)
    first, second = Turn(adapter.open_session("s1")), Turn(adapter.open_session("s2"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await first.sink.wait_for(lambda s: "started" in deltas(s), timeout=20)
        tg.start_soon(second)
        if max_concurrent == 1:
            await _wait_for_slot(adapter)
            assert second.session.pid is None and deltas(second.sink) == []
        else:
            await second.sink.wait_for(lambda s: "started" in deltas(s), timeout=20)
        gate.touch()
    assert [(await t.wait()).status for t in (first, second)] == ["completed", "completed"]
    assert all("".join(deltas(t.sink)) == "started\ndone" for t in (first, second))


async def _wait_for_slot(adapter: ProfileAdapter) -> None:
    with anyio.fail_after(5):
        while adapter.slots.statistics().tasks_waiting != 1:
            await anyio.sleep(0.01)  # polling a counter: the limiter has no event to wait on


async def test_cancel_of_a_turn_waiting_for_a_slot_ends_it_without_starting_it(
    make_profile: ProfileFactory, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    adapter = make_profile.modes("gate", env={"GATE_FILE": str(gate)}, max_concurrent=1)
    first, second = Turn(adapter.open_session("s1")), Turn(adapter.open_session("s2"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await first.sink.wait_for(lambda s: "started" in deltas(s), timeout=20)
        tg.start_soon(second)
        await _wait_for_slot(adapter)
        second.cancel()
        assert (await second.wait(5)).status == "cancelled" and deltas(second.sink) == []
        assert not first.done.is_set()
        gate.touch()
    assert (await first.wait()).status == "completed"
    assert len(pids_in(tmp_path / "pids")) == 1  # the waiting turn never started a process


async def test_profile_env_cannot_hand_out_the_bridge_token_and_configured_values_are_secrets(
    make_profile: ProfileFactory,
) -> None:
    from bridge.rpc.redact import redact

    env = {"BRIDGE_AUTH_TOKEN": "leak-attempt", "GREETING": "plain", "SETTING": "configured-value-42"}
    outcome, sink = await run_turn(make_profile.modes("env", env=env).open_session("s1"))
    seen = _body(sink)  # the agent's answer is the user's content: not altered
    assert "BRIDGE_AUTH_TOKEN" not in seen and seen["GREETING"] == "plain" and seen["SETTING"] == "configured-value-42"
    assert redact("a plain") == "a plain"  # under 8 characters: stays readable in diagnostics
    assert redact("a configured-value-42") == "a [REDACTED]"  # whatever its variable's name


# ---- what a new user's profile does ------------------------------------------------------------


async def test_a_python_profile_that_does_not_flush_still_streams_each_partial_at_once(
    make_profile: ProfileFactory, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    session = make_profile.modes("unflushed", env={"GATE_FILE": str(gate)}).open_session("s1")
    turn = Turn(session)
    async with anyio.create_task_group() as tg:
        tg.start_soon(turn)
        await turn.sink.wait_for(lambda s: deltas(s) == ["first"], timeout=20)  # while it still runs
        assert not turn.done.is_set()
        gate.touch()
    assert (await turn.wait()).status == "completed" and deltas(turn.sink) == ["first", " second"]


async def test_partials_after_agent_error_are_not_streamed(make_profile: ProfileFactory) -> None:
    outcome, sink = await run_turn(make_profile.modes("error-then-partial", send_error_reply=False).open_session("s1"))
    assert outcome.error.code == "PROFILE_ERROR" and deltas(sink) == ["working"]


async def test_a_profile_that_raises_logs_its_traceback_and_says_where_it_is(
    make_profile: ProfileFactory, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="compat.profile.run"):
        outcome, _ = await run_turn(make_profile.modes("raises").open_session("s1"))
    assert outcome.error.code == "PROFILE_EXIT" and "include_stderr_in_reply" in outcome.error.message
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "Traceback" in logged and "the profile broke here" in logged
