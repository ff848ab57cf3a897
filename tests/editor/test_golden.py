"""A golden transcript of an editor session (docs/api.md "Editor mode"): a scripted editor drives
``acp-stdio`` with the deterministic fake agent and every message in both directions is compared
with ``golden/editor_session.json`` (session ids, the version, times and paths normalised).

Each exchange is one message the editor sent and what it received after the previous response up
to this one's (the bridge writes a request's later updates before it answers the next request, so
the grouping is deterministic). ``UPDATE_GOLDEN=1`` rewrites the file after a deliberate change."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_app_integration import FAKE_AGENT

pytestmark = pytest.mark.timeout(60)
GOLDEN = Path(__file__).resolve().parent / "golden" / "editor_session.json"
ROOT = Path(__file__).resolve().parents[2]


def script(cwd: str) -> list[dict[str, Any]]:
    """The editor's requests; ``{sid}`` is the session id session/new gave."""
    return [
        {"id": 0, "method": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {}}},
        {"id": 1, "method": "session/new", "params": {"cwd": cwd, "mcpServers": []}},
        {
            "id": 2,
            "method": "session/set_config_option",
            "params": {"sessionId": "{sid}", "configId": "provider", "value": "echo"},
        },
        {
            "id": 3,
            "method": "session/prompt",
            "params": {"sessionId": "{sid}", "prompt": [{"type": "text", "text": "hi"}]},
        },
        {
            "id": 4,
            "method": "session/set_config_option",
            "params": {"sessionId": "{sid}", "configId": "provider", "value": "asker"},
        },
        {
            "id": 5,
            "method": "session/prompt",
            "params": {"sessionId": "{sid}", "prompt": [{"type": "text", "text": "may I?"}]},
        },
        {"id": 6, "method": "session/list", "params": {}},
        {"id": 7, "method": "session/close", "params": {"sessionId": "{sid}"}},
    ]


def run_session(tmp_path: Path) -> list[dict[str, Any]]:
    providers = {
        "echo": {"command": sys.executable, "args": [str(FAKE_AGENT)]},
        "asker": {
            "command": sys.executable,
            "args": [str(FAKE_AGENT), "--mode", "permission"],
            "permissionPolicy": "ask",
        },
    }
    cfg = tmp_path / "bridge.yaml"
    knowledge = {"enabled": False}  # the fake agents are the providers
    cfg.write_text(yaml.safe_dump({"workspaceRoots": [str(tmp_path)], "providers": providers, "knowledge": knowledge}))
    argv = [sys.executable, "-m", "bridge.cli", "acp-stdio", "--config", str(cfg), "--state-dir", str(tmp_path / "s")]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT)
    assert proc.stdin is not None and proc.stdout is not None
    transcript: list[dict[str, Any]] = []
    sid = ""

    def send(message: dict[str, Any]) -> None:
        proc.stdin.write(json.dumps(message).encode() + b"\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]

    try:
        for request in script(str(tmp_path)):
            request = json.loads(json.dumps({"jsonrpc": "2.0", **request}).replace("{sid}", sid))
            exchange: dict[str, Any] = {"sent": [request], "received": []}
            send(request)
            for line in proc.stdout:
                message = json.loads(line)
                exchange["received"].append(message)
                if message.get("method") == "session/request_permission":  # the editor answers
                    answer = {
                        "jsonrpc": "2.0",
                        "id": message["id"],
                        "result": {"outcome": {"outcome": "selected", "optionId": "opt-allow_once"}},
                    }
                    exchange["sent"].append(answer)
                    send(answer)
                elif message.get("id") == request["id"] and "method" not in message:
                    break
            if request["method"] == "session/new":
                sid = exchange["received"][-1]["result"]["sessionId"]
            transcript.append(exchange)
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return normalised(transcript, str(tmp_path))


def normalised(transcript: list[dict[str, Any]], tmp: str) -> list[dict[str, Any]]:
    text = json.dumps(transcript).replace(tmp, "<tmp>")
    ids: dict[str, str] = {}
    text = re.sub(r"acp-[0-9a-f]{32}", lambda m: ids.setdefault(m.group(0), f"<session-{len(ids) + 1}>"), text)
    text = re.sub(r'"updatedAt": "[^"]+"', '"updatedAt": "<time>"', text)
    text = re.sub(
        r'("name": "xworkmate-bridge", "title": "XWorkmate Bridge", "version": )"[^"]+"', r'\1"<version>"', text
    )
    return json.loads(text)


def test_an_editor_session_matches_the_golden_transcript(tmp_path: Path) -> None:
    transcript = run_session(tmp_path)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(transcript, indent=1, ensure_ascii=False) + "\n")
    assert transcript == json.loads(GOLDEN.read_text())
