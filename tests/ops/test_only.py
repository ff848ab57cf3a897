"""One-provider entry points: ``serve --only PROVIDER`` and the original bridge's
``gemini-acp-adapter``, ``hermes-acp-adapter`` and ``opencode-acp-adapter`` scripts start with only
their provider in ``acp.capabilities`` (the knowledge provider and the gateway off unless they are it)."""

from __future__ import annotations

import json
import os
import socket
import sys
import urllib.request
from pathlib import Path

import pytest

from bridge.config import BridgeConfig, ConfigError, load_config, only_provider
from bridge.wiring import build_orchestrator
from tests.helpers import serving

pytestmark = pytest.mark.timeout(90)
BIN = Path(sys.executable).parent


def catalog(config: BridgeConfig) -> tuple[list[str], list[str]]:
    orch = build_orchestrator(config)
    caps = orch.capabilities()
    return [p.provider_id for p in caps.provider_catalog], [p.provider_id for p in caps.gateway_providers]


def base(tmp_path: Path, **extra) -> BridgeConfig:
    script = tmp_path / "bot.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o755)
    raw = {
        "stateDir": str(tmp_path / "state"),
        "providers": {"codex": {}, "gemini": {}, "handbook": {"type": "knowledge"}},
        "profiles": {"bot": {"type": "exec", "script": str(script)}},
        "gateway": {"url": "ws://127.0.0.1:9"},
        **extra,
    }
    path = tmp_path / "bridge.yaml"
    path.write_text(json.dumps(raw))  # JSON is YAML
    return load_config(str(path))


@pytest.mark.parametrize(
    ("only", "agents", "gateways"),
    [
        ("gemini", ["gemini"], []),
        ("handbook", ["handbook"], []),
        ("knowledge", ["knowledge"], []),
        ("bot", ["bot"], []),
        ("openclaw", [], ["openclaw"]),
        ("hermes", ["hermes"], []),  # a preset the file does not list
    ],
)
def test_only_leaves_exactly_one_provider(tmp_path, only, agents, gateways):
    assert catalog(only_provider(base(tmp_path), only)) == (agents, gateways)


def test_without_only_every_provider_is_there(tmp_path):
    agents, gateways = catalog(base(tmp_path))
    assert {"codex", "gemini", "handbook", "knowledge", "bot"} <= set(agents) and gateways == ["openclaw"]


def test_only_an_unknown_provider_is_a_configuration_error(tmp_path):
    with pytest.raises(ConfigError) as caught:
        only_provider(base(tmp_path), "gemni")
    assert "--only gemni: no such provider" in str(caught.value) and "gemini" in str(caught.value)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "command",
    [
        [str(BIN / "gemini-acp-adapter")],
        [str(BIN / "hermes-acp-adapter")],
        [str(BIN / "opencode-acp-adapter")],
        [sys.executable, "-m", "bridge.cli", "serve", "--only", "knowledge"],
    ],
    ids=["gemini-acp-adapter", "hermes-acp-adapter", "opencode-acp-adapter", "serve-only-knowledge"],
)
def test_each_entry_point_serves_only_its_provider(tmp_path, command):
    port = free_port()
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data")}
    env.pop("BRIDGE_AUTH_TOKEN", None)
    env.pop("BRIDGE_CONFIG_PATH", None)
    with serving([*command, "--port", str(port)], env, tmp_path):
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "acp.capabilities"}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/acp/rpc", body, {"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=20) as response:
            caps = json.loads(response.read())["result"]
    expected = command[0].rsplit("/", 1)[-1].removesuffix("-acp-adapter") if "adapter" in command[0] else "knowledge"
    assert [p["providerId"] for p in caps["providerCatalog"]] == [expected]
    assert caps["gatewayProviders"] == []
