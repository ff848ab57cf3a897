"""Configuration: file discovery, ${VAR}, environment overrides, named tokens, errors naming keys."""

from __future__ import annotations

import pytest

from bridge.config import ConfigError, load_config
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
    assert [(t.name, t.token) for t in config.auth_tokens] == [("token-1", "a-token"), ("token-2", "b-token")]
    assert load_config(path, {"port": 3333}).port == 3333


def test_bridge_config_path_env_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_CONFIG_PATH", write(tmp_path, "port: 4444\n"))
    assert load_config().port == 4444


def test_named_and_unnamed_tokens(tmp_path):
    config = load_config(write(tmp_path, "authTokens: [one-secret, {name: ci, token: two-secret}]\n"))
    assert [(t.name, t.token) for t in config.auth_tokens] == [("token-1", "one-secret"), ("ci", "two-secret")]


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
    assert entries["gemini"].model == "gemini-2.5-flash" and enabled == {"codex", "gemini"}


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


@pytest.mark.parametrize(
    "text,message",
    [
        # a dict entry is named by its key, not by msgspec's `[...]`
        (
            "providers:\n  mine: {command: a, env: {API_KEY: 5}}\n",
            "providers.mine.env.API_KEY: Expected `str`, got `int`",
        ),
        ("providers:\n  mine: {command: a, foo: 1}\n", "providers.mine.foo: unknown key"),
        (
            "providers:\n  ok: {command: a}\n  bad: {command: b, env: {K: 1}}\ntimeouts: {turnTimeout: -1}\n",
            "providers.bad.env.K: Expected `str`, got `int`",
        ),  # a later problem does not blame the first entry
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
    assert str(err.value) == f"{file}: " + message.replace("{file}", str(file))


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
        ("authTokens: [a, {name: token-1, token: b}]\n", "authTokens: two tokens are named 'token-1'"),
        ("'-': /etc\n", "-: unknown key"),
        ("profile_dir: /etc\n", "profile_dir: unknown key"),
        ("a: " + "[" * 600 + "]" * 600 + "\n", "nested too deeply"),
    ],
)
def test_inputs_that_would_weaken_or_break_the_bridge_are_refused(tmp_path, text, message):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert str(err.value).startswith(f"{tmp_path / 'cfg.yaml'}: {message}")


def test_strings_that_pydantic_read_as_booleans_and_numbers_still_are(tmp_path, monkeypatch):
    monkeypatch.setenv("XWM_TEST_INSECURE", "yes")
    monkeypatch.setenv("XWM_TEST_PORT", "8080\r")  # a CRLF env file
    config = load_config(write(tmp_path, "allowInsecureNoAuth: '${XWM_TEST_INSECURE}'\nport: '${XWM_TEST_PORT}'\n"))
    assert config.allow_insecure_no_auth is True and config.port == 8080
