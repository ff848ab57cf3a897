"""Finding 4 of the hostile-clients issue: live agent processes are capped bridge-wide
(``maxLiveAgents``): the least recently used idle agent makes room; with none idle a turn waits,
saying so, then fails ``AGENT_CAPACITY``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import psutil
import pytest

from bridge.config import BridgeConfig
from compat.settings import convert
from tests.helpers import real_server
from tests.security.conftest import AUTH, TOKEN, WAIT, side_call
from tests.test_app_integration import FAKE_AGENT, config_dict

pytestmark = [pytest.mark.timeout(90), pytest.mark.anyio]


def live_agents() -> int:
    """The fake agents alive under this process (the bridge runs in it)."""
    return sum(1 for p in psutil.Process().children(recursive=True) if str(FAKE_AGENT) in " ".join(_cmd(p)))


def _cmd(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline() if process.status() != psutil.STATUS_ZOMBIE else []
    except psutil.Error:
        return []


def config(tmp_path: Path, *modes: str, **limits: Any) -> BridgeConfig:
    data = config_dict(tmp_path, *modes)
    data.update(authTokens=[TOKEN], limits={"maxLiveAgents": 2, **limits})
    data["timeouts"] = {**data["timeouts"], "agentCapacityTimeout": 1.5}
    return convert(data, BridgeConfig)


async def post(client: httpx.AsyncClient, port: int, method: str, params: dict[str, Any], sse: bool = False) -> Any:
    headers = {**AUTH, "Accept": "text/event-stream"} if sse else AUTH
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    response = await client.post(f"http://127.0.0.1:{port}/acp/rpc", json=body, headers=headers)
    if sse:
        return [
            json.loads(line[5:])
            for line in response.text.splitlines()
            if line.startswith("data:") and "[DONE]" not in line
        ]
    return response.json()


async def test_past_max_live_agents_the_least_recently_used_idle_one_makes_room(tmp_path: Path) -> None:
    from bridge.cli import build_app

    cfg = config(tmp_path)
    async with real_server(cfg, build_app(cfg)) as port, httpx.AsyncClient(timeout=WAIT * 3) as client:
        for session in ("s1", "s2", "s3", "s4"):
            result = (await post(client, port, "session.start", {"sessionId": session, "taskPrompt": "hi"}))["result"]
            assert result["status"] == "completed"
            assert live_agents() <= 2
        again = (await post(client, port, "session.message", {"sessionId": "s1", "taskPrompt": "again"}))["result"]
        assert again["status"] == "completed" and live_agents() <= 2


async def test_with_every_agent_busy_a_turn_says_it_waits_then_fails_agent_capacity(tmp_path: Path) -> None:
    from bridge.cli import build_app

    cfg = config(tmp_path, "slow")
    async with real_server(cfg, build_app(cfg)) as port, httpx.AsyncClient(timeout=WAIT * 3) as client:
        busy: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def hold(session: str) -> None:
                busy.append(await post(client, port, "session.start", {"sessionId": session, "taskPrompt": "slow"}))

            tg.start_soon(hold, "b1")
            tg.start_soon(hold, "b2")
            with anyio.fail_after(WAIT):
                while live_agents() < 2:
                    await anyio.sleep(0.05)  # polling the process table: bounded by fail_after
            messages = await post(client, port, "session.start", {"sessionId": "late", "taskPrompt": "hi"}, sse=True)
            assert await side_call(port)  # the bridge still answers meanwhile
            for session in ("b1", "b2"):
                await post(client, port, "session.cancel", {"sessionId": session})
    updates = [m["params"] for m in messages if m.get("method") == "session.update"]
    result = messages[-1]["result"]
    assert any(u.get("event") == "waiting" and u.get("reason") == "capacity" for u in updates)
    assert result["status"] == "failed" and result["error"]["code"] == "AGENT_CAPACITY"
    assert result["error"]["data"] == {"limit": "maxLiveAgents", "value": 2}
    assert all(b["result"]["status"] == "cancelled" for b in busy)
