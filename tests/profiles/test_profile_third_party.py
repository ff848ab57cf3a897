"""Real third-party profile code and agents run as exec profiles, offline:

* a profile written with the AgentProc SDK ``agentproc==0.4.2`` (PyPI), run with the virtualenv that
  scripts/install-profile-tools.sh makes, and the SDK's bundled ``echo-agent`` profile unchanged;
* ``hermes -z`` (hermes-agent 0.19.0 from ``make agents``) as a ``command:`` profile against the
  fake model server;
* ``type: claude-code``: the Claude Code CLI bundled by claude-agent-acp 0.23.1, in print mode with
  stream-json, against the fake Anthropic server: streamed deltas, and ``--resume`` on turn two;
* a profile file in the iLink Hub Bridge layout (``profiles:``) loaded and run as it is.

Tools that are not installed fail with the command that installs them (`make test` installs them).
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import yaml

from compat.profile.adapter import ProfileAdapter
from compat.profile.settings import ProfileConfig, find_claude_cli, parse_profile, parse_profiles, tools_dir
from compat.settings import Limits, Timeouts
from tests.e2e import agents
from tests.fakes.fake_llm import FakeLLM, fake_llm  # noqa: F401  (fixture)

from .conftest import TEST_TIMEOUTS, ProfileFactory, deltas, request, run_turn

pytestmark = pytest.mark.timeout(120)

AGENTPROC = tools_dir() / "agentproc-0.4.2"
CHUNKS = ["Hello ", "from ", "mock"]


def _agentproc_python() -> str:
    python = AGENTPROC / "bin" / "python"
    if not python.exists():
        pytest.fail("agentproc 0.4.2 is not installed: run scripts/install-profile-tools.sh")
    return str(python)


# ---- agentproc 0.4.2 -----------------------------------------------------------------------------


async def test_an_agentproc_sdk_profile_streams_and_keeps_its_session(make_profile: ProfileFactory) -> None:
    adapter = make_profile(script="agentproc_bot.py", command=_agentproc_python())
    session = adapter.open_session("s1")
    outcome, sink = await run_turn(session, "hi", principal="alice", thread_id="room-1")
    assert outcome.status == "completed" and outcome.upstream_session_id == "ap-1", outcome
    # partials live; the SDK prints AGENT_SESSION after them; the body differs, so it follows
    assert deltas(sink) == ["Hel", "lo ", "wörld\n", "✓", "\nfinal body from alice in room-1"]

    again, sink = await run_turn(session, "again")
    assert again.upstream_session_id == "ap-1+"


async def test_agentproc_sdk_errors_map_to_profile_error_and_profile_exit(make_profile: ProfileFactory) -> None:
    session = make_profile(script="agentproc_bot.py", command=_agentproc_python()).open_session("s1")
    outcome, sink = await run_turn(session, "fail")
    assert outcome.error.code == "PROFILE_ERROR" and outcome.error.message == "the model refused"
    assert "".join(deltas(sink)) == "the model refused"
    outcome, sink = await run_turn(session, "crash")  # the SDK prints the exception on stderr, exits 1
    assert outcome.error.code == "PROFILE_EXIT" and outcome.error.data["exitCode"] == 1
    assert "include_stderr_in_reply" in outcome.error.data["hint"]  # the SDK wrote the reason on stderr


async def test_an_agentproc_sdk_profile_with_streaming_off_replies_with_its_body(make_profile: ProfileFactory) -> None:
    session = make_profile(script="agentproc_bot.py", command=_agentproc_python(), streaming=False).open_session("s1")
    outcome, sink = await run_turn(session, "hi")
    assert deltas(sink) == ["final body from local in t1"]


async def test_the_agentproc_bundled_echo_agent_profile_runs_unchanged() -> None:
    python = _agentproc_python()
    site = Path(python).parent.parent / "lib"
    profile_dir = next(site.glob("python*/site-packages/agentproc/hub_data/echo-agent"))
    block = yaml.safe_load((profile_dir / "profile.yaml").read_text())["agentproc"]
    assert block["command"] == "python3 {{PROFILE_DIR}}/bridge.py"
    adapter = ProfileAdapter(
        "echo-agent",
        parse_profile("profiles.echo-agent", block),
        Limits(),
        Timeouts(**TEST_TIMEOUTS),
        profile_dir=profile_dir,
    )
    try:
        outcome, sink = await run_turn(adapter.open_session("s1"), "hi")
    finally:
        await adapter.aclose()
    assert outcome.status == "completed" and deltas(sink) == ["You said: hi"]


# ---- hermes -z -----------------------------------------------------------------------------------


@pytest.mark.e2e
async def test_hermes_one_shot_as_a_command_profile_answers(fake_llm: FakeLLM, tmp_path: Path) -> None:
    if not agents.installed("hermes"):
        pytest.fail("hermes-agent 0.19.0 is not installed: run `make agents`")
    fake_llm.set_reply(chunks=CHUNKS, delay=0.02)
    recipe = agents.hermes_recipe(fake_llm.base_url, tmp_path)
    profile = ProfileConfig(
        command=recipe["command"],
        args=["-z", "{{MESSAGE}}"],
        env=recipe["env"],
        cwd=recipe["cwd"],
        timeout_secs=90,
        label="Hermes one-shot",
    )
    adapter = ProfileAdapter("hermes-z", profile, Limits(), Timeouts(**TEST_TIMEOUTS), profile_dir=tmp_path)
    try:
        outcome, sink = await run_turn(adapter.open_session("s1"), "Say hello from the profile")
    finally:
        await adapter.aclose()
    context = f"{outcome}\n{fake_llm.summary()}"
    assert outcome.status == "completed", context
    assert "".join(deltas(sink)).strip() == "Hello from mock", context
    assert any("Say hello from the profile" in r.text() for r in fake_llm.main_requests()), context


# ---- type: claude-code ---------------------------------------------------------------------------


def _claude_profile(fake: FakeLLM, tmp_path: Path, **fields: object) -> tuple[ProfileAdapter, dict]:
    if not agents.installed("claude") or find_claude_cli() is None:
        pytest.fail("claude-agent-acp 0.23.1 is not installed: run `make agents`")
    recipe = agents.claude_recipe(fake.base_url, tmp_path)
    profile = parse_profile(
        "profiles.claude-print", {"type": "claude-code", "env": recipe["env"], "timeout_secs": 90, **fields}
    )
    adapter = ProfileAdapter("claude-print", profile, Limits(), Timeouts(**TEST_TIMEOUTS), profile_dir=tmp_path)
    return adapter, recipe


@pytest.mark.e2e
def test_claude_code_runs_the_bundled_cli_in_print_mode_and_resumes(fake_llm: FakeLLM, tmp_path: Path) -> None:
    adapter, _ = _claude_profile(fake_llm, tmp_path)
    first = adapter.launch(request("hi", model="claude-sonnet-4-6"), None)
    assert first.argv[0].endswith("node") and first.argv[1] == find_claude_cli()
    assert first.argv[2:] == [
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--include-partial-messages",
        "--model",
        "claude-sonnet-4-6",
    ]
    assert first.stdin == b"hi" and "AGENT_MESSAGE" not in first.env
    later = adapter.launch(request("more"), "sess-1")
    assert later.argv[-2:] == ["--resume", "sess-1"]


@pytest.mark.e2e
async def test_claude_code_streams_deltas_and_resumes_its_session(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.set_reply(chunks=CHUNKS, delay=0.02)
    adapter, recipe = _claude_profile(fake_llm, tmp_path, cwd=str(Path(tmp_path) / "claude" / "work"))
    session = adapter.open_session("s1")
    try:
        outcome, sink = await run_turn(session, "Say hello", cwd=recipe["session_cwd"])
        context = f"{outcome}\n{fake_llm.summary()}"
        assert outcome.status == "completed", context
        assert [d for d in deltas(sink) if d] == CHUNKS, context  # one delta per text_delta, nothing twice
        first_id = outcome.upstream_session_id
        assert first_id and outcome.usage and outcome.usage["outputTokens"] >= 1, context
        assert outcome.resolved_model == "claude-sonnet-4-6"

        fake_llm.set_reply("Second answer")
        again, sink = await run_turn(session, "And again?", cwd=recipe["session_cwd"])
        assert again.status == "completed" and "".join(deltas(sink)) == "Second answer", again
        assert again.upstream_session_id, again
    finally:
        await adapter.aclose()
    last = fake_llm.main_requests()[-1]
    # --resume <id> brought back the first turn: the model sees the whole conversation
    assert "Say hello" in last.text() and "Hello from mock" in last.text() and "And again?" in last.text()


@pytest.mark.e2e
async def test_claude_code_with_streaming_off_replies_with_the_result_text(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.set_reply(chunks=CHUNKS)
    adapter, recipe = _claude_profile(fake_llm, tmp_path, streaming=False)
    try:
        outcome, sink = await run_turn(adapter.open_session("s1"), "Say hello", cwd=recipe["session_cwd"])
    finally:
        await adapter.aclose()
    assert outcome.status == "completed" and deltas(sink) == ["Hello from mock"], outcome


# ---- an iLink Hub Bridge profile file ------------------------------------------------------------

ILINK_FILE = """\
# ilink-hub-bridge.yaml (multi-profile form): only `profiles:` is read by xworkmate-bridge
profiles:
  helper:
    script: ./bots/helper.py
    args: ["--name", "{{SESSION_NAME}}", "--home", "{{PROFILE_DIR}}"]
    stdin: message
    timeout_secs: 30
    env:
      GREETING: "hello ${ILINK_TEST_USER}"
    include_stderr_in_reply: false
    cli_session_first_line_prefix: "AGENT_SESSION:"
  oneshot:
    command: bash
    args: ["{{PROFILE_DIR}}/bots/oneshot.sh", "{{MESSAGE}}", "{{SESSION_ID}}"]
    streaming: false
    send_error_reply: true
