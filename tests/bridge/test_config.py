"""Configuration: file discovery, ${VAR}, environment overrides, named tokens, errors naming keys."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bridge.config import ConfigError, load_config, token_principal
from bridge.wiring import provider_configs


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for var in ("BRIDGE_AUTH_TOKEN", "ACP_ALLOWED_ORIGINS", "BRIDGE_HOST", "BRIDGE_PORT", "BRIDGE_CONFIG_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)


def write(tmp_path, text: str):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_without_a_file():
    config = load_config()
    assert (config.host, config.port) == ("127.0.0.1", 8787)
    assert config.allowed_origins == ["https://xworkmate.svc.plus", "http://localhost:*", "http://127.0.0.1:*"]
    assert config.providers is None and config.auth_tokens == []


def test_default_file_in_the_working_directory_is_read(tmp_path):
    (tmp_path / "xworkmate-bridge.yaml").write_text("port: 9999\n")
    assert load_config().port == 9999


def test_env_overrides_file_and_flags_override_env(tmp_path, monkeypatch):
    path = write(tmp_path, "port: 1111\nhost: 127.0.0.1\nauthTokens: [filetoken]\n")
    monkeypatch.setenv("BRIDGE_PORT", "2222")
    monkeypatch.setenv("BRIDGE_AUTH_TOKEN", "a-token,b-token")
    monkeypatch.setenv("BRIDGE_HOST", "")  # empty values are ignored
    config = load_config(path)
    assert config.port == 2222 and config.host == "127.0.0.1"
    assert [(t.name, t.token) for t in config.auth_tokens] == [
        (token_principal("a-token"), "a-token"),
        (token_principal("b-token"), "b-token"),
    ]
    assert load_config(path, {"port": 3333}).port == 3333


def test_bridge_config_path_env_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_CONFIG_PATH", write(tmp_path, "port: 4444\n"))
    assert load_config().port == 4444


def test_named_and_unnamed_tokens(tmp_path):
    config = load_config(write(tmp_path, "authTokens: [one-secret, {name: ci, token: two-secret}]\n"))
    assert [(t.name, t.token) for t in config.auth_tokens] == [
        (token_principal("one-secret"), "one-secret"),
        ("ci", "two-secret"),
    ]
    moved = load_config(write(tmp_path, "authTokens: [{name: ci, token: two-secret}, extra-secret, one-secret]\n"))
    assert moved.auth_tokens[2].name == config.auth_tokens[0].name  # its place in the list does not matter
    assert config.auth_tokens[0].name.startswith("token-") and "one-secret" not in config.auth_tokens[0].name


def test_variables_expand_and_a_missing_one_is_an_error_naming_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_KEY", "k-123456")
    config = load_config(write(tmp_path, "providers:\n  mine: {command: agent, env: {API_KEY: '${MY_KEY}'}}\n"))
    assert config.providers["mine"].env["API_KEY"] == "k-123456"
    with pytest.raises(ConfigError, match=r"providers\.mine\.env\.API_KEY: environment variable \$\{NOPE\}"):
        load_config(write(tmp_path, "providers:\n  mine: {command: agent, env: {API_KEY: '${NOPE}'}}\n"))


@pytest.mark.parametrize(
    "text,key",
    [
        ("prot: 1\n", "prot"),
        ("port: many\n", "port"),
        ("providers:\n  x: {command: a, permissionPolicy: maybe}\n", "providers.x.permissionPolicy"),
        ("timeouts: {turnTimeout: -1}\n", "timeouts.turnTimeout"),
        ("limits: {maxOutputBytes: big}\n", "limits.maxOutputBytes"),
    ],
)
def test_invalid_values_name_the_key(tmp_path, text, key):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert key in str(err.value)


def test_bad_yaml_and_missing_file_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(write(tmp_path, "port: [1\n"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(tmp_path / "missing.yaml"))


def test_presets_merge_with_configured_entries(tmp_path):
    config = load_config(write(tmp_path, "providers:\n  codex: {}\n  gemini: {model: gemini-2.5-flash}\n"))
    entries, enabled = provider_configs(config)
    assert entries["codex"].command == "codex-acp" and entries["gemini"].args == ["--acp"]
    assert entries["gemini"].model == "gemini-2.5-flash" and enabled == {"codex", "gemini", "knowledge"}


def test_a_null_in_a_preset_entry_turns_the_preset_value_off(tmp_path):
    entries, _ = provider_configs(load_config(write(tmp_path, "providers:\n  gemini: {modelFlag: null}\n")))
    assert (entries["gemini"].command, entries["gemini"].args, entries["gemini"].model_flag) == (
        "gemini",
        ["--acp"],
        None,
    )
    with pytest.raises(ConfigError, match=r"providers\.codex\.command: required \(it is given as null\)"):
        provider_configs(load_config(write(tmp_path, "providers:\n  codex: {command: null}\n")))


def test_a_custom_acp_provider_needs_a_command(tmp_path):
    with pytest.raises(ConfigError, match=r"providers\.mine\.command"):
        provider_configs(load_config(write(tmp_path, "providers:\n  mine: {label: Mine}\n")))


def unlocated(error: Exception, file: object) -> str:
    """The error's lines without their line numbers (``file:12: key: …`` → ``file: key: …``)."""
    return re.sub(rf"(?m)^{re.escape(str(file))}:\d+: ", f"{file}: ", str(error))


