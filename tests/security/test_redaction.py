"""Finding 8 of the hostile-clients issue: values the configuration injects into a child's
environment never reach a client or a log, whatever their variable's name, on stdout and stderr
alike; a failed probe reaches clients as a short reason (the detail is in the log)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from bridge.cli import build_app
from bridge.config import load_config
from tests.test_app_integration import FAKE_AGENT, make_app, start

pytestmark = pytest.mark.timeout(60)
VALUE = "plain-looking-value-4711"  # under a name that does not look secret


def test_a_configured_env_value_is_redacted_from_a_stderr_tail_whatever_its_name(tmp_path: Path) -> None:
    args = [str(FAKE_AGENT), "--mode", "leak-key", "--leak-var", "MY_SETTING", "--leak-cut", "64"]
    provider = {"command": sys.executable, "args": args, "env": {"MY_SETTING": VALUE}}
    with TestClient(make_app(tmp_path, providers={"fake": provider})) as client:
        result = client.post("/acp/rpc", json=start("s1")).json()["result"]
    assert result["status"] == "failed" and "stderrTail" in result["error"]["data"]
    assert VALUE not in json.dumps(result) and "[REDACTED]" in json.dumps(result)


def test_a_failed_profiles_stdout_in_its_error_is_redacted_like_its_stderr(tmp_path: Path) -> None:
    script = tmp_path / "leaky.py"
    script.write_text(
        "import os, sys\n"
        "print('using key ' + os.environ['MY_SETTING'])\n"
        "print('trace with ' + os.environ['MY_SETTING'], file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    config = tmp_path / "bridge.yaml"
    config.write_text(
        f"workspaceRoots: [{str(tmp_path)!r}]\nproviders: {{}}\n"
        "profiles:\n"
        f"  leaky: {{script: {str(script)!r}, env: {{MY_SETTING: {VALUE!r}}}, include_stderr_in_reply: true}}\n"
    )
    with TestClient(build_app(load_config(str(config)))) as client:
        result = client.post("/acp/rpc", json=start("s1")).json()["result"]
    assert result["status"] == "failed" and "--- stdout ---" in result["output"]
    assert VALUE not in json.dumps(result)


def test_a_failed_probe_gives_clients_a_short_reason_and_the_log_the_detail(tmp_path: Path, caplog) -> None:
    args = [str(FAKE_AGENT), "--mode", "leak-key-start", "--leak-var", "HOME", "--leak-cut", "64"]
    provider = {"command": sys.executable, "args": args}
    body = {"jsonrpc": "2.0", "id": 1, "method": "acp.capabilities"}
    with caplog.at_level("WARNING"), TestClient(make_app(tmp_path, providers={"fake": provider})) as client:
        entry = None
        for _ in range(200):  # the full probe runs in the background at start: bounded polling
            caps = client.post("/acp/rpc", json=body).json()["result"]
            entry = caps["providerCatalog"][0]
            if not entry["enabled"]:
                break
            client.post("/acp/rpc", json=start("probe-wait"))  # a turn waits for the probe
    assert entry is not None and entry["enabled"] is False
    home = str(Path.home())
    assert "exited with code" in entry["unavailableReason"] and home not in entry["unavailableReason"]
    assert len(entry["unavailableReason"]) < 120
    assert any("stderr" in r.getMessage() for r in caplog.records if "probe" in r.getMessage())
