"""Finding 5 of the hostile-clients issue: a client-controlled value cannot move a profile out of
the workspace through its placeholders, and a profile's reported session id is reused only when
it is a safe token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from bridge.cli import build_app
from bridge.config import load_config
from tests.test_app_integration import start

pytestmark = pytest.mark.timeout(60)
SCRIPT = """\
import os
print("seen session id: " + repr(os.environ.get("AGENT_SESSION_ID", "")))
print("cwd: " + os.getcwd())
print("AGENT_SESSION: " + os.environ.get("REPORT", "s-ok"))
"""


def app(tmp_path: Path, **profile: Any) -> Any:
    script = tmp_path / "where.py"
    script.write_text(SCRIPT)
    (tmp_path / "ws").mkdir()
    entries = ", ".join(f"{k}: {v!r}" for k, v in {"script": str(script), **profile}.items())
    config = tmp_path / "bridge.yaml"
    config.write_text(
        f"workspaceRoots: [{str(tmp_path / 'ws')!r}]\nproviders: {{}}\nprofiles:\n  where: {{{entries}}}\n"
    )
    return build_app(load_config(str(config)))


@pytest.mark.parametrize("thread", ["/etc", "../../etc", "/root/.ssh"])
def test_a_thread_id_cannot_put_a_profiles_cwd_outside_the_roots(tmp_path: Path, thread: str) -> None:
    with TestClient(app(tmp_path, cwd="{{SESSION_NAME}}")) as client:
        result = client.post("/acp/rpc", json=start("s1", threadId=thread)).json()["result"]
    assert result["status"] == "failed" and result["error"]["code"] == "PROFILE_ERROR"
    assert "outside the workspace roots" in result["error"]["message"] and "cwd: /etc" not in result["output"]


def test_a_thread_id_inside_the_roots_is_used(tmp_path: Path) -> None:
    with TestClient(app(tmp_path, cwd=str(tmp_path / "ws") + "/{{SESSION_NAME}}")) as client:
        (tmp_path / "ws" / "t1").mkdir()
        result = client.post("/acp/rpc", json=start("s1", threadId="t1")).json()["result"]
    assert result["status"] == "completed" and f"cwd: {tmp_path / 'ws' / 't1'}" in result["output"]


def test_control_characters_never_reach_a_placeholder(tmp_path: Path) -> None:
    with TestClient(app(tmp_path, args=["{{SESSION_NAME}}"])) as client:
        result = client.post("/acp/rpc", json=start("s1", threadId="a\nb")).json()["result"]
    assert result["status"] == "failed" and "control characters" in result["error"]["message"]


@pytest.mark.parametrize(
    "reported,reused",
    [("../../etc/passwd", ""), ("a/b", ""), ("x" * 300, ""), ("a\x1bb", ""), ("s-ok", "s-ok")],
)
def test_a_reported_session_id_is_reused_only_when_it_is_a_safe_token(
    tmp_path: Path, reported: str, reused: str
) -> None:
    with TestClient(app(tmp_path, env={"REPORT": reported})) as client:
        first = client.post("/acp/rpc", json=start("s1")).json()["result"]
        again = {"sessionId": "s1", "taskPrompt": "again"}
        second = client.post("/acp/rpc", json={"jsonrpc": "2.0", "id": 2, "method": "session.message", "params": again})
    assert first["status"] == "completed" and f"seen session id: {reused!r}" in second.json()["result"]["output"]