@pytest.mark.parametrize(
    "text,message",
    [
        # a dict entry is named by its key, not by msgspec's `[...]`
        (
            "providers:\n  mine: {command: a, env: {API_KEY: 5}}\n",
            'providers.mine.env.API_KEY: Expected `str`, got `int` (YAML reads 5 as a number; quote it: "5")',
        ),
        ("providers:\n  mine: {command: a, foo: 1}\n", "providers.mine.foo: unknown key"),
        (
            "providers:\n  ok: {command: a}\n  bad: {command: b, env: {K: 1}}\ntimeouts: {turnTimeout: -1}\n",
            'providers.bad.env.K: Expected `str`, got `int` (YAML reads 1 as a number; quote it: "1")\n'
            "{file}: timeouts.turnTimeout: Expected `float` > 0.0",
        ),  # a later problem does not blame the first entry, and both are reported
        (
            "knowledgeSources: [{id: a, protocol: local-wiki}]\n",
            "knowledgeSources.0.root: a local-wiki source needs root",
        ),
        ("knowledge: {fanOut: 99}\n", "knowledge.fanOut: Expected `int` <= 32"),
        ("authTokens: ['']\n", "authTokens: a token must not be empty"),
        ("providers: [codex]\n", "providers: must be a mapping of provider ids to entries"),
        (
            "limits: {maxRunningTurns: 4, max_running_turns: 5}\n",
            "limits.maxRunningTurns: given twice, also as max_running_turns",
        ),
        ("providers:\n  mine: {comand: a}\n", "providers.mine.comand: unknown key (did you mean command?)"),
        (
            "profiles:\n  p: {script: a.py, timeoutSecs: 3}\n",
            "profiles.p.timeoutSecs: unknown key (did you mean timeout_secs?)",
        ),
        (
            "providers:\n  x: {command: a, permissionPolicy: maybe}\n",
            "providers.x.permissionPolicy: Invalid enum value 'maybe', expected one of 'allow', 'deny', 'ask'",
        ),
        (
            "authTokens: ['${XWM_TEST_UNSET_A}', '${XWM_TEST_UNSET_B}']\n",
            "authTokens.0: environment variable ${XWM_TEST_UNSET_A} is not set\n{file}: authTokens.1: environment variable "
            "${XWM_TEST_UNSET_B} is not set",
        ),
    ],
)
def test_an_error_names_the_exact_key(tmp_path, text, message):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    file = tmp_path / "cfg.yaml"
    assert unlocated(err.value, file) == f"{file}: " + message.replace("{file}", str(file))


def test_a_value_from_the_environment_or_a_flag_is_blamed_on_it_not_on_the_file(tmp_path, monkeypatch):
    path = write(tmp_path, "port: 18874\n")
    monkeypatch.setenv("BRIDGE_PORT", "abc")
    with pytest.raises(ConfigError, match=r"^environment variable BRIDGE_PORT: Expected `int`, got `str`$"):
        load_config(path)
    monkeypatch.delenv("BRIDGE_PORT")
    with pytest.raises(ConfigError, match=r"^flag --port: Expected `int` <= 65535$"):
        load_config(path, {"port": 99999})


