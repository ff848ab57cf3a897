"""The whole bridge (real method table, orchestrator and ACP adapter) over every transport,
with the scriptable fake ACP agent as the provider."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from starlette.testclient import TestClient

from bridge.cli import build_app
from bridge.config import BridgeConfig
from compat.settings import convert

FAKE_AGENT = Path(__file__).resolve().parent / "fakes" / "fake_acp_agent.py"
pytestmark = pytest.mark.timeout(60)


def config_dict(tmp_path: Path, *modes: str, **provider: Any) -> dict[str, Any]:
    args = [str(FAKE_AGENT), *[a for m in modes for a in ("--mode", m)]]
    return {
        "workspaceRoots": [str(tmp_path)],
        "providers": {"fake": {"command": sys.executable, "args": args, "label": "Fake", **provider}},
        "timeouts": {"cancelGrace": 1, "initializeTimeout": 10, "sessionNewTimeout": 10, "turnTimeout": 30},
    }


def make_app(tmp_path: Path, *modes: str, **extra: Any) -> Any:
    data = config_dict(tmp_path, *modes)
    data.update(extra)
    return build_app(convert(data, BridgeConfig))


def start(session: str, prompt: str = "hello bridge", **params: Any) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "session.start",
        "params": {"sessionId": session, "taskPrompt": prompt, **params},
    }


def sse_messages(text: str) -> list[Any]:
    data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    assert data[-1] == "[DONE]"
    return [orjson.loads(d) for d in data[:-1]]


def test_http_sse_streams_updates_then_the_result_then_done(tmp_path):
    with TestClient(make_app(tmp_path)) as client:
        response = client.post("/acp/rpc", json=start("s1"), headers={"Accept": "text/event-stream"})
    assert response.status_code == 200
    messages = sse_messages(response.text)
    notes, reply = messages[:-1], messages[-1]
    assert all(n["method"] == "session.update" for n in notes)
    assert [m["seq"] for m in messages] == list(range(len(messages)))
    result = reply["result"]
    assert result["success"] is True and result["resolvedProviderId"] == "fake"
    updates = [n["params"] for n in notes]
    assert "".join(u["delta"] for u in updates if u["type"] == "delta") == result["output"]
    kinds = {u["type"] for u in updates}
    assert {"status", "delta", "thought", "tool_call", "tool_call_update", "plan", "usage", "done"} <= kinds
    tool = [u for u in updates if u["type"] == "tool_call_update"][-1]["toolCall"]
    assert tool["toolCallId"] and tool["title"] and tool["status"] == "completed"  # merged state


def test_http_json_discards_notifications_and_answers_once(tmp_path):
    with TestClient(make_app(tmp_path)) as client:
        response = client.post("/acp/rpc", json=start("s2"))
    body = response.json()
    assert body["id"] == 1 and body["result"]["status"] == "completed" and body["seq"] == 0


def test_websocket_runs_cancel_concurrently_with_a_long_turn(tmp_path):
    with TestClient(make_app(tmp_path, "slow")) as client, client.websocket_connect("/acp") as ws:
        ws.send_text(json.dumps(start("s3", "go slowly")))
        first = json.loads(ws.receive_text())
        assert first["params"]["event"] == "started" and first["seq"] == 0
        ws.send_text(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "session.cancel", "params": {"sessionId": "s3"}}))
        replies: dict[Any, Any] = {}
        while 1 not in replies:
            message = json.loads(ws.receive_text())
            if "id" in message:
                replies[message["id"]] = message
        assert replies[2]["result"] == {"accepted": True, "cancelled": True}
        assert replies[1]["result"]["status"] == "cancelled"


def test_a_crashing_agent_is_a_failed_result_with_a_redacted_stderr_tail(tmp_path):
    with TestClient(make_app(tmp_path, "crash")) as client:
        result = client.post("/acp/rpc", json=start("s4")).json()["result"]
    assert result["success"] is False and result["status"] == "failed"
    assert result["error"]["code"] == "AGENT_EXITED" and result["error"]["providerId"] == "fake"
    assert "stderrTail" in result["error"]["data"]


def test_session_scoped_to_its_token(tmp_path):
    app = make_app(
        tmp_path, authTokens=[{"name": "alice", "token": "alice-secret-1"}, {"name": "bob", "token": "bob-secret-22"}]
    )
    with TestClient(app) as client:
        alice = {"Authorization": "Bearer alice-secret-1"}
        bob = {"Authorization": "bearer bob-secret-22"}
        assert client.post("/acp/rpc", json=start("shared"), headers=alice).json()["result"]["success"]
        unseen = client.post(
            "/acp/rpc",
            headers=bob,
            json={"jsonrpc": "2.0", "id": 5, "method": "session.close", "params": {"sessionId": "shared"}},
        ).json()
        assert unseen["result"] == {"accepted": True, "closed": False}  # to bob it does not exist
        assert client.post("/acp/rpc", json=start("x")).status_code == 401


def test_unknown_provider_is_an_unavailable_result_without_updates(tmp_path):
    routing = {"routingMode": "explicit", "explicitExecutionTarget": "agent", "explicitProviderId": "nope"}
    with TestClient(make_app(tmp_path)) as client:
        response = client.post("/acp/rpc", json=start("s5", routing=routing), headers={"Accept": "text/event-stream"})
    messages = sse_messages(response.text)
    assert len(messages) == 1
    assert messages[0]["result"]["status"] == "unavailable"
    assert messages[0]["result"]["unavailableCode"] == "PROVIDER_UNAVAILABLE"


def test_gateway_methods_without_a_gateway(tmp_path):
    with TestClient(make_app(tmp_path)) as client:

        def call(method: str, params: dict) -> Any:
            return client.post("/acp/rpc", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).json()

        connect = call("xworkmate.gateway.connect", {"runtimeId": "rt"})["result"]
        assert connect["ok"] is False and connect["error"]["code"] == "GATEWAY_NOT_CONFIGURED"
        assert call("xworkmate.gateway.request", {"runtimeId": "rt", "method": "health"})["result"]["ok"] is False
        assert call("xworkmate.gateway.disconnect", {"runtimeId": "rt"})["result"] == {"accepted": True}


def test_params_errors_are_32602_with_locations(tmp_path):
    with TestClient(make_app(tmp_path)) as client:
        body = client.post(
            "/acp/rpc", json={"jsonrpc": "2.0", "id": 1, "method": "session.start", "params": {"taskPrompt": "x"}}
        ).json()
    assert body["error"]["code"] == -32602 and body["error"]["data"]["code"] == "INVALID_PARAMS"
    assert body["error"]["data"]["errors"][0]["loc"] == "sessionId"


def run_stdio(tmp_path: Path, payload: bytes) -> list[dict[str, Any]]:
    """Send ``payload``, read up to the reply, then end the input (at EOF running turns are
    cancelled: a client keeps stdin open until it has its answers)."""
    cfg = tmp_path / "bridge.yaml"
    cfg.write_text(yaml.safe_dump(config_dict(tmp_path)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge.cli", "acp-stdio", "--config", str(cfg)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(payload)
    proc.stdin.flush()
    lines: list[dict[str, Any]] = []
    for line in proc.stdout:
        lines.append(json.loads(line))
        if "id" in lines[-1]:
            break
    _, err = proc.communicate(b"", timeout=45)
    assert proc.returncode == 0, err.decode()
    return lines


def test_acp_stdio_runs_a_turn_with_newline_framing_and_exits_0_on_eof(tmp_path):
    lines = run_stdio(tmp_path, orjson.dumps(start("io1")) + b"\n")
    assert [m["seq"] for m in lines] == list(range(len(lines)))
    assert lines[-1]["id"] == 1 and lines[-1]["result"]["status"] == "completed"
    assert lines[0]["method"] == "session.update"


def test_acp_stdio_accepts_content_length_framing(tmp_path):
    body = orjson.dumps({"jsonrpc": "2.0", "id": "c1", "method": "acp.capabilities"})
    lines = run_stdio(tmp_path, b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert lines[-1]["id"] == "c1" and lines[-1]["result"]["providerCatalog"][0]["providerId"] == "fake"


async def test_real_uvicorn_sse_via_the_cli_client(tmp_path):
    from bridge.client import call
    from tests.helpers import real_server

    config = convert(config_dict(tmp_path), BridgeConfig)
    async with real_server(config, build_app(config)) as port:
        notes: list[dict[str, Any]] = []
        reply = await call(
            f"http://127.0.0.1:{port}",
            "session.start",
            {"sessionId": "u1", "taskPrompt": "hi there"},
            on_notification=notes.append,
        )
        ws_reply = await call(f"ws://127.0.0.1:{port}", "session.message", {"sessionId": "u1", "taskPrompt": "again"})
    assert reply["result"]["success"] and ws_reply["result"]["success"]
    assert notes and notes[-1]["params"]["type"] == "done"


def test_mcp_surface_is_served_behind_the_token_check(tmp_path):
    app = make_app(tmp_path, authTokens=["mcp-secret-1"])
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    accept = {"Accept": "application/json, text/event-stream"}
    with TestClient(app) as client:
        assert client.post("/mcp", json=init, headers=accept).status_code == 401
        ok = client.post("/mcp", json=init, headers={**accept, "Authorization": "Bearer mcp-secret-1"})
        assert ok.status_code == 200 and ok.json()["result"]["serverInfo"]
        tools = client.post(
            "/mcp",
            headers={**accept, "Authorization": "Bearer mcp-secret-1"},
            json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        )
        names = {t["name"] for t in tools.json()["result"]["tools"]}
        assert {"llmwiki_agent_run", "get_wiki_content", "llmwiki_search"} <= names
