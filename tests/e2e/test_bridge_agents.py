"""End to end over a real WebSocket: the bridge drives each pinned real agent.

For every agent: the fake model server runs on 127.0.0.1, the bridge runs under uvicorn with the
agent's offline recipe as its only provider, and a `websockets` client sends `session.start`,
`session.cancel` and `session.close`. The tests assert the streamed deltas, the final `output`, the
`session.update` sequence, and that cancel and close leave no agent process behind.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from websockets.asyncio.client import connect

from bridge.cli import build_app
from bridge.config import BridgeConfig
from compat.settings import convert
from orchestrator.results import SessionUpdate, TurnResult
from tests.e2e import agents
from tests.fakes.fake_llm import FakeLLM, fake_llm  # noqa: F401  (fixture)
from tests.helpers import WsClient as Client
from tests.helpers import conforms, real_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

AGENTS = ["opencode", "hermes", "gemini", "codex", "claude"]
CHUNKS = ["Hello ", "from ", "mock"]


def bridge_config(name: str, recipe: dict[str, Any], tmp_path: Path) -> BridgeConfig:
    return convert(config_dict(name, recipe, tmp_path), BridgeConfig)


def config_dict(name: str, recipe: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """A bridge configuration whose only provider is agent ``name`` (its offline recipe)."""
    provider = {
        "type": "acp",
        "command": recipe["command"],
        "args": recipe["args"],
        "env": recipe["env"],
        "cwd": recipe.get("cwd"),
        "authMethod": recipe.get("auth_method"),
    }
    return {
        "workspaceRoots": [str(tmp_path)],
        "providers": {name: provider},
        "timeouts": {"cancelGrace": 3, "initializeTimeout": 40, "sessionNewTimeout": 40, "turnTimeout": 90},
    }


@contextlib.asynccontextmanager
async def bridge_client(name: str, llm: FakeLLM, tmp_path: Path) -> AsyncIterator[tuple[Client, dict[str, Any]]]:
    """A bridge under uvicorn whose only provider is agent ``name`` (offline recipe), and a
    WebSocket client connected to it; yields ``(client, recipe)``."""
    assert agents.installed(name), f"{name} is missing from {agents.agents_dir()}: run `make agents`"
    recipe = agents.recipe(name, llm.base_url, tmp_path)
    config = bridge_config(name, recipe, tmp_path)
    async with real_server(config, build_app(config)) as port:
        async with connect(f"ws://127.0.0.1:{port}/acp", max_size=None) as ws, anyio.create_task_group() as tg:
            client = Client(ws)
            tg.start_soon(client.pump)
            yield client, recipe
            tg.cancel_scope.cancel()


def agent_processes() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]


def assert_no_agent_left() -> None:
    gone, alive = psutil.wait_procs(agent_processes(), timeout=10)
    assert not alive, f"agent processes left behind: {[(p.pid, p.name()) for p in alive]}"


def turn_params(name: str, recipe: dict[str, Any], session: str, prompt: str) -> dict[str, Any]:
    return {
        "sessionId": session,
        "taskPrompt": prompt,
        "workingDirectory": str(recipe["session_cwd"]),
        "routing": {"routingMode": "explicit", "explicitExecutionTarget": "agent", "explicitProviderId": name},
    }


@pytest.mark.parametrize("name", AGENTS)
async def test_session_start_streams_a_real_agent_answer(name: str, fake_llm: FakeLLM, tmp_path: Path):
    fake_llm.set_reply(chunks=CHUNKS, delay=0.02)
    async with bridge_client(name, fake_llm, tmp_path) as (client, recipe):
        reply = await client.call("session.start", turn_params(name, recipe, "e2e-1", "Say hello"))
        result = reply["result"]
        context = f"result={result}\nllm={fake_llm.summary()}"
        assert result["success"] is True and result["status"] == "completed", context
        conforms(TurnResult, result)
        ups = client.updates()
        deltas = [u["delta"] for u in ups if u["type"] == "delta"]
        assert "".join(deltas) == result["output"], context
        assert "Hello from mock" in result["output"], context
        assert [d for d in deltas if d.strip()][-3:] == CHUNKS, context
        assert ups[0]["event"] == "started" and ups[-1]["type"] == "done", context
        assert ups[-1]["event"] == "completed" and ups[-1]["status"] == "completed"
        assert [u["seq"] for u in ups] == list(range(1, len(ups) + 1))
        assert all(u["turnId"] == result["turnId"] and u["sessionId"] == "e2e-1" for u in ups)
        for update in ups:
            conforms(SessionUpdate, update)
        assert result["resolvedProviderId"] == name

        # a second turn continues the same agent session
        again = await client.call("session.message", turn_params(name, recipe, "e2e-1", "Again"))
        assert again["result"]["success"] is True, again
        assert again["result"]["contextReset"] is False

        closed = await client.call("session.close", {"sessionId": "e2e-1"})
        assert closed["result"] == {"accepted": True, "closed": True}
        assert_no_agent_left()


@pytest.mark.parametrize("name", AGENTS)
async def test_session_cancel_stops_a_real_agent_turn(name: str, fake_llm: FakeLLM, tmp_path: Path):
    fake_llm.set_reply(chunks=["slow "] * 200, delay=0.25)
    async with bridge_client(name, fake_llm, tmp_path) as (client, recipe):
        start_id = await client.send("session.start", turn_params(name, recipe, "e2e-c", "Talk slowly"))
        await client.wait(lambda: any(u["type"] == "delta" and u["delta"].strip() for u in client.updates()), 90)
        cancelled = await client.call("session.cancel", {"sessionId": "e2e-c"}, timeout=10)
        assert cancelled["result"] == {"accepted": True, "cancelled": True}
        await client.wait(lambda: start_id in client.replies, 15)
        result = client.replies[start_id]["result"]
        assert result["status"] == "cancelled", result
        assert "slow" in result["output"]
        done = client.updates()[-1]
        assert done["type"] == "done" and done["status"] == "cancelled"
        closed = await client.call("session.close", {"sessionId": "e2e-c"})
        assert closed["result"]["closed"] is True
        assert_no_agent_left()