def test_yaml_and_encoding_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "port: [1\n"))
    assert str(err.value).count(str(tmp_path / "cfg.yaml")) >= 2  # the prefix and YAML's own mark
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe: 1\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(str(tmp_path / "bin.yaml"))


def test_keys_may_use_their_python_names_and_an_empty_preset_entry_is_the_preset(tmp_path):
    config = load_config(
        write(tmp_path, "limits: {max_running_turns: 4}\nallow_insecure_no_auth: true\nproviders:\n  codex:\n")
    )
    assert config.limits.max_running_turns == 4 and config.allow_insecure_no_auth is True
    entries, _ = provider_configs(config)
    assert entries["codex"].command == "codex-acp"


def test_tokens_from_the_environment_replace_the_file_s_in_either_spelling_and_never_vanish(tmp_path, monkeypatch):
    path = write(tmp_path, "auth_tokens: [file-token]\n")
    monkeypatch.setenv("BRIDGE_AUTH_TOKEN", "env-token")
    assert [t.token for t in load_config(path).auth_tokens] == ["env-token"]
    monkeypatch.setenv("BRIDGE_AUTH_TOKEN", " , ")  # would have turned authentication off
    with pytest.raises(ConfigError, match=r"^environment variable BRIDGE_AUTH_TOKEN: no value in it"):
        load_config(path)


@pytest.mark.parametrize(
    "text,message",
    [
        ("authTokens: [{name: x, token: a}, {name: x, token: b}]\n", "authTokens: two tokens are named 'x'"),
        ("authTokens: [{name: local, token: a-token}]\n", "authTokens: a token cannot be named 'local'"),
        ("'-': /etc\n", "-: unknown key"),
        ("profile_dir: /etc\n", "profile_dir: unknown key"),
        ("a: " + "[" * 600 + "]" * 600 + "\n", "nested too deeply"),
    ],
)
def test_inputs_that_would_weaken_or_break_the_bridge_are_refused(tmp_path, text, message):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert unlocated(err.value, tmp_path / "cfg.yaml").startswith(f"{tmp_path / 'cfg.yaml'}: {message}")


def test_strings_that_pydantic_read_as_booleans_and_numbers_still_are(tmp_path, monkeypatch):
    monkeypatch.setenv("XWM_TEST_INSECURE", "yes")
    monkeypatch.setenv("XWM_TEST_PORT", "8080\r")  # a CRLF env file
    config = load_config(write(tmp_path, "allowInsecureNoAuth: '${XWM_TEST_INSECURE}'\nport: '${XWM_TEST_PORT}'\n"))
    assert config.allow_insecure_no_auth is True and config.port == 8080


# ---- every problem at once (issue: rough edges) ----------------------------------------------------


def test_every_problem_of_a_file_is_reported_in_one_run_with_its_line(tmp_path, monkeypatch):
    monkeypatch.delenv("XWM_TEST_UNSET", raising=False)
    text = (
        "port: abc\n"  # 1
        "limits:\n"
        "  maxQueuedTurnz: 3\n"  # 3
        "providers:\n"
        "  codx: {}\n"  # 5
        "  mine: {command: /bin/true, permisionPolicy: allow}\n"  # 6
        "profiles:\n"
        "  bot: {command: /bin/true, bogus: 1}\n"  # 8
        "workspaceRoots: ['${XWM_TEST_UNSET}']\n"  # 9
    )
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    file = tmp_path / "cfg.yaml"
    assert str(err.value).splitlines() == [
        f"{file}:1: port: Expected `int`, got `str`",
        f"{file}:3: limits.maxQueuedTurnz: unknown key (did you mean maxQueuedTurns?)",
        f"{file}:5: providers.codx.command: required (the provider is not a preset; did you mean the preset codex?)",
        f"{file}:6: providers.mine.permisionPolicy: unknown key (did you mean permissionPolicy?)",
        f"{file}:8: profiles.bot.bogus: unknown key",
        f"{file}:9: workspaceRoots.0: environment variable ${{XWM_TEST_UNSET}} is not set",
    ]


