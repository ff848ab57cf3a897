"""Profile configuration: the iLink keys, errors that name the profile and the key, the runtime by
script extension, and profiles sharing the providers' id space. No processes are started."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from compat.profile.settings import (
    ProfileConfig,
    ProfileConfigError,
    find_tsx,
    parse_profile,
    parse_profiles,
    resolve_runtime,
)

from .conftest import SCRIPTS


def _error(raw: object, where: str = "profiles.bot") -> str:
    with pytest.raises(ProfileConfigError) as info:
        parse_profile(where, raw)
    return str(info.value)


def test_defaults_follow_the_ilink_profile_spec() -> None:
    profile = ProfileConfig(script="bot.py")
    assert (profile.type, profile.timeout_secs, profile.streaming, profile.stdin) == ("exec", 300, True, "none")
    assert profile.send_error_reply is True and profile.include_stderr_in_reply is False
    assert profile.max_concurrent == 8 and profile.args == [] and profile.env == {}


def test_an_ilink_hub_profile_with_every_profile_key_is_accepted() -> None:
    raw = {
        "script": "bot.py",
        "stdin": "message",
        "timeout_secs": 600,
        "max_reply_chars": 4000,
        "truncation_suffix": "\n\n…(truncated)",
        "include_stderr_in_reply": True,
        "streaming": False,
        "cli_session_first_line_prefix": "AGENT_SESSION:",
        "description": "Replies from bot.py",
        "env": {"A": "1"},
        "args": [],
        "cwd": ".",
    }
    profile = parse_profile("profiles.bot", raw)
    assert (profile.description, profile.max_reply_chars, profile.timeout_secs) == ("Replies from bot.py", 4000, 600)
    assert _error({"script": "a.py", "max_reply_chars": 0}).startswith("profiles.bot.max_reply_chars: ")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"script": "a.py", "max_reply_char": 3}, "profiles.bot.max_reply_char: unknown key"),
        ({"script": "a.py", "timeout_secs": 0}, "profiles.bot.timeout_secs: "),
        ({"script": "a.py", "stdin": "file"}, "profiles.bot.stdin: "),
        ({"script": "a.py", "streaming": "sometimes"}, "profiles.bot.streaming: "),
        ({"script": "a.py", "max_concurrent": 0}, "profiles.bot.max_concurrent: "),
        ({"script": "a.py", "type": "codex"}, "profiles.bot.type: "),
        ({"script": "a.py", "args": "--x"}, "profiles.bot.args: "),
        ({"script": "a.py", "env": {"A": 1}}, "profiles.bot.env.A: "),
        ({"script": "  "}, "profiles.bot.script: must not be empty"),
        ({"timeout_secs": 5}, "profiles.bot: one of script or command is required"),
        ({"command": "bash", "args": ["-c", "echo {{MESSAGE}}"]}, "profiles.bot: {{MESSAGE}} in args"),
        ({"command": "/bin/sh -ec", "args": ["run {{MESSAGE}}"]}, "profiles.bot: {{MESSAGE}} in args"),
        (
            {"script": "a.py", "env": {"K": "${PROFILE_TEST_UNSET_VAR}"}},
            "profiles.bot.env: environment variable ${PROFILE_TEST_UNSET_VAR} is not set",
        ),
        ("just a string", "profiles.bot: "),
    ],
)
def test_an_invalid_profile_is_reported_with_its_profile_and_key(raw: object, expected: str) -> None:
    assert _error(raw).startswith(expected)


def test_variables_are_expanded_and_the_message_may_go_to_a_script_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROFILE_TEST_KEY", "k-123")
    raw = {
        "command": "bash",
        "args": ["run.sh", "{{MESSAGE}}"],
        "env": {"KEY": "${PROFILE_TEST_KEY}"},
        "maxConcurrent": 2,
    }  # camelCase is accepted too
    profile = parse_profile("profiles.bot", raw)
    assert profile.env == {"KEY": "k-123"} and profile.max_concurrent == 2 and profile.args == ["run.sh", "{{MESSAGE}}"]
    # a value is expanded once: a variable's own ${...} text stays as it is
    monkeypatch.setenv("PROFILE_TEST_INDIRECT", "${PROFILE_TEST_KEY}")
    assert parse_profile("profiles.bot", {"command": "${PROFILE_TEST_INDIRECT}"}).command == "${PROFILE_TEST_KEY}"
    monkeypatch.setenv("PROFILE_TEST_BLANK", " ")
    assert _error({"command": "${PROFILE_TEST_BLANK}"}).startswith("profiles.bot.command: must not be empty")


def test_profiles_and_providers_share_one_id_space(tmp_path: Path) -> None:
    (tmp_path / "bot.py").write_text("print('hi')")
    providers = {
        "codex": {},
        "mine": {"type": "profile", "script": "bot.py", "timeout_secs": 10},
        "claude-print": {"type": "claude-code", "command": shutil.which("bash")},
    }
    found, rest = parse_profiles({"helper": {"script": "bot.py"}}, providers, profile_dir=tmp_path)
    assert list(found) == ["helper", "mine", "claude-print"] and rest == {"codex": {}}
    assert found["mine"].type == "exec" and found["mine"].timeout_secs == 10
    assert found["claude-print"].type == "claude-code"

    with pytest.raises(ProfileConfigError, match=r"^profiles\.codex: the id is also used by providers\.codex"):
        parse_profiles({"codex": {"script": "bot.py"}}, providers, profile_dir=tmp_path)
    with pytest.raises(ProfileConfigError, match=r"^providers\.mine\.scrip: unknown key"):
        parse_profiles(None, {"mine": {"type": "profile", "scrip": "bot.py"}}, profile_dir=tmp_path)
    with pytest.raises(ProfileConfigError, match=r"^profiles: must be a mapping"):
        parse_profiles(["bot"], None, profile_dir=tmp_path)


def test_loading_checks_the_script_and_the_runtime(tmp_path: Path) -> None:
    with pytest.raises(ProfileConfigError, match=r"^profiles\.bot\.script: '.*nope\.py' does not exist"):
        parse_profiles({"bot": {"script": "nope.py"}}, None, profile_dir=tmp_path)
    assert parse_profiles({"bot": {"script": "nope.py"}}, None, profile_dir=tmp_path, check_runtime=False)[0]
    (tmp_path / "tool").write_text("#!/bin/sh\necho hi\n")
    with pytest.raises(ProfileConfigError, match=r"^profiles\.bot\.script: .* is not executable"):
        parse_profiles({"bot": {"script": "tool"}}, None, profile_dir=tmp_path)
    with pytest.raises(ProfileConfigError, match=r"^providers\.p\.command: 'no-such-command-x' is not"):
        parse_profiles(None, {"p": {"type": "profile", "command": "no-such-command-x"}}, profile_dir=tmp_path)


@pytest.mark.parametrize(
    ("script", "runtime"),
    [
        ("echo.py", "python3"),
        ("echo.js", "node"),
        ("echo.sh", "bash"),
        ("x.mjs", "node"),
        ("x.cjs", "node"),
        ("x.bash", "bash"),
        ("x.rb", "ruby"),
        ("x.ts", "tsx"),
    ],
)
def test_the_runtime_comes_from_the_script_extension(script: str, runtime: str, tmp_path: Path) -> None:
    (tmp_path / script).write_text("")
    profile = ProfileConfig(script=script)
    installed = find_tsx() if runtime == "tsx" else shutil.which(runtime)
    if installed is None:
        with pytest.raises(ProfileConfigError, match=rf"^profiles\.bot\.script: runtime '{runtime}' is not installed"):
            resolve_runtime(profile, tmp_path, where="profiles.bot")
        return
    argv = resolve_runtime(profile, tmp_path, where="profiles.bot")
    assert argv == [installed, str(tmp_path / script)]


def test_a_runtime_that_is_not_installed_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bot.rb").write_text("")
    (tmp_path / "bot.ts").write_text("")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("XWORKMATE_TOOLS_DIR", str(empty))
    with pytest.raises(ProfileConfigError, match=r"^profiles\.bot\.script: runtime 'ruby' is not installed"):
        parse_profiles({"bot": {"script": "bot.rb"}}, None, profile_dir=tmp_path)
    with pytest.raises(
        ProfileConfigError, match=r"runtime 'tsx' is not installed \(run scripts/install-profile-tools\.sh\)"
    ):
        parse_profiles({"bot": {"script": "bot.ts"}}, None, profile_dir=tmp_path)


def test_command_replaces_the_runtime_and_unknown_extensions_run_directly(tmp_path: Path) -> None:
    python = shutil.which("python3")
    assert python is not None
    profile = ProfileConfig(script="echo.py", command=python)
    assert resolve_runtime(profile, SCRIPTS) == [python, str(SCRIPTS / "echo.py")]
    assert resolve_runtime(ProfileConfig(script="echo-exec"), SCRIPTS) == [str(SCRIPTS / "echo-exec")]
    split = ProfileConfig(command="python3 {{PROFILE_DIR}}/echo.py")
    assert resolve_runtime(split, SCRIPTS) == [python, str(SCRIPTS / "echo.py")]


def test_claude_code_needs_the_bundled_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XWORKMATE_AGENTS_DIR", str(tmp_path))
    with pytest.raises(ProfileConfigError, match=r"^profiles\.c\.type: claude-code needs .*cli\.js"):
        parse_profiles({"c": {"type": "claude-code"}}, None, profile_dir=tmp_path)
    cli = tmp_path / "claude-agent-acp-9.9.9" / "node_modules/@anthropic-ai/claude-agent-sdk/cli.js"
    cli.parent.mkdir(parents=True)
    cli.write_text("")
    if shutil.which("node"):
        argv = resolve_runtime(ProfileConfig(type="claude-code"), tmp_path)
        assert argv == [shutil.which("node"), str(cli)]


def test_probe_cheap_reports_what_is_missing(tmp_path: Path) -> None:
    from compat.profile.adapter import ProfileAdapter
    from compat.settings import Limits, Timeouts

    adapter = ProfileAdapter("bot", ProfileConfig(script="gone.py"), Limits(), Timeouts(), profile_dir=tmp_path)
    probe = adapter.probe_cheap()
    assert probe.status == "not_found" and probe.detail.startswith("profiles.bot.script:")
    assert os.path.isabs(str(adapter.profile_dir))


def test_a_ruby_profile_is_started_with_its_output_line_buffered(tmp_path, monkeypatch) -> None:
    """Ruby block-buffers a pipe: the bridge starts ``.rb`` scripts with ``STDOUT.sync = true``."""
    import compat.profile.settings as settings

    (tmp_path / "bot.rb").write_text("puts 'AGENT_PARTIAL:\"hi\"'\n")
    monkeypatch.setattr(settings.shutil, "which", lambda name: f"/usr/bin/{name}")
    profile = settings.parse_profile("profiles.rb", {"script": "bot.rb"})
    argv = settings.resolve_runtime(profile, tmp_path)
    assert argv == ["/usr/bin/ruby", "-e", settings.RUBY_LINE_BUFFERED, str(tmp_path / "bot.rb")]
    assert "STDOUT.sync = true" in settings.RUBY_LINE_BUFFERED and "load($0)" in settings.RUBY_LINE_BUFFERED


def test_every_profile_run_asks_python_for_line_buffered_output() -> None:
    from compat.profile.adapter import LINE_BUFFERED_ENV, _profile_env

    assert _profile_env({}, {})["PYTHONUNBUFFERED"] == "1" == LINE_BUFFERED_ENV["PYTHONUNBUFFERED"]
    assert _profile_env({"PYTHONUNBUFFERED": ""}, {})["PYTHONUNBUFFERED"] == ""  # the profile's env wins


def test_every_unusable_profile_is_reported_at_once_and_the_good_ones_kept(tmp_path: Path) -> None:
    profiles = {
        "a": {"script": "gone.py"},
        "good": {"command": shutil.which("true")},
        "b": {"command": shutil.which("true"), "bogus": 1, "timeout_secs": "x"},
    }
    with pytest.raises(ProfileConfigError) as err:
        parse_profiles(profiles, None, profile_dir=tmp_path)
    assert str(err.value).splitlines() == [
        f"profiles.a.script: '{tmp_path / 'gone.py'}' does not exist",
        "profiles.b.bogus: unknown key",
        "profiles.b.timeout_secs: Expected `float`, got `str`",
    ]
    assert list(err.value.found) == ["good"]
