"""The desktop app's requests, replayed as the app builds them and read as the app reads them
(ai-workspace-lab/xworkmate-app: ``lib/runtime/gateway_acp_client.dart`` (GAC),
``go_task_service_client.dart`` (GTS), ``external_code_agent_acp_desktop_transport.dart`` (XPT)),
and the assertions of its three CI contract scripts (``scripts/ci/verify_*_contract.sh``), which
first log in to the app's account service (not reachable here) and then call the bridge as below.

The bridge is configured as the scripts expect: the four agent presets by id and label (each the
fake ACP agent). ``availableExecutionTargets`` is ``["agent"]``: the scripts want
``["agent","gateway"]``, which the bridge will advertise once it has a gateway (issue 17).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from bridge.cli import build_app
from bridge.config import BridgeConfig
from compat.settings import convert
from tests.orchestrator.test_attachments import inline
from tests.test_app_integration import config_dict

pytestmark = pytest.mark.timeout(90)
LABELS = {"codex": "Codex", "opencode": "OpenCode", "gemini": "Gemini", "hermes": "Hermes"}
CATALOG = {**LABELS, "knowledge": "Knowledge"}  # the embedded knowledge provider stays beside a providers list
APP_HEADERS = {  # GAC:512-555: no Origin, no subprotocol
    "Content-Type": "application/json; charset=utf-8",
    "Accept": "text/event-stream, application/json",
}
CURL_HEADERS = {"Accept": "application/json", "Content-Type": "application/json"}  # the CI scripts


@pytest.fixture
def client(tmp_path: Path):
    data = config_dict(tmp_path)
    fake = data["providers"]["fake"]
    data["providers"] = {pid: {**fake, "label": label} for pid, label in LABELS.items()}
    with TestClient(build_app(convert(data, BridgeConfig))) as http:
        yield http


class AppCall:
    """One call as the app makes it: one POST (or one WebSocket per request), its notifications
    kept when they carry the request's sessionId and threadId (XPT:55-58)."""

    def __init__(self, response: dict[str, Any], notes: list[dict[str, Any]]) -> None:
        self.response, self.notes = response, notes

    @property
    def result(self) -> dict[str, Any]:
        return self.response["result"]

    def updates(self, key: str) -> list[dict[str, Any]]:
        kept = []
        for note in self.notes:
            if note.get("method", "").strip().lower() not in ("session.update", "acp.session.update"):
                continue
            params = note.get("params") or {}
            if (params.get("sessionId") or params.get("threadId")) == key and params.get("threadId") == key:
                kept.append(params)
        return kept


def app_post(
    client: TestClient, method: str, params: dict[str, Any] | None, rid: str = "1718000000000000-x-1"
) -> AppCall:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        body["params"] = params
    response = client.post("/acp/rpc", content=json.dumps(body).encode(), headers=APP_HEADERS)
    assert response.status_code == 200, response.text
    if "text/event-stream" not in response.headers.get("content-type", ""):
        return AppCall(response.json(), [])
    return read_sse(response.text, rid)


def read_sse(text: str, rid: str) -> AppCall:
    """GAC:963-1044: only ``data:`` lines count, a blank line ends an event, ``[DONE]`` and empty
    payloads are skipped, every other payload must be JSON; the response is the event whose id is
    the request's and which has ``result`` or ``error``; nothing after it is read."""
    notes: list[dict[str, Any]] = []
    lines: list[str] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if line.startswith("data:"):
            lines.append(line[5:].lstrip())
            continue
        if line or not lines:
            continue
        payload, lines = "\n".join(lines), []
        if not payload or payload == "[DONE]":
            continue
        event = json.loads(payload)  # the app fails the turn on a payload that is not JSON
        if str(event.get("id")) == rid and ("result" in event or "error" in event):
            return AppCall(event, notes)
        if "method" in event:
            notes.append(event)
    raise AssertionError("ACP_SSE_NO_RESULT: the stream ended without the response")


def app_turn_params(key: str, cwd: Path, prompt: str, **extra: Any) -> dict[str, Any]:
    """GTS:277-338 for the agent target with the user's provider."""
    return {
        "sessionId": key,
        "threadId": key,
        "mode": "gateway-chat",
        "taskPrompt": prompt,
        "workingDirectory": str(cwd),
        "selectedSkills": [],
        "attachments": [],
        "provider": "codex",
        "thinking": "high",
        "routing": {
            "routingMode": "explicit",
            "preferredGatewayProviderId": "openclaw",
            "explicitExecutionTarget": "agent",
            "explicitProviderId": "codex",
            "explicitSkills": [],
            "allowSkillInstall": False,
            "availableSkills": [],
        },
        "routingHint": "gateway",
        "requestedExecutionTarget": "agent",
        "executionTarget": "agent",
        "appThreadKey": key,
        "metadata": {
            "node": {"id": "xworkmate-app", "name": "XWorkmate", "kind": "app-mediated-cooperative-node"},
            "dispatch": {"mode": "cooperative", "executionTarget": "agent"},
            "xworkmateTaskArtifactContract": {"schemaVersion": 1, "appThreadKey": key, "scopeKind": "task"},
        },
        **extra,
    }