@pytest.mark.parametrize(
    "value,kind",
    [
        ("off", "a boolean"),
        ("no", "a boolean"),
        ("1.10", "a number"),
        ("0755", "a number"),
        ("22:22", "a number"),
        ("2024-01-01", "a date"),
    ],
)
def test_a_value_yaml_typed_where_text_was_meant_gets_a_quote_it_hint(tmp_path, value, kind):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, f"providers:\n  mine:\n    command: /bin/true\n    label: {value}\n"))
    assert str(err.value).endswith(
        f'providers.mine.label: Expected `str | null`, got `{_got(value)}` (YAML reads {value} as {kind}; quote it: "{value}")'
    )
    assert ":4: providers.mine.label" in str(err.value)


def _got(value: str) -> str:
    return {"off": "bool", "no": "bool", "1.10": "float", "2024-01-01": "date"}.get(value, "int")


def test_a_key_yaml_typed_gets_the_hint_too(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "providers:\n  mine:\n    command: /bin/true\n    env: {no: x}\n"))
    assert 'must be a string (YAML reads no as a boolean; quote it: "no")' in str(err.value)


def test_a_quoted_value_gets_no_hint(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "port: 'abc'\n"))
    assert "quote it" not in str(err.value)


# ---- environment references as shells do them -------------------------------------------------------


def test_environment_references_follow_the_shell(tmp_path, monkeypatch):
    monkeypatch.setenv("XWM_SET", "http://set.test")
    monkeypatch.setenv("XWM_EMPTY", "")
    monkeypatch.delenv("XWM_UNSET", raising=False)
    origins = [
        "${XWM_SET}",  # set
        "${XWM_UNSET:-http://a.test}",  # unset: the default
        "${XWM_EMPTY:-http://b.test}",  # empty: the default
        "${XWM_UNSET-http://c.test}",  # unset: the default
        "x${XWM_EMPTY-http://d.test}",  # set though empty: the empty value (warned of)
        "cost: $$5 and $HOME",  # $$ is a $; a bare $NAME is left as written
    ]
    config = load_config(write(tmp_path, "allowedOrigins:\n" + "".join(f"  - '{o}'\n" for o in origins)))
    assert config.allowed_origins == [
        "http://set.test",
        "http://a.test",
        "http://b.test",
        "http://c.test",
        "x",
        "cost: $5 and $HOME",
    ]
    assert config.load_warnings == (
        f"{tmp_path / 'cfg.yaml'}: allowedOrigins.4: environment variable ${{XWM_EMPTY}} is set but empty",
    )


def test_an_empty_variable_in_auth_tokens_is_an_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XWM_EMPTY_TOKEN", "")
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "authTokens: ['${XWM_EMPTY_TOKEN}']\n"))
    assert str(err.value).splitlines() == [
        f"{tmp_path / 'cfg.yaml'}:1: authTokens.0: environment variable ${{XWM_EMPTY_TOKEN}} is empty (a token must not be)"
    ]


def test_a_serve_logs_the_warnings_of_its_configuration(tmp_path):
    import subprocess
    import sys

    path = Path(write(tmp_path, "allowedOrigins: ['${XWM_EMPTY}http://x.test']\nport: 70000\n"))
    done = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XWM_EMPTY": ""},
        timeout=30,
    )
    assert done.returncode == 2 and "port: Expected `int` <= 65535" in done.stderr  # a problem: no start
    path.write_text("allowedOrigins: ['${XWM_EMPTY}http://x.test']\nhost: 192.0.2.1\nallowInsecureNoAuth: true\n")
    done = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "serve", "--config", str(path), "--port", "0"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XWM_EMPTY": ""},
        timeout=30,
    )
    assert done.returncode == 3  # it got as far as listening
    assert (
        "WARNING" in done.stderr
        and "allowedOrigins.0: environment variable ${XWM_EMPTY} is set but empty" in done.stderr
    )


