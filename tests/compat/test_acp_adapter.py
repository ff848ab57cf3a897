"""The ACP adapter against real subprocesses of the fake agent (tests/fakes/fake_acp_agent.py).

Each test is bounded: waits are on sink events or on OS state with a timeout, never bare sleeps.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from compat.acp.adapter import AcpAdapter
from compat.acp.mapping import SESSION_STATE_KINDS, cap_content, usage_from_result
from compat.acp.presets import PRESETS, with_preset
from compat.acp.session import AcpSession
from compat.base import (
    Attachment,
    PlanEvent,
    SessionStateEvent,
    StatusEvent,
    ThoughtDelta,
    ToolCallEvent,
    TurnOutcome,
    UsageEvent,
)
from compat.process.commands import find_command
from compat.process.env import child_env

from .conftest import AgentFactory, RecordingSink, process_alive, read_log, received, turn_request, wait_gone, wait_log

KIB = 1024


async def run(adapter: AcpAdapter, sink: RecordingSink | None = None, **request: object) -> TurnOutcome:
    session = adapter.open_session("s1")
    return await session.run_turn(turn_request(**request), sink or RecordingSink())


async def _run_into(session: AcpSession, sink: RecordingSink, outcomes: list[TurnOutcome]) -> None:
    """Run one turn in a task and keep its outcome (for tests that act while it runs)."""
    outcomes.append(await session.run_turn(turn_request(), sink))


# ---- the normal turn: event mapping ----------------------------------------------------------


async def test_echo_turn_maps_text_thought_tool_calls_plan_usage_and_status(make_agent: AgentFactory) -> None:
    sink = RecordingSink()
    outcome = await run(await make_agent(), sink, prompt="hello")

    assert outcome.status == "completed" and outcome.stop_reason == "end_turn" and outcome.error is None
    assert outcome.upstream_session_id.startswith("fake-") and not outcome.context_reset
    assert sink.text == "echo: hello"
    assert [e.text for e in sink.of(ThoughtDelta)] == ["thinking about it"]
    calls = sink.of(ToolCallEvent)
    assert [(c.is_update, c.tool_call["status"]) for c in calls] == [
        (False, "pending"),
        (True, "in_progress"),
        (True, "completed"),
    ]
    merged = calls[1].tool_call  # the update carried only status; the rest is remembered
    assert merged["title"] == "Read file" and merged["kind"] == "read"
    assert merged["locations"] == [{"path": "/tmp/a.txt"}] and "rawInput" not in merged
    assert calls[2].tool_call["content"][0]["content"]["text"] == "file body"
    assert [e["content"] for e in sink.of(PlanEvent)[0].entries] == ["read", "answer"]
    usage = [e.usage for e in sink.of(UsageEvent)]
    assert usage[0] == {"contextUsed": 1000, "contextSize": 200000, "cost": {"amount": 0.01, "currency": "USD"}}
    assert usage[1] == {"inputTokens": 10, "outputTokens": 20, "totalTokens": 30, "thoughtTokens": 5}
    assert outcome.usage == {**usage[0], **usage[1]}
    assert [e.kind for e in sink.of(SessionStateEvent)] == ["available_commands_update", "session_info_update"]
    assert sink.of(SessionStateEvent)[1].data == {"title": "Echo"}
    assert [e.event for e in sink.of(StatusEvent)] == ["_fake_vendor_update"]  # an unknown kind
    assert sink.began


def test_session_state_kinds_are_listed_for_the_docs() -> None:
    assert set(SESSION_STATE_KINDS) == {
        "available_commands_update",
        "current_mode_update",
        "config_option_update",
        "session_info_update",
    }


def test_prompt_usage_falls_back_to_gemini_quota_token_count() -> None:
    result = {"stopReason": "end_turn", "_meta": {"quota": {"token_count": {"input_tokens": 1, "output_tokens": 3}}}}
    assert usage_from_result(result) == {"inputTokens": 1, "outputTokens": 3}


def test_tool_content_is_cut_to_the_byte_cap() -> None:
    content = [{"type": "content", "content": {"type": "text", "text": "é" * 1000}}, {"type": "diff", "path": "/x"}]
    kept, truncated = cap_content(content, 500)
    assert truncated and len(kept) == 1 and len(orjson.dumps(kept)) <= 600
    assert cap_content(content, 10_000) == (content, False)


async def test_attachments_are_sent_as_resource_links(make_agent: AgentFactory, tmp_path: Path) -> None:
    doc = tmp_path / "notes.md"
    attachments = (Attachment(name="notes.md", path=str(doc), description="the notes"),)
    outcome = await run(await make_agent(), attachments=attachments)

    assert outcome.status == "completed"
    prompt = await wait_log(make_agent.log, lambda e: e.get("event") == "prompt")
    assert prompt["links"] == [
        {"type": "resource_link", "uri": doc.as_uri(), "name": "notes.md", "description": "the notes"}
    ]


async def test_initialize_advertises_no_fs_or_terminal(make_agent: AgentFactory) -> None:
    await run(await make_agent())
    [init] = received(make_agent.log, "initialize")
    assert init["params"]["protocolVersion"] == 1
    assert init["params"]["clientCapabilities"] == {
        "fs": {"readTextFile": False, "writeTextFile": False},
        "terminal": False,
    }
    assert init["params"]["clientInfo"]["name"] == "xworkmate-bridge"


# ---- sessions across turns ---------------------------------------------------------------------


async def test_second_turn_reuses_the_process_and_the_acp_session(make_agent: AgentFactory) -> None:
    session = (await make_agent()).open_session("s1")
    first = await session.run_turn(turn_request("one"), RecordingSink())
    pid = session.pid
    second = await session.run_turn(turn_request("two"), sink := RecordingSink())

    assert second.status == "completed" and sink.text == "echo: two"
    assert session.pid == pid and second.upstream_session_id == first.upstream_session_id
    assert not second.context_reset and len(received(make_agent.log, "session/new")) == 1


async def test_a_hosted_agent_is_answered_between_turns(make_agent: AgentFactory) -> None:
    """Run as a service (as the bridge runs it), the adapter keeps each agent's pumps for the
    process's life: a permission the agent asks right after answering its prompt is answered at
    once (cancelled, or by the policy if the turn had not quite ended), not when a next turn
    starts; attached per turn it would wait."""
    adapter = await make_agent("late-permission")
    session = adapter.open_session("s1")
    outcome = await session.run_turn(turn_request("one"), RecordingSink())
    assert outcome.status == "completed"
    entry = await wait_log(make_agent.log, lambda e: e.get("event") == "late-permission")
    assert entry["outcome"] in ({"outcome": "cancelled"}, {"outcome": "selected", "optionId": "ok"})
    second = await session.run_turn(turn_request("two"), sink := RecordingSink())
    assert second.status == "completed" and sink.text.endswith("echo: two")


async def test_a_line_an_agent_writes_between_turns_never_reaches_the_other_sessions(
    make_agent: AgentFactory,
) -> None:
    """Hosted pumps run in the adapter's task group, which every session shares: a line no parser
    can take (3000 nested brackets) is skipped, and nothing it raises may end that group."""
    adapter = await make_agent("nested-after")
    first = adapter.open_session("s1")
    assert (await first.run_turn(turn_request("one"), RecordingSink())).status == "completed"
    await wait_log(make_agent.log, lambda e: e.get("event") == "nested")
    conn = first._conn
    assert conn is not None
    with anyio.fail_after(5):
        while conn.peer.skipped_lines < 1:  # read and skipped by the hosted reader
            await anyio.sleep(0.01)
    other = adapter.open_session("s2")
    assert (await other.run_turn(turn_request("two"), sink := RecordingSink())).status == "completed"
    assert sink.text.endswith("echo: two") and conn.alive


async def test_a_permission_asked_right_after_the_prompt_answer_is_not_forwarded(make_agent: AgentFactory) -> None:
    """A request that arrives behind the prompt's answer is answered cancelled by the adapter: the
    client must not be shown a permission it could never answer (the turn is ending)."""
    adapter = await make_agent("late-permission", permission_policy="ask")
    session = adapter.open_session("s1")
    for turn in range(1, 6):  # the request often comes in the same read as the answer
        sink = RecordingSink("ok")
        assert (await session.run_turn(turn_request(f"turn {turn}"), sink)).status == "completed"
        # answered before the next turn starts (a request arriving during a turn is that turn's)
        await wait_log(make_agent.log, lambda e: len(late(make_agent.log)) >= turn)
        assert sink.asked == []
    assert late(make_agent.log) == [{"outcome": "cancelled"}] * 5


def late(log: Path) -> list[Any]:
    return [e["outcome"] for e in read_log(log) if e.get("event") == "late-permission"]


async def test_changed_working_directory_starts_a_new_acp_session_with_context_reset(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    session = (await make_agent()).open_session("s1")
    first = await session.run_turn(turn_request(cwd=tmp_path), RecordingSink())
    second = await session.run_turn(turn_request(cwd="/"), RecordingSink())

    assert second.status == "completed" and second.context_reset
    assert second.upstream_session_id != first.upstream_session_id
    assert [r["params"]["cwd"] for r in received(make_agent.log, "session/new")] == [str(tmp_path), "/"]


async def test_reaped_agent_resumes_with_session_load_without_replaying_history(make_agent: AgentFactory) -> None:
    adapter = await make_agent("loadsession", timeouts={"idle_timeout": 0.3})
    session = adapter.open_session("s1")
    first = await session.run_turn(turn_request("first"), RecordingSink())
    pid = session.pid
    await wait_gone([pid])  # the idle reaper ended it
    assert session.pid is None
    second = await session.run_turn(turn_request("second"), sink := RecordingSink())

    assert second.status == "completed" and not second.context_reset
    assert second.upstream_session_id == first.upstream_session_id
    assert sink.text == "echo: second"  # the replayed "echo: first" is not this turn's output
    assert len(received(make_agent.log, "session/load")) == 1
    prompts = [e for e in read_log(make_agent.log) if e.get("event") == "prompt"]
    assert prompts[-1]["turn"] == 2 and prompts[-1]["pid"] != pid


async def test_reaped_agent_without_load_session_starts_fresh_with_context_reset(make_agent: AgentFactory) -> None:
    adapter = await make_agent(timeouts={"idle_timeout": 0.3})
    session = adapter.open_session("s1")
    await session.run_turn(turn_request("first"), RecordingSink())
    await wait_gone([session.pid])
    second = await session.run_turn(turn_request("second"), RecordingSink())

    assert second.status == "completed" and second.context_reset
    assert received(make_agent.log, "session/load") == []


# ---- failures --------------------------------------------------------------------------------


async def test_agent_crash_mid_turn_is_agent_exited_with_exit_code_and_redacted_stderr(
    make_agent: AgentFactory,
) -> None:
    session = (await make_agent("crash")).open_session("s1")
    outcome = await session.run_turn(turn_request(), sink := RecordingSink())

    assert outcome.status == "failed" and outcome.error.code == "AGENT_EXITED"
    assert sink.text == "partial"
    assert outcome.error.data["exitCode"] == 3
    tail = outcome.error.data["stderrTail"]
    assert "fatal: model exploded" in tail and "sk-fake0123456789abcdef" not in tail
    assert session.pid is None


async def test_prompt_error_is_agent_error_with_redacted_upstream_details(make_agent: AgentFactory) -> None:
    session = (await make_agent("prompt-error")).open_session("s1")
    outcome = await session.run_turn(turn_request(), RecordingSink())
    assert outcome.status == "failed" and outcome.error.code == "AGENT_ERROR"
    assert outcome.error.data["code"] == -32603 and outcome.error.data["message"] == "Internal error"
    assert outcome.error.data["data"]["codex_error_info"] == "other"
    assert "sk-fake0123456789abcdef" not in orjson.dumps(outcome.error.data).decode()
    # the agent's own explanation joins the generic message, redacted like the rest
    assert outcome.error.message.startswith("Internal error: stream disconnected: api_key=")
    assert "sk-fake0123456789abcdef" not in outcome.error.message
    assert session.pid is not None and process_alive(session.pid)  # an error answer keeps the agent


async def test_command_not_found_is_a_clear_agent_error(make_agent: AgentFactory) -> None:
    outcome = await run(await make_agent(command="/nonexistent/agent-acp", args=[]))
    assert outcome.status == "failed" and outcome.error.code == "AGENT_ERROR"
    assert outcome.error.data == {"command": "/nonexistent/agent-acp", "reason": "command not found"}


async def test_initialize_timeout_is_agent_start_timeout_and_the_process_is_killed(make_agent: AgentFactory) -> None:
    adapter = await make_agent(args=["-c", "import time; time.sleep(60)"], timeouts={"initialize_timeout": 0.5})
    session = adapter.open_session("s1")
    outcomes: list[TurnOutcome] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_run_into, session, RecordingSink(), outcomes)
        with anyio.fail_after(5):
            while session.pid is None:  # set as soon as the process is spawned
                await anyio.sleep(0.01)
        pid = session.pid
    [outcome] = outcomes
    assert outcome.status == "failed" and outcome.error.code == "AGENT_START_TIMEOUT"
    assert outcome.error.data["method"] == "initialize"
    await wait_gone([pid])


async def test_garbage_on_stdout_is_skipped(make_agent: AgentFactory) -> None:
    outcome = await run(await make_agent("garbage"), sink := RecordingSink(), prompt="through the noise")
    assert outcome.status == "completed" and sink.text == "echo: through the noise"
    assert len(sink.of(ToolCallEvent)) == 3


async def test_a_100_kib_tool_call_update_passes_intact(make_agent: AgentFactory) -> None:
    adapter = await make_agent("bigline", limits={"tool_content_bytes": 256 * KIB})
    outcome = await run(adapter, sink := RecordingSink())
    assert outcome.status == "completed"
    last = sink.of(ToolCallEvent)[-1].tool_call
    assert len(last["content"][0]["content"]["text"]) == 100 * KIB and "truncated" not in last


async def test_tool_call_content_over_the_cap_is_truncated(make_agent: AgentFactory) -> None:
    outcome = await run(await make_agent("bigline", limits={"tool_content_bytes": 8 * KIB}), sink := RecordingSink())
    assert outcome.status == "completed"
    last = sink.of(ToolCallEvent)[-1].tool_call
    assert last["truncated"] is True and len(orjson.dumps(last["content"])) <= 9 * KIB


@pytest.mark.parametrize("mode", ["hugeline", "runaway"])
async def test_a_line_over_the_limit_is_a_protocol_error_and_the_agent_is_killed(
    make_agent: AgentFactory, mode: str
) -> None:
    session = (await make_agent(mode, limits={"max_agent_line_bytes": 64 * KIB})).open_session("s1")
    outcome = await session.run_turn(turn_request(), RecordingSink())
    assert outcome.status == "failed" and outcome.error.code == "AGENT_PROTOCOL_ERROR"
    start = await wait_log(make_agent.log, lambda e: e.get("event") == "start")
    await wait_gone([start["pid"]])


async def test_an_unterminated_final_line_is_still_parsed(make_agent: AgentFactory) -> None:
    outcome = await run(await make_agent("unterminated"), sink := RecordingSink())
    assert outcome.status == "completed" and outcome.stop_reason == "end_turn"
    assert sink.text == "echo: hello"


async def test_a_stderr_flood_does_not_deadlock(make_agent: AgentFactory) -> None:
    with anyio.fail_after(10):
        outcome = await run(await make_agent("stderrflood"), sink := RecordingSink())
    assert outcome.status == "completed" and sink.text == "echo: hello"


async def test_unknown_agent_requests_get_method_not_found_and_notifications_nothing(make_agent: AgentFactory) -> None:
    outcome = await run(await make_agent("unknown-request"), sink := RecordingSink())
    assert outcome.status == "completed" and sink.text == "codes: -32601 -32601"
    responses = [e["id"] for e in read_log(make_agent.log) if e.get("event") == "recv" and e["method"] is None]
    assert responses == ["drain-1", "fs-1"]  # nothing answered the vendor notification


# ---- permissions -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "kinds", "expected"),
    [
        ("allow", "reject_once,allow_always,allow_once", "opt-allow_once"),
        ("allow", "reject_once,allow_always", "opt-allow_always"),
        ("deny", "allow_once,reject_always,reject_once", "opt-reject_once"),
        ("deny", "allow_once,reject_always", "opt-reject_always"),
        ("deny", "allow_once", "cancelled"),
    ],
)
async def test_permission_policy_picks_an_option(
    make_agent: AgentFactory, policy: str, kinds: str, expected: str
) -> None:
    adapter = await make_agent("permission", perm_kinds=kinds, permission_policy=policy)
    outcome = await run(adapter, sink := RecordingSink())
    assert outcome.status == "completed" and sink.text == f"permission: {expected}"
    assert sink.asked == []


async def test_permission_ask_forwards_the_request_and_returns_the_choice(make_agent: AgentFactory) -> None:
    sink = RecordingSink(answer="opt-reject_once")
    outcome = await run(await make_agent("permission", permission_policy="ask"), sink)
    assert outcome.status == "completed" and sink.text == "permission: opt-reject_once"
    [(tool_call, options)] = sink.asked
    assert tool_call["toolCallId"] == "t-perm" and len(options) == 4


async def test_permission_ask_with_an_unknown_option_answers_cancelled(make_agent: AgentFactory) -> None:
    outcome = await run(await make_agent("permission", permission_policy="ask"), sink := RecordingSink(answer="nope"))
    assert outcome.status == "completed" and sink.text == "permission: cancelled"


# ---- cancel ----------------------------------------------------------------------------------


async def test_adapter_aclose_ends_every_process(make_agent: AgentFactory) -> None:
    adapter = await make_agent()
    sessions = [adapter.open_session(f"s{i}") for i in range(2)]
    for session in sessions:
        await session.run_turn(turn_request(), RecordingSink())
    pids = [s.pid for s in sessions]
    assert all(process_alive(pid) for pid in pids)
    await adapter.aclose()
    await wait_gone(pids)


# ---- auth and models -------------------------------------------------------------------------


async def test_auth_required_then_authenticate_with_the_configured_method(make_agent: AgentFactory) -> None:
    outcome = await run(await make_agent("auth", auth_method="fake-key"))
    assert outcome.status == "completed"
    assert [r["params"] for r in received(make_agent.log, "authenticate")] == [{"methodId": "fake-key"}]
    assert len(received(make_agent.log, "session/new")) == 2


async def test_auth_required_without_a_method_is_agent_auth_required(make_agent: AgentFactory) -> None:
    outcome = await run(await make_agent("auth"))
    assert outcome.status == "failed" and outcome.error.code == "AGENT_AUTH_REQUIRED"
    assert outcome.error.data["code"] == -32000 and outcome.error.data["authMethods"] == ["fake-key"]


async def test_model_is_applied_with_the_model_config_option(make_agent: AgentFactory) -> None:
    session = (await make_agent("configoptions")).open_session("s1")
    first = await session.run_turn(turn_request(model="m-fast"), RecordingSink())
    second = await session.run_turn(turn_request(model="m-fast"), RecordingSink())
    assert first.resolved_model == second.resolved_model == "m-fast"
    calls = received(make_agent.log, "session/set_config_option")
    assert [(c["params"]["configId"], c["params"]["value"]) for c in calls] == [("model", "m-fast")]


async def test_model_is_applied_with_legacy_set_model(make_agent: AgentFactory) -> None:
    outcome = await run(await make_agent("models"), model="m-fast")
    assert outcome.resolved_model == "m-fast"
    assert [c["params"]["modelId"] for c in received(make_agent.log, "session/set_model")] == ["m-fast"]


async def test_model_is_applied_with_the_launch_flag_and_relaunched_on_change(make_agent: AgentFactory) -> None:
    session = (await make_agent(model_flag="-m")).open_session("s1")
    first = await session.run_turn(turn_request(model="m-one"), RecordingSink())
    second = await session.run_turn(turn_request(model="m-two"), RecordingSink())
    assert (first.resolved_model, second.resolved_model) == ("m-one", "m-two")
    argvs = [e["argv"] for e in read_log(make_agent.log) if e.get("event") == "start"]
    assert [a[a.index("-m") + 1] for a in argvs] == ["m-one", "m-two"]
    assert second.context_reset  # no loadSession: the relaunch starts fresh


async def test_config_model_is_used_when_the_turn_names_none(make_agent: AgentFactory) -> None:
    outcome = await run(await make_agent("configoptions", model="m-fast"))
    assert outcome.resolved_model == "m-fast"


async def test_a_model_that_cannot_be_applied_is_reported_not_resolved(make_agent: AgentFactory) -> None:
    outcome = await run(await make_agent("configoptions"), sink := RecordingSink(), model="m-unknown")
    assert outcome.status == "completed" and outcome.resolved_model is None
    [status] = [e for e in sink.of(StatusEvent) if e.event == "model_not_applied"]
    assert status.data == {"model": "m-unknown", "code": -32602}
    outcome = await run(await make_agent(), model="m-x")
    assert outcome.status == "completed" and outcome.resolved_model is None


# ---- environment, probes, presets ------------------------------------------------------------


async def test_child_environment_is_an_allow_list(make_agent: AgentFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BRIDGE_AUTH_TOKEN", "bridge-secret-token")
    monkeypatch.setenv("UNRELATED_SECRET", "x")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-passthrough0123456789")
    monkeypatch.setenv("LC_TESTING", "1")
    adapter = await make_agent(
        env={"FAKE_PROVIDER_KEY": "provider-value"}, env_passthrough=["OPENAI_API_KEY", "BRIDGE_AUTH_TOKEN"]
    )
    await run(adapter)
    env = set((await wait_log(make_agent.log, lambda e: e.get("event") == "start"))["env"])
    assert {"PATH", "HOME", "LC_TESTING", "OPENAI_API_KEY", "FAKE_PROVIDER_KEY"} <= env
    assert "BRIDGE_AUTH_TOKEN" not in env and "UNRELATED_SECRET" not in env


def test_child_env_drops_the_bridge_token_and_keeps_proxies() -> None:
    parent = {"PATH": "/bin", "https_proxy": "http://p:1", "XDG_CONFIG_HOME": "/c", "BRIDGE_AUTH_TOKEN": "t", "X": "1"}
    env = child_env({"BRIDGE_AUTH_TOKEN": "again"}, ["BRIDGE_AUTH_TOKEN"], parent=parent)
    assert env == {"PATH": "/bin", "https_proxy": "http://p:1", "XDG_CONFIG_HOME": "/c"}


async def test_probes_report_ok_not_found_and_errors(make_agent: AgentFactory) -> None:
    adapter = await make_agent()
    assert adapter.probe_cheap().status == "ok"
    full = await adapter.probe_full()
    assert full.status == "ok" and "fake-acp-agent" in full.detail
    missing = await make_agent(command="no-such-agent-command-xyz")
    assert missing.probe_cheap().status == "not_found" and (await missing.probe_full()).status == "not_found"
    exits = await make_agent(args=["-c", "import sys; sys.stderr.write('boom'); sys.exit(2)"])
    result = await exits.probe_full()
    assert (
        result.status == "error" and "code 2" in result.detail and "boom" not in result.detail
    )  # stderr: the log only
    assert "see the bridge's log" in result.detail
    silent = await (await make_agent(args=["-c", "import sys; sys.exit(3)"])).probe_full()
    assert silent.detail == "the agent exited with code 3 during initialize, with nothing on stderr"
    hangs = await make_agent(args=["-c", "import time; time.sleep(60)"], timeouts={"initialize_timeout": 0.3})
    assert (await hangs.probe_full()).status == "error"


def test_presets_name_the_agents_and_fill_missing_fields() -> None:
    assert {k: (p.command, p.args, p.label) for k, p in PRESETS.items()} == {
        "codex": ("codex-acp", [], "Codex"),
        "opencode": ("opencode", ["acp"], "OpenCode"),
        "gemini": ("gemini", ["--acp"], "Gemini"),
        "hermes": ("hermes", ["acp"], "Hermes"),
        "claude": ("claude-agent-acp", [], "Claude"),
    }
    assert PRESETS["gemini"].model_flag == "-m"
    filled = with_preset("gemini", {"model": "gemini-2.5-flash", "modelFlag": None})
    assert filled == {
        "model": "gemini-2.5-flash",
        "modelFlag": None,
        "command": "gemini",
        "args": ["--acp"],
        "label": "Gemini",
    }  # a null stays null: the preset's -m is off
    assert with_preset("mine", {"command": "x"}) == {"command": "x"}


def test_find_command_looks_on_path_then_in_the_agents_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for rel in ("tool-1.9.0/node_modules/.bin/tool", "tool-1.10.0/node_modules/.bin/tool", "venv-0.1/bin/pytool"):
        path = tmp_path / rel
        path.parent.mkdir(parents=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    monkeypatch.setenv("XWORKMATE_AGENTS_DIR", str(tmp_path))
    assert find_command("tool") == str(tmp_path / "tool-1.10.0/node_modules/.bin/tool")
    assert find_command("pytool") == str(tmp_path / "venv-0.1/bin/pytool")
    assert find_command("sh") == shutil.which("sh")
    assert find_command(sys.executable) == sys.executable
    assert find_command("absent-tool") is None