"""
HELPER = """\
import os, sys
message = sys.stdin.read()
print("AGENT_SESSION:helper-" + (os.environ["AGENT_SESSION_ID"] or "0"))
print(f"{os.environ['GREETING']}: {message} {sys.argv[1:]}")
sys.stderr.write("debug noise\\n")
"""
ONESHOT = """\
printf 'AGENT_PARTIAL:"ignored when not streaming"\\n'
printf 'AGENT_SESSION:one-%s\\n' "${2:-new}"
printf 'you sent: %s\\n' "$1"
"""


async def test_an_ilink_profile_file_loads_and_runs_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ILINK_TEST_USER", "ilinker")
    (tmp_path / "bots").mkdir()
    (tmp_path / "bots" / "helper.py").write_text(HELPER)
    (tmp_path / "bots" / "oneshot.sh").write_text(ONESHOT)
    (tmp_path / "ilink-hub-bridge.yaml").write_text(ILINK_FILE)
    data = yaml.safe_load((tmp_path / "ilink-hub-bridge.yaml").read_text())
    profiles, _ = parse_profiles(data["profiles"], None, profile_dir=tmp_path)
    adapters = {
        pid: ProfileAdapter(pid, p, Limits(), Timeouts(**TEST_TIMEOUTS), profile_dir=tmp_path)
        for pid, p in profiles.items()
    }
    try:
        helper = adapters["helper"].open_session("s1")
        outcome, sink = await run_turn(helper, "multi\nline", thread_id="chat-7")
        assert outcome.status == "completed" and outcome.upstream_session_id == "helper-0", outcome
        home = str(tmp_path.resolve())
        assert "".join(deltas(sink)) == f"hello ilinker: multi\nline ['--name', 'chat-7', '--home', '{home}']"
        outcome, _ = await run_turn(helper, "again")
        assert outcome.upstream_session_id == "helper-helper-0"

        oneshot = adapters["oneshot"].open_session("s2")
        outcome, sink = await run_turn(oneshot, "it's $HOME; rm -rf /")
        assert deltas(sink) == ["you sent: it's $HOME; rm -rf /"] and outcome.upstream_session_id == "one-new"
        outcome, _ = await run_turn(oneshot, "x")
        assert outcome.upstream_session_id == "one-one-new"
    finally:
        for adapter in adapters.values():
            await adapter.aclose()


def test_ilink_profile_keys_are_the_ilink_names() -> None:
    fields = {f.encode_name for f in msgspec.structs.fields(ProfileConfig)}  # the keys a file uses
    assert {
        "script",
        "command",
        "args",
        "cwd",
        "env",
        "timeout_secs",
        "streaming",
        "stdin",
        "send_error_reply",
        "include_stderr_in_reply",
        "cli_session_first_line_prefix",
        "label",
        "type",
        "max_concurrent",
        "description",
        "max_reply_chars",
        "truncation_suffix",
    } == fields