def test_a_json_file_reads_as_its_yaml_twin_without_importing_pyyaml(tmp_path):
    """JSON is YAML: a JSON object is read with orjson, and PyYAML stays unloaded (bench case 6)."""
    import subprocess
    import sys

    body = '{"port": 9001, "authTokens": ["t0ken-aaaaaaaaaaaaaaaa"], "limits": {"maxRunningTurns": 3}}'
    json_file = tmp_path / "cfg.json"
    json_file.write_text("\n  " + body)
    twin = write(tmp_path, "port: 9001\nauthTokens: [t0ken-aaaaaaaaaaaaaaaa]\nlimits: {maxRunningTurns: 3}\n")
    read, yaml_read = load_config(str(json_file)), load_config(twin)
    assert (read.port, read.auth_tokens, read.limits) == (yaml_read.port, yaml_read.auth_tokens, yaml_read.limits)
    probe = f"import sys; from bridge.config import load_config; load_config({str(json_file)!r}); print('yaml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_a_flow_mapping_that_is_not_json_is_still_yaml_and_json_problems_have_lines(tmp_path):
    assert load_config(write(tmp_path, "{port: 9002, host: 127.0.0.1}")).port == 9002
    with pytest.raises(ConfigError, match=r":3: port"):
        load_config(write(tmp_path, '{\n "host": "127.0.0.1",\n "port": "high"\n}'))
    with pytest.raises(ConfigError, match=r":4: limits\.maxSessions"):  # JSON may indent with tabs; YAML may not
        load_config(write(tmp_path, '{\n\t"host": "127.0.0.1",\n\t"limits": {\n\t\t"maxSessions": "many"\n\t}\n}'))


@pytest.mark.parametrize("number", ["100000000000000000000", "18446744073709551617"])
def test_a_json_integer_past_64_bits_stays_an_integer_as_in_yaml(tmp_path, number):
    config = load_config(write(tmp_path, '{"limits": {"maxRemoteWorkspaceBytes": %s}}' % number))
    assert config.limits.max_remote_workspace_bytes == int(number)


def test_a_json_exponent_without_a_dot_is_text_as_in_yaml_and_other_floats_are_floats(tmp_path):
    config = load_config(write(tmp_path, '{"authTokens": [{"name": "ops", "token": 6e23}], "host": 1e3}'))
    assert (config.auth_tokens[0].token, config.host) == ("6e23", "1e3")
    config = load_config(write(tmp_path, '{"sseKeepalive": 2.5, "limits": {"maxSessions": 1.0e+2}}'))
    assert (config.sse_keepalive, config.limits.max_sessions) == (2.5, 100)


def test_a_knowledge_provider_without_its_type_is_told_how_to_write_it(tmp_path):
    with pytest.raises(ConfigError, match=r"providers\.knowledge\.command: required .*\{type: knowledge\}"):
        load_config(write(tmp_path, "providers:\n  knowledge: {}\n"))


def test_a_key_given_twice_is_a_warning_naming_both_lines_and_the_last_value_is_used(tmp_path):
    """YAML says keys are unique; PyYAML and orjson keep the last value without a word."""
    config = load_config(
        write(tmp_path, "port: 8796\nhost: 127.0.0.1\nlimits:\n  maxSessions: 3\n  maxSessions: 4\nport: 8795\n")
    )
    assert (config.port, config.limits.max_sessions) == (8795, 4)
    file = tmp_path / "cfg.yaml"
    assert sorted(config.load_warnings) == [
        f"{file}: line 5: maxSessions is given again (first on line 4); the last value is used",
        f"{file}: line 6: port is given again (first on line 1); the last value is used",
    ]


def test_a_json_key_given_twice_gets_the_same_warning_and_json_without_repeats_none(tmp_path):
    config = load_config(write(tmp_path, '{\n "port": 8796,\n "port": 8795\n}'))
    assert config.port == 8795
    assert config.load_warnings == (
        f"{tmp_path / 'cfg.yaml'}: line 3: port is given again (first on line 2); the last value is used",
    )
    two = '{"providers": {"codex": {"label": "a"}, "gemini": {"label": "b"}}}'  # one key, two objects
    assert load_config(write(tmp_path, two)).load_warnings == ()


def test_a_yaml_merge_key_is_no_repeat(tmp_path):
    config = load_config(write(tmp_path, "limits:\n  <<: {maxSessions: 3, maxQueuedTurns: 2}\n  maxSessions: 4\n"))
    assert (config.limits.max_sessions, config.limits.max_queued_turns, config.load_warnings) == (4, 2, ())