def display_text(result: dict[str, Any]) -> str:
    """GTS:869-961, the first fields: the first non-empty of these."""
    for key in ("output", "summary", "resultSummary", "message", "content", "text", "output_text"):
        if isinstance(result.get(key), str) and result[key]:
            return result[key]
    return ""


def app_success(result: dict[str, Any]) -> bool:
    """GTS:811-828: ``success`` when given, else false when an ``error`` key is present at all."""
    if isinstance(result.get("success"), bool):
        return result["success"]
    return "error" not in result and result.get("status") not in ("failed", "error", "cancelled", "canceled")


# ---- the app ---------------------------------------------------------------------------------------


def test_capabilities_as_the_app_reads_them(client: TestClient) -> None:
    caps = app_post(client, "acp.capabilities", {}, "1718000000000000-capabilities-1").result
    catalog = caps.get("providerCatalog") or caps["capabilities"]["providerCatalog"]
    assert [(p["providerId"], p["label"], p["targets"], p["enabled"]) for p in catalog] == [
        (pid, label, ["agent"], True) for pid, label in CATALOG.items()
    ]
    assert caps["singleAgent"] is True
    assert caps["availableExecutionTargets"] == ["agent"] and caps["gatewayProviders"] == []


def test_the_apps_routing_call_gets_provider_agent_and_metadata(client: TestClient) -> None:
    params = {  # code_agent_node_orchestrator.dart:43-119
        "routing": {
            "routingMode": "auto",
            "preferredGatewayProviderId": "codex",
            "explicitExecutionTarget": "",
            "explicitProviderId": "codex",
            "explicitModel": "",
            "explicitSkills": [],
            "allowSkillInstall": False,
            "availableSkills": [],
        },
        "preferredProviderId": "codex",
        "requiredCapabilities": ["gateway-bridge"],
        "providers": [{"id": "codex", "name": "Codex ACP", "defaultArgs": [], "capabilities": ["agent"]}],
        "nodeState": {"selectedAgentId": "", "gatewayConnected": False, "executionTarget": "agent"},
        "nodeInfo": {"id": "xworkmate-app", "name": "XWorkmate", "version": "0.0.0"},
    }
    result = app_post(client, "xworkmate.routing.resolve", params).result
    assert result["providerId"] == "codex" and result["agentId"] == "codex"
    assert isinstance(result["metadata"], dict) and result["metadata"]  # non-empty: no second call


def test_a_turn_with_an_inline_file_streams_and_ends_as_the_app_expects(client: TestClient, tmp_path: Path) -> None:
    key = "draft:1718000000000000-1"
    source = "/Users/u/Desktop/notes.txt"
    params = app_turn_params(
        key,
        tmp_path,
        "Summarise notes.txt",
        attachments=[{"name": "notes.txt", "description": "text/plain", "path": source}],
        inlineAttachments=[inline("notes.txt", b"hello\n", sourcePath=source)],  # as the app builds one
    )
    call = app_post(client, "session.start", params, "1718000000000000-session.start-7")
    result, updates = call.result, call.updates(key)
    assert len(updates) == len(call.notes)  # every update carries the thread: none is dropped
    assert app_success(result) and display_text(result).startswith("echo")
    assert "".join(u["delta"] for u in updates if u["type"] == "delta") == result["output"]
    assert [u for u in updates if u["type"] == "done" or u.get("event") == "completed"]
    assert result["turnId"] and result["resolvedProviderId"] == "codex"
    assert result["resolvedWorkingDirectory"] == str(tmp_path.resolve())
    assert not {"attachments", "files"} & set(result)  # the app would read them as artifacts
    assert not {"runId", "appThreadKey", "openclawSessionKey"} <= set(result)  # no OpenClaw handoff
    assert (tmp_path / ".xworkmate" / "attachments" / result["turnId"] / "notes.txt").read_bytes() == b"hello\n"


