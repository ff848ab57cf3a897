"""The bridge against the real OpenClaw gateway (``openclaw@2026.9.6`` on Node 24, from ``make
agents``), its model pointed at the fake model server: the handshake with token and password auth,
a bad token, the returned device token reused on reconnect, ``health`` and events, a
gateway-routed turn with a tool call, ``chat.abort`` through ``session.cancel``, and a reconnect
after the gateway process is killed and started again (docs/api.md "Gateway")."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from websockets.asyncio.client import connect

from bridge.cli import build_app
from bridge.config import BridgeConfig
from compat.gateway.client import GatewayClient
from compat.gateway.protocol import GatewayError
from compat.gateway.settings import GatewaySettings
from compat.settings import convert
from tests.e2e.openclaw import OpenClawGateway, openclaw_paths
from tests.fakes.fake_llm import FakeLLM
from tests.helpers import WsClient, in_background, real_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
SECRET = "oc-test-token-2026"
WINDOW = 2.0  # seconds over which connection attempts are counted (no retry loop)


@pytest.fixture(scope="module")
def llm() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(llm: FakeLLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenClawGateway]:
    assert openclaw_paths() is not None, "openclaw or Node 24 is missing from the agent cache: run `make agents`"
    with OpenClawGateway(llm.base_url, tmp_path_factory.mktemp("oc"), auth="token", secret=SECRET) as gw:
        yield gw


def client_for(tmp_path: Path, url: str, **auth: str) -> GatewayClient:
    settings = convert({"url": url, **(auth or {"token": SECRET}), "connectTimeout": 20}, GatewaySettings)
    return GatewayClient(settings, tmp_path / "device.pem", version="0.0.0-test")


async def test_handshake_health_events_and_the_device_token_reused_on_reconnect(gateway, tmp_path):
    client = client_for(tmp_path, gateway.url)
    events: list[tuple[str, Any]] = []
    final = anyio.Event()

    def on_event(event: str, payload: Any, seq: int | None) -> None:
        events.append((event, payload))
        if event == "chat" and payload.get("state") == "final":
            final.set()

    client.on_event.append(on_event)
    async with anyio.create_task_group() as tg:
        tg.start_soon(client.run)
        client.connect()
        await client.ready(30)
        assert client.hello is not None and client.hello["protocol"] == 4  # chosen from the offered 3..4
        assert client.auth_method == "token" and client.returned_device_token
        health = await client.request("health", {})
        assert health["ok"] is True
        sent = await client.request(
            "chat.send", {"sessionKey": "xwm-e2e", "message": "hi", "idempotencyKey": "run-e2e-1"}
        )
        waited = await client.request("agent.wait", {"runId": sent["runId"], "timeoutMs": 60000}, timeout=90)
        assert waited["status"] == "ok"
        with anyio.fail_after(10):  # the run's final chat event may follow agent.wait's answer
            await final.wait()
        kinds = {(e, p.get("stream") or p.get("state")) for e, p in events if p.get("runId") == sent["runId"]}
        assert ("agent", "assistant") in kinds and ("chat", "delta") in kinds
        client.disconnect()
        client.connect()
        await client.ready(30)
        assert client.auth_method == "device-token"  # the stored token, not the shared one
        assert (await client.request("health", {}))["ok"] is True
        tg.cancel_scope.cancel()


async def test_a_bad_token_stops_after_one_attempt_with_the_gateways_precise_code(gateway, tmp_path):
    client = client_for(tmp_path, gateway.url, token="not-the-token")
    async with anyio.create_task_group() as tg:
        tg.start_soon(client.run)
        with pytest.raises(GatewayError) as raised:
            await client.ready(30)
        assert raised.value.code == "INVALID_REQUEST" and raised.value.detail_code == "AUTH_TOKEN_MISMATCH"
        assert "refused gateway.token" in raised.value.message
        attempts = client.attempts
        await anyio.sleep(WINDOW)  # a bounded window: no reconnect loop runs in it
        assert client.attempts == attempts and client.status == "error"
        tg.cancel_scope.cancel()


async def test_password_auth(llm, tmp_path):
    with OpenClawGateway(llm.base_url, tmp_path / "pw", auth="password", secret="oc-pass-2026") as gw:
        client = client_for(tmp_path, gw.url, password="oc-pass-2026")
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.run)
            client.connect()
            await client.ready(30)
            assert client.auth_method == "password"
            wrong = client_for(tmp_path / "other", gw.url, password="wrong-pass")
            tg.start_soon(wrong.run)
            with pytest.raises(GatewayError) as raised:
                await wrong.ready(30)
            assert raised.value.detail_code == "AUTH_PASSWORD_MISMATCH"
            assert "refused gateway.password" in raised.value.message
            tg.cancel_scope.cancel()


# ---- through the bridge -------------------------------------------------------------------------


@pytest.fixture
async def bridge(gateway: OpenClawGateway, tmp_path: Path) -> AsyncIterator[int]:
    """The bridge's port; its gateway is the module's."""
    data = {
        "workspaceRoots": [str(tmp_path)],
        "providers": {},
        "gateway": {"url": gateway.url, "token": SECRET, "connectTimeout": 60, "waitTimeout": 10},
        "dataDir": str(tmp_path / "data"),
        "timeouts": {"cancelGrace": 10},
    }
    cfg = convert(data, BridgeConfig)
    async with in_background(real_server(cfg, build_app(cfg))) as port:
        yield port


@contextlib.asynccontextmanager
async def ws_client(port: int) -> AsyncIterator[WsClient]:
    async with connect(f"ws://127.0.0.1:{port}/acp") as ws:
        client = WsClient(ws)
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.pump)
            yield client
            tg.cancel_scope.cancel()


def gateway_turn(session: str, prompt: str) -> dict[str, Any]:
    routing = {"routingMode": "explicit", "explicitExecutionTarget": "gateway"}
    return {"sessionId": session, "taskPrompt": prompt, "routing": routing}


async def test_a_gateway_routed_turn_with_a_tool_call(bridge, gateway, llm):
    async with ws_client(bridge) as client:
        llm.queue_reply(
            tool_call={"name": "write", "arguments": {"path": "hello.txt", "content": "hi from the gateway\n"}}
        )
        llm.queue_reply("The file is written.")
        result = (await client.call("session.start", gateway_turn("oc-tool", "Write hello.txt"), timeout=180))["result"]
        assert result["status"] == "completed", result
        assert result["mode"] == "gateway-chat" and result["runId"] == result["turnId"]
        assert result["resolvedGatewayProviderId"] == "openclaw" and result["upstreamSessionId"].startswith("xwm-")
        assert "The file is written." in result["output"]
        updates = client.updates(result["turnId"])
        assert "".join(u.get("delta", "") for u in updates if u.get("type") == "delta") == result["output"]
        tools = [u["toolCall"] for u in updates if u.get("type") in ("tool_call", "tool_call_update")]
        assert tools and tools[0]["title"].startswith("Write") and tools[-1]["status"] == "completed"
        assert (gateway.workspace / "hello.txt").read_text() == "hi from the gateway\n"


async def test_session_cancel_aborts_the_gateway_run(bridge, llm):
    async with ws_client(bridge) as client:
        llm.queue_reply(chunks=[f"tick {i} " for i in range(200)], delay=0.1)
        request_id = await client.send("session.start", gateway_turn("oc-abort", "Count slowly"))
        await client.wait(lambda: any(u.get("type") == "delta" for u in client.updates()), timeout=180)
        asked = time.monotonic()
        assert (await client.call("session.cancel", {"sessionId": "oc-abort"}))["result"]["accepted"] is True
        await client.wait(lambda: request_id in client.replies, timeout=30)
        result = client.replies[request_id]["result"]
        assert result["status"] == "cancelled" and time.monotonic() - asked < 10
        assert "tick 199" not in result["output"]  # the run stopped; it did not stream to its end


async def test_the_bridge_reconnects_after_the_gateway_is_killed_and_restarted(bridge, gateway):
    async with ws_client(bridge) as client:
        connected = (await client.call("xworkmate.gateway.connect", {"runtimeId": "rt-restart"}, timeout=90))["result"]
        assert connected["ok"] is True, connected

        def statuses() -> list[str]:
            return [
                n["params"]["snapshot"]["status"] for n in client.notes if n["method"] == "xworkmate.gateway.snapshot"
            ]

        await anyio.to_thread.run_sync(gateway.kill)
        await client.wait(lambda: "reconnecting" in statuses(), timeout=30)
        down = (await client.call("xworkmate.gateway.request", {"runtimeId": "rt-restart", "method": "health"}))[
            "result"
        ]
        assert down["ok"] is False and down["error"]["code"] == "OFFLINE"
        await anyio.to_thread.run_sync(gateway.start)
        seen = len(statuses())
        await client.wait(lambda: "connected" in statuses()[seen:], timeout=90)
        health = (await client.call("xworkmate.gateway.request", {"runtimeId": "rt-restart", "method": "health"}))[
            "result"
        ]
        assert health["ok"] is True and health["payload"]["ok"] is True
        attempts = [
            n["params"]["snapshot"]["reconnectAttempt"]
            for n in client.notes
            if n["method"] == "xworkmate.gateway.snapshot"
        ]
        assert max(attempts) >= 2  # the attempt counter grew while the gateway was down
