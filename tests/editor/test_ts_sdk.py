"""Editor mode with the official TypeScript ACP SDK (``@agentclientprotocol/sdk``, installed by
``scripts/install-profile-tools.sh``) as the editor: the prompt round trip over stdio (the SDK
spawns ``acp-stdio``) and over the WebSocket endpoint (the ``ws`` package as the socket: Node 20
has no global WebSocket)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.sessions.test_restart import Bridge
from tests.test_app_integration import FAKE_AGENT

pytestmark = pytest.mark.timeout(90)
ACP_TS = "2.4.0"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TOKEN = "editor-token-0123456"


def sdk_modules() -> Path:
    tools = Path(os.environ.get("XWORKMATE_TOOLS_DIR") or Path.home() / ".cache" / "xworkmate-bridge" / "tools")
    modules = tools / f"acp-ts-{ACP_TS}" / "node_modules"
    if not (modules / "@agentclientprotocol" / "sdk").is_dir() or shutil.which("node") is None:
        pytest.fail(
            f"the TypeScript ACP SDK {ACP_TS} is not installed: run `make test` (scripts/install-profile-tools.sh)"
        )
    return modules


def config(tmp_path: Path) -> Path:
    data = {
        "workspaceRoots": [str(tmp_path)],
        "authTokens": [{"name": "editor", "token": TOKEN}],
        "providers": {"echo": {"command": sys.executable, "args": [str(FAKE_AGENT)]}},
    }
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def ts_editor(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        ["node", str(HERE / "ts_editor.mjs"), str(sdk_modules()), *args],
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def check(result: dict[str, Any]) -> None:
    assert result["init"]["protocolVersion"] == 1
    assert result["init"]["agentInfo"]["name"] == "xworkmate-bridge"
    assert result["configOptions"][0]["currentValue"] == "echo"
    assert result["stopReason"] == "end_turn"
    assert result["text"] == "echo: hi from typescript"
    assert "tool_call" in result["updates"] and "plan" in result["updates"]


def test_the_typescript_sdk_prompts_over_stdio(tmp_path: Path) -> None:
    bridge = [sys.executable, "-m", "bridge.cli", "acp-stdio", "--config", str(config(tmp_path))]
    bridge += ["--state-dir", str(tmp_path / "state")]
    check(ts_editor("stdio", str(tmp_path), "echo", "hi from typescript", "--", *bridge))


def test_the_typescript_sdk_prompts_over_the_websocket(tmp_path: Path) -> None:
    served = Bridge(tmp_path, config(tmp_path))
    try:
        url = f"ws://127.0.0.1:{served.port}/acp"
        check(ts_editor("ws", str(tmp_path), "echo", "hi from typescript", url, TOKEN))
    finally:
        served.stop()