def test_the_same_turn_over_a_websocket_per_request(client: TestClient, tmp_path: Path) -> None:
    key = "main"
    with client.websocket_connect("/acp") as ws:  # GAC:358-448: one socket per request
        ws.send_text(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": "ws-1",
                    "method": "session.start",
                    "params": app_turn_params(key, tmp_path, "hi"),
                }
            )
        )
        notes = []
        while True:
            frame = json.loads(ws.receive_text())
            if frame.get("id") == "ws-1" and ("result" in frame or "error" in frame):
                break
            notes.append(frame)
    call = AppCall(frame, notes)
    assert app_success(call.result) and len(call.updates(key)) == len(notes)


def test_stop_then_send_starts_again_on_the_same_session(client: TestClient, tmp_path: Path) -> None:
    key = "draft:stop"
    first = app_post(client, "session.start", app_turn_params(key, tmp_path, "first"))
    assert app_success(first.result)
    cancel = app_post(client, "session.cancel", {"sessionId": key, "threadId": key}).result
    assert cancel["accepted"] is True
    again = app_post(client, "session.start", app_turn_params(key, tmp_path, "again"))
    assert app_success(again.result) and again.result["turnId"] != first.result["turnId"]


def test_ping_and_the_log_panel(client: TestClient) -> None:
    ping = client.get("/api/ping", headers={"Accept": "application/json"}).json()
    assert ping["status"] == "ok" and (ping["version"] or ping["tag"]) and ping["buildDate"]
    logs = app_post(client, "system.logs", {}, "1718000000000000-status-3").result
    assert logs["bridgeStatus"].lower() in ("ok", "connected", "running")  # green
    assert logs["gatewayStatus"] == "unknown"  # grey
    assert all(isinstance(line, str) for line in logs["bridgeLogs"])  # rendered with toString()


def test_a_params_error_is_what_the_app_shows_as_code_and_message(client: TestClient) -> None:
    response = app_post(client, "session.start", {"sessionId": "s"}).response
    assert response["error"]["code"] == -32602 and response["error"]["message"]


# ---- the CI contract scripts ------------------------------------------------------------------------


def curl(client: TestClient, method: str, params: dict[str, Any] | None = None, rid: str = "1") -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        body["params"] = params
    response = client.post("/acp/rpc", json=body, headers=CURL_HEADERS)
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/json")
    return response.json()


CI_ROUTING = {
    "routingMode": "auto",
    "preferredGatewayTarget": "codex",
    "explicitExecutionTarget": "agent",
    "explicitProviderId": "codex",
    "explicitModel": "",
    "explicitSkills": [],
    "allowSkillInstall": False,
    "availableSkills": [],
}


def test_verify_api_interface_contract(client: TestClient) -> None:
    assert client.get("/api/ping").json()["status"] == "ok"
    caps = curl(client, "acp.capabilities", {})["result"]
    assert isinstance(caps, dict) and caps["availableExecutionTargets"][0] == "agent"
    params = {"taskPrompt": "check api", "workingDirectory": "/tmp", "routing": CI_ROUTING}
    resolved = curl(client, "xworkmate.routing.resolve", params)["result"]
    if resolved["unavailable"] is True or resolved["unavailableCode"] == "PROVIDER_UNAVAILABLE":
        assert resolved["resolvedProviderId"] == ""
    else:
        assert resolved["resolvedProviderId"] == "codex"


def test_verify_api_scenario_contract(client: TestClient, tmp_path: Path) -> None:
    key = "scenario-session-001"
    params = {
        "sessionId": key,
        "threadId": key,
        "mode": "gateway-chat",
        "taskPrompt": "Say hello in one short sentence.",
        "workingDirectory": str(tmp_path),  # the script sends /tmp, a root of a default bridge
        "selectedSkills": [],
        "attachments": [],
        "provider": "codex",
        "routing": CI_ROUTING,
        "requestedExecutionTarget": "agent",
        "executionTarget": "agent",
    }
    started = curl(client, "session.start", params, "start")["result"]
    assert isinstance(started["turnId"], str) and started["turnId"] and started["resolvedProviderId"] == "codex"
    follow = {**params, "taskPrompt": "Continue with a very short acknowledgement."}
    assert curl(client, "session.message", follow, "message")["result"]["turnId"]
    assert curl(client, "session.cancel", {"sessionId": key, "threadId": key})["result"]["accepted"] is True
    assert curl(client, "session.close", {"sessionId": key, "threadId": key})["result"]["closed"] is True


def test_verify_remote_provider_contract(client: TestClient) -> None:
    reply = curl(client, "acp.capabilities", None, "capabilities")  # no params key at all
    assert reply["jsonrpc"] == "2.0" and isinstance(reply["result"], dict)
    catalog = reply["result"]["providerCatalog"] or reply["result"]["capabilities"]["providerCatalog"]
    assert [(p["providerId"], p["label"], p["targets"]) for p in catalog] == [
        (pid, label, ["agent"]) for pid, label in CATALOG.items()
    ]
