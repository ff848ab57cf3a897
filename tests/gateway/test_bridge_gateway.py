"""The gateway through the whole bridge over a real WebSocket, against the double: what
``acp.capabilities`` advertises, the ``xworkmate.gateway.*`` methods and notifications, principal
isolation, the allow-list, and gateway-routed turns (stream, tool call, result, cancel)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from websockets.asyncio.client import connect

from bridge.cli import build_app
from bridge.config import BridgeConfig
from compat.settings import convert
from tests.fakes.fake_gateway import TOKEN, FakeGateway
from tests.helpers import WsClient, in_background, real_server

pytestmark = pytest.mark.timeout(60)
ALICE, BOB = "alice-token-1234", "bob-token-5678"


def config(tmp_path: Path, url: str, **gateway: Any) -> BridgeConfig:
    data = {
        "workspaceRoots": [str(tmp_path)],
        "authTokens": [{"name": "alice", "token": ALICE}, {"name": "bob", "token": BOB}],
        "providers": {},
        "knowledge": {"enabled": False},  # the gateway is the only provider
        "gateway": {"url": url, "token": TOKEN, "connectTimeout": 3, **gateway},
        "timeouts": {"cancelGrace": 2},
        "dataDir": str(tmp_path / "data"),
    }
    return convert(data, BridgeConfig)


class Bridge:
    def __init__(self, port: int) -> None:
        self.port = port

    async def client(self, token: str, tg: anyio.abc.TaskGroup) -> WsClient:
        ws = await connect(f"ws://127.0.0.1:{self.port}/acp", additional_headers={"Authorization": f"Bearer {token}"})
        client = WsClient(ws)
        tg.start_soon(client.pump)
        return client


@pytest.fixture
async def gateway() -> AsyncIterator[FakeGateway]:
    async with FakeGateway() as gw:
        yield gw


@pytest.fixture
async def bridge(tmp_path: Path, gateway: FakeGateway) -> AsyncIterator[Bridge]:
    cfg = config(tmp_path, gateway.url)
    async with in_background(real_server(cfg, build_app(cfg))) as port:
        yield Bridge(port)


def gateway_turn(session: str, prompt: str = "Say hello", cwd: str = "") -> dict[str, Any]:
    params = {
        "sessionId": session,
        "taskPrompt": prompt,
        "routing": {"routingMode": "explicit", "explicitExecutionTarget": "gateway"},
    }
    if cwd:
        params["workingDirectory"] = cwd
    return params


async def test_capabilities_advertise_the_gateway_only_when_configured(bridge, tmp_path):
    async with anyio.create_task_group() as tg:
        alice = await bridge.client(ALICE, tg)
        caps = (await alice.call("acp.capabilities", {}))["result"]
        assert caps["availableExecutionTargets"] == ["gateway"]  # no agent provider is configured
        assert [p["providerId"] for p in caps["gatewayProviders"]] == ["openclaw"]
        assert all(p["providerId"] != "openclaw" for p in caps["providerCatalog"])
        tg.cancel_scope.cancel()
    plain = convert(
        {"workspaceRoots": [str(tmp_path)], "providers": {"knowledge": {"type": "knowledge"}}}, BridgeConfig
    )
    async with real_server(plain, build_app(plain)) as port, anyio.create_task_group() as tg:
        client = await Bridge(port).client("", tg)
        caps = (await client.call("acp.capabilities", {}))["result"]
        assert caps["availableExecutionTargets"] == ["agent"] and caps["gatewayProviders"] == []
        tg.cancel_scope.cancel()


async def test_connect_request_disconnect_and_their_notifications(bridge, gateway):
    async with anyio.create_task_group() as tg:
        alice = await bridge.client(ALICE, tg)
        reply = (await alice.call("xworkmate.gateway.connect", {"runtimeId": "rt-1", "mode": "remote"}))["result"]
        assert reply["ok"] is True and reply["error"] is None
        assert reply["snapshot"]["status"] == "connected" and reply["snapshot"]["mode"] == "openclaw"
        assert reply["returnedDeviceToken"] is True
        assert "devtok-" not in str(reply) and TOKEN not in str(reply)
        assert reply["auth"]["role"] == "operator"
        health = await alice.call("xworkmate.gateway.request", {"runtimeId": "rt-1", "method": "health", "params": {}})
        assert health["result"] == {"ok": True, "payload": health["result"]["payload"], "error": None}
        assert health["result"]["payload"]["ok"] is True
        refused = (await alice.call("xworkmate.gateway.request", {"runtimeId": "rt-1", "method": "config.apply"}))[
            "result"
        ]
        assert refused["ok"] is False and refused["error"]["code"] == "METHOD_NOT_ALLOWED"
        assert not any(r.get("method") == "config.apply" for r in gateway.requests)
        await gateway.send_event("health", {"ok": True})
        await alice.wait(lambda: any(n["method"] == "xworkmate.gateway.push" for n in alice.notes))
        push = next(n for n in alice.notes if n["method"] == "xworkmate.gateway.push")["params"]
        assert push["runtimeId"] == "rt-1" and push["event"]["event"] == "health"
        assert any(n["method"] == "xworkmate.gateway.snapshot" for n in alice.notes)
        assert any(n["method"] == "xworkmate.gateway.log" for n in alice.notes)
        bye = await alice.call("xworkmate.gateway.disconnect", {"runtimeId": "rt-1"})
        assert bye["result"] == {"accepted": True}
        assert (await alice.call("xworkmate.gateway.disconnect", {"runtimeId": "rt-1"}))["result"] == {"accepted": True}
        offline = (await alice.call("xworkmate.gateway.request", {"runtimeId": "rt-1", "method": "health"}))["result"]
        assert offline["ok"] is False and offline["error"]["code"] == "OFFLINE"
        missing = (await alice.call("xworkmate.gateway.connect", {}))["result"]
        assert missing["ok"] is False and missing["error"]["code"] == "INVALID_RUNTIME_ID"
        tg.cancel_scope.cancel()


async def test_one_principal_never_sees_another_principals_runtime_events_or_gateway_session(bridge, gateway):
    async with anyio.create_task_group() as tg:
        alice, bob = await bridge.client(ALICE, tg), await bridge.client(BOB, tg)
        for client in (alice, bob):
            assert (await client.call("xworkmate.gateway.connect", {"runtimeId": "same-id"}))["result"]["ok"]
        sent = await alice.call(
            "xworkmate.gateway.request",
            {
                "runtimeId": "same-id",
                "method": "chat.send",
                "params": {"sessionKey": "main", "message": "hi", "idempotencyKey": "k1"},
            },
        )
        assert sent["result"]["ok"] is True
        await alice.wait(lambda: any(_run_push(n, "final") for n in alice.notes))
        key = next(r for r in gateway.requests if r.get("method") == "chat.send")["params"]["sessionKey"]
        assert key.startswith("xwm-") and key.endswith("-main")  # the key was put in alice's namespace
        # bob's own request (answered after alice's events were sent) shows bob saw none of them
        await bob.call("xworkmate.gateway.request", {"runtimeId": "same-id", "method": "health"})
        assert not any(
            n["method"] == "xworkmate.gateway.push" and n["params"]["event"]["event"] in ("chat", "agent", "chat.run")
            for n in bob.notes
        )
        run = next(n for n in alice.notes if _run_push(n, "final"))["params"]["event"]["payload"]
        assert run["terminal"] is True and run["assistantText"] == "Hello from the gateway."
        run_id = sent["result"]["payload"]["runId"]
        assert run_id != "k1" and run_id.endswith("-k1")  # the idempotency key, in alice's namespace
        # bob cannot read or abort alice's run by its id, nor reuse her idempotency key
        for method in ("agent.wait", "chat.abort"):
            params = {"runId": run_id, "sessionKey": "main"}
            stolen = await bob.call(
                "xworkmate.gateway.request", {"runtimeId": "same-id", "method": method, "params": params}
            )
            assert stolen["result"]["error"]["code"] == "UNKNOWN_RUN"
        mine = await alice.call(
            "xworkmate.gateway.request", {"runtimeId": "same-id", "method": "agent.wait", "params": {"runId": run_id}}
        )
        assert mine["result"]["ok"] is True and mine["result"]["payload"]["status"] == "ok"
        tg.cancel_scope.cancel()


def _run_push(note: dict[str, Any], state: str) -> bool:
    if note["method"] != "xworkmate.gateway.push":
        return False
    event = note["params"]["event"]
    return event["event"] == "chat.run" and event["payload"]["state"] == state


async def test_a_gateway_routed_turn_streams_text_and_tool_calls_and_ends_like_an_agent_turn(bridge, gateway, tmp_path):
    gateway.tool_call = {"name": "write", "args": {"path": "hello.txt", "content": "hi\n"}}
    async with anyio.create_task_group() as tg:
        alice = await bridge.client(ALICE, tg)
        reply = await alice.call("session.start", gateway_turn("s-gw-1", cwd=str(tmp_path)))
        result = reply["result"]
        assert result["status"] == "completed" and result["success"] is True
        assert result["output"] == "Hello from the gateway."
        assert result["mode"] == "gateway-chat" and result["runId"] == result["turnId"]
        assert result["resolvedExecutionTarget"] == "gateway" and result["resolvedGatewayProviderId"] == "openclaw"
        sent = next(r for r in gateway.requests if r.get("method") == "chat.send")["params"]
        assert sent["idempotencyKey"] == result["turnId"] and sent["message"] == "Say hello"
        assert result["upstreamSessionId"] == sent["sessionKey"]
        updates = alice.updates(result["turnId"])
        deltas = "".join(u.get("delta", "") for u in updates if u.get("type") == "delta")
        assert deltas == "Hello from the gateway."
        tools = [u for u in updates if u.get("type") in ("tool_call", "tool_call_update")]
        assert tools[0]["type"] == "tool_call" and tools[0]["toolCall"]["toolCallId"] == "call_1"
        assert tools[0]["toolCall"]["title"] == "Run write"
        assert tools[-1]["toolCall"]["status"] == "completed"
        assert any(u.get("event") == "gateway_status" for u in updates)
        # the next turn of the session continues the same gateway session
        again = (await alice.call("session.message", gateway_turn("s-gw-1")))["result"]
        keys = [r["params"]["sessionKey"] for r in gateway.requests if r.get("method") == "chat.send"]
        assert again["status"] == "completed" and keys[0] == keys[1]
        tg.cancel_scope.cancel()


async def test_session_cancel_sends_chat_abort_and_the_turn_ends_cancelled(bridge, gateway):
    gateway.reply_chunks = [f"tick {i} " for i in range(100)]
    gateway.chunk_delay = 0.05
    async with anyio.create_task_group() as tg:
        alice = await bridge.client(ALICE, tg)
        request_id = await alice.send("session.start", gateway_turn("s-gw-2"))
        await alice.wait(lambda: any(u.get("type") == "delta" for u in alice.updates()))
        cancel = await alice.call("session.cancel", {"sessionId": "s-gw-2"})
        assert cancel["result"]["accepted"] is True
        await alice.wait(lambda: request_id in alice.replies)
        result = alice.replies[request_id]["result"]
        assert result["status"] == "cancelled"
        abort = next(r for r in gateway.requests if r.get("method") == "chat.abort")["params"]
        assert abort["runId"] == result["turnId"] and gateway.aborted == [result["turnId"]]
        tg.cancel_scope.cancel()


async def test_a_gateway_that_refuses_the_token_fails_each_turn_once_with_the_precise_cause(tmp_path):
    async with FakeGateway(token="another-token") as gateway:
        cfg = config(tmp_path, gateway.url)
        async with real_server(cfg, build_app(cfg)) as port, anyio.create_task_group() as tg:
            alice = await Bridge(port).client(ALICE, tg)
            result = (await alice.call("session.start", gateway_turn("s-gw-3")))["result"]
            assert result["status"] == "failed"
            assert result["error"]["code"] == "GATEWAY_ERROR"
            assert result["error"]["data"]["detailCode"] == "AUTH_TOKEN_MISMATCH"
            assert "refused gateway.token" in result["error"]["message"]
            assert len(gateway.attempts) == 1  # one attempt per turn, no retry loop
            logs = (await alice.call("system.logs", {}))["result"]
            assert logs["gatewayStatus"] == "error"
            tg.cancel_scope.cancel()


async def test_editors_get_the_gateway_as_one_more_provider_choice(bridge, tmp_path):
    async with anyio.create_task_group() as tg:
        editor = await bridge.client(ALICE, tg)  # an ACP initialize opens the editor dialect
        assert "result" in await editor.call("initialize", {"protocolVersion": 1})
        new = (await editor.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}))["result"]
        option = next(o for o in new["configOptions"] if o["id"] == "provider")
        assert "openclaw" in [choice["value"] for choice in option["options"]]
        chosen = await editor.call(
            "session/set_config_option", {"sessionId": new["sessionId"], "configId": "provider", "value": "openclaw"}
        )
        assert "result" in chosen, chosen
        prompt = {"sessionId": new["sessionId"], "prompt": [{"type": "text", "text": "Say hello"}]}
        done = (await editor.call("session/prompt", prompt))["result"]
        assert done["stopReason"] == "end_turn"
        chunks = [
            n["params"]["update"]["content"]["text"]
            for n in editor.notes
            if n["method"] == "session/update" and n["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
        ]
        assert "".join(chunks) == "Hello from the gateway."
        tg.cancel_scope.cancel()


async def test_chat_with_target_gateway_streams_a_gateway_routed_turn(bridge):
    argv = [sys.executable, "-m", "bridge.cli", "chat", "--url", f"http://127.0.0.1:{bridge.port}", "--token", ALICE]
    done = await anyio.run_process([*argv, "--target", "gateway", "Say hello"], check=False)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "Hello from the gateway." in out and "[completed]" in out and "provider=openclaw" in out
    refused = await anyio.run_process([*argv, "--target", "gateway", "--provider", "codex", "hi"], check=False)
    assert refused.returncode == 2 and b"cannot go with --target gateway" in refused.stderr


# ---- hostile clients and a broken gateway ---------------------------------------------------------


async def test_a_crafted_session_key_reaches_no_other_principals_stream(bridge, gateway):
    from compat.gateway.adapter import principal_prefix

    async with anyio.create_task_group() as tg:
        alice, bob = await bridge.client(ALICE, tg), await bridge.client(BOB, tg)
        for client in (alice, bob):
            assert (await client.call("xworkmate.gateway.connect", {"runtimeId": "rt"}))["result"]["ok"]
        crafted = f"{principal_prefix('bob')}x:{principal_prefix('alice')}main"
        params = {"sessionKey": crafted, "message": "hi", "idempotencyKey": "evil"}
        sent = await bob.call("xworkmate.gateway.request", {"runtimeId": "rt", "method": "chat.send", "params": params})
        assert sent["result"]["ok"] is True
        await bob.wait(lambda: any(_run_push(n, "final") for n in bob.notes))
        await alice.call("xworkmate.gateway.request", {"runtimeId": "rt", "method": "health"})
        assert not any(n["method"] == "xworkmate.gateway.push" for n in alice.notes if "chat" in str(n))
        tg.cancel_scope.cancel()


async def test_disconnecting_a_runtime_one_never_had_leaves_the_connection_up(bridge, gateway):
    async with anyio.create_task_group() as tg:
        alice, bob = await bridge.client(ALICE, tg), await bridge.client(BOB, tg)
        assert (await alice.call("xworkmate.gateway.connect", {"runtimeId": "rt-a"}))["result"]["ok"]
        await alice.call("xworkmate.gateway.disconnect", {"runtimeId": "rt-a"})  # the last runtime: closes
        gateway.reply_chunks = ["slow ", "answer"]
        gateway.chunk_delay = 0.3
        turn = await alice.send("session.start", gateway_turn("s-gw-disc"))
        await alice.wait(lambda: any(u.get("type") == "delta" for u in alice.updates()))
        assert (await bob.call("xworkmate.gateway.disconnect", {"runtimeId": "never-had"}))["result"]["accepted"]
        await alice.wait(lambda: turn in alice.replies)
        assert alice.replies[turn]["result"]["status"] == "completed"
        long_id = {"runtimeId": "x" * 201}
        refused = (await alice.call("xworkmate.gateway.connect", long_id))["result"]
        assert refused["error"]["code"] == "INVALID_RUNTIME_ID"
        tg.cancel_scope.cancel()


async def test_a_cancel_while_chat_send_is_in_flight_aborts_the_run_once_the_gateway_knows_it(bridge, gateway):
    gateway.slow_methods["chat.send"] = 1.0
    gateway.reply_chunks = [f"tick {i} " for i in range(100)]
    gateway.chunk_delay = 0.05
    async with anyio.create_task_group() as tg:
        alice = await bridge.client(ALICE, tg)
        turn = await alice.send("session.start", gateway_turn("s-gw-early"))
        await alice.wait(lambda: any(r.get("method") == "chat.send" for r in gateway.requests))
        await alice.call("session.cancel", {"sessionId": "s-gw-early"})
        await alice.wait(lambda: turn in alice.replies)
        result = alice.replies[turn]["result"]
        assert result["status"] == "cancelled"
        assert gateway.aborted == [result["turnId"]]  # sent after chat.send's answer, so it landed
        tg.cancel_scope.cancel()


async def test_a_gateway_whose_agent_wait_answers_timeout_at_once_is_polled_gently(bridge, gateway):
    gateway.wait_answers_timeout = True
    async with anyio.create_task_group() as tg:
        alice = await bridge.client(ALICE, tg)
        turn = await alice.send("session.start", gateway_turn("s-gw-poll"))
        await alice.wait(lambda: any(r.get("method") == "agent.wait" for r in gateway.requests))
        await anyio.sleep(2.5)  # a bounded window: the polls in it are counted
        polls = sum(1 for r in gateway.requests if r.get("method") == "agent.wait")
        assert polls <= 4
        await alice.call("session.cancel", {"sessionId": "s-gw-poll"})
        gateway.wait_answers_timeout = False
        await alice.wait(lambda: turn in alice.replies)
        assert alice.replies[turn]["result"]["status"] == "cancelled"
        tg.cancel_scope.cancel()


async def test_health_shows_a_principal_only_its_own_gateway_sessions(bridge, gateway):
    from compat.gateway.adapter import principal_prefix

    gateway.health_sessions = [
        {"key": f"agent:main:{principal_prefix('alice')}main", "totalTokens": 10},
        {"key": f"agent:main:{principal_prefix('bob')}main", "totalTokens": 20},
        {"key": "agent:main:main", "totalTokens": 30},
    ]
    async with anyio.create_task_group() as tg:
        alice = await bridge.client(ALICE, tg)
        assert (await alice.call("xworkmate.gateway.connect", {"runtimeId": "rt"}))["result"]["ok"]
        health = (await alice.call("xworkmate.gateway.request", {"runtimeId": "rt", "method": "health"}))["result"]
        assert [s["totalTokens"] for s in health["payload"]["sessions"]["recent"]] == [10]
        status = (await alice.call("xworkmate.gateway.request", {"runtimeId": "rt", "method": "status"}))["result"]
        assert status["error"]["code"] == "METHOD_NOT_ALLOWED"  # it lists every principal's sessions
        tg.cancel_scope.cancel()


async def test_the_gateway_provider_id_and_a_gateway_only_bridge_route_to_the_gateway(bridge):
    async with anyio.create_task_group() as tg:
        alice = await bridge.client(ALICE, tg)
        caps = (await alice.call("acp.capabilities", {}))["result"]
        assert caps["availableExecutionTargets"] == ["gateway"]  # no agent provider can run here
        by_id = {"sessionId": "s-gw-id", "taskPrompt": "hi", "routing": {"explicitProviderId": "openclaw"}}
        result = (await alice.call("session.start", by_id))["result"]
        assert result["status"] == "completed" and result["resolvedExecutionTarget"] == "gateway"
        auto = (await alice.call("session.start", {"sessionId": "s-gw-auto", "taskPrompt": "fix the bug"}))["result"]
        assert auto["status"] == "completed" and auto["resolvedGatewayProviderId"] == "openclaw"
        tg.cancel_scope.cancel()


def test_providers_lists_the_gateway(tmp_path):
    import subprocess

    cfg = tmp_path / "bridge.yaml"
    cfg.write_text(
        "providers: {}\nknowledge: {enabled: false}\n"
        f"gateway: {{url: 'ws://127.0.0.1:1', token: t0k3n-for-tests}}\ndataDir: {tmp_path}\n"
    )
    argv = [sys.executable, "-m", "bridge.cli", "providers", "--local", "--config", str(cfg)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.split()[:3] == ["openclaw", "OpenClaw", "gateway"] and out.split()[4] == "ok"
