"""Exec profiles through the whole bridge over a real WebSocket (uvicorn on 127.0.0.1): the
``session.update`` stream, the result's ``output`` and ``upstreamSessionId``, turn error codes,
cancel, close, and the catalog entry (category ``profile``).

``make_profile_app`` writes a config with a ``profiles:`` key next to the profile scripts and loads
it with the bridge's own loader, as ``serve --config`` does.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
import yaml
from websockets.asyncio.client import connect

from bridge.cli import build_app
from bridge.config import BridgeConfig, load_config
from compat.profile.settings import tools_dir
from orchestrator.results import SessionUpdate, TurnResult
from tests.helpers import WsClient as Client
from tests.helpers import conforms, real_server

from .conftest import SCRIPTS

pytestmark = pytest.mark.timeout(60)
_ids = itertools.count(1)


def make_profile_app(config: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[BridgeConfig, Any]:
    """The bridge app for ``config`` (camelCase bridge keys plus ``profiles:``), loaded the way
    ``serve --config`` loads a file; ``profileDir`` is the directory the file is written to, where
    relative profile paths point."""
    raw = dict(config)
    profile_dir = Path(raw.pop("profileDir"))
    path = profile_dir / f"bridge-{next(_ids)}.yaml"
    path.write_text(yaml.safe_dump(raw))
    try:
        loaded = load_config(str(path))
    finally:
        path.unlink()
    return loaded, build_app(loaded)


def base_config(tmp_path: Path, profiles: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "workspaceRoots": [str(tmp_path)],
        "profileDir": str(SCRIPTS),
        "profiles": profiles,
        "timeouts": {"cancelGrace": 1, "turnTimeout": 30},
        **extra,
    }


def turn(provider: str, session: str, prompt: str, cwd: Path) -> dict[str, Any]:
    return {
        "sessionId": session,
        "taskPrompt": prompt,
        "workingDirectory": str(cwd),
        "routing": {"routingMode": "explicit", "explicitExecutionTarget": "agent", "explicitProviderId": provider},
    }


def children() -> list[psutil.Process]:
    """Our live descendants that run a test profile (other suites' servers may be running too)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(proc.cmdline())
            if proc.status() != psutil.STATUS_ZOMBIE and (str(SCRIPTS) in cmdline or "time.sleep(600)" in cmdline):
                found.append(proc)
        except psutil.Error:
            continue
    return found


async def _with_client(config: BridgeConfig, app: Any, body: Any) -> None:
    async with real_server(config, app) as port:
        async with connect(f"ws://127.0.0.1:{port}/acp", max_size=None) as ws, anyio.create_task_group() as tg:
            client = Client(ws)
            tg.start_soon(client.pump)
            await body(client)
            tg.cancel_scope.cancel()


async def test_a_profile_turn_over_websocket_streams_and_keeps_its_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, app = make_profile_app(base_config(tmp_path, {"echo": {"script": "echo.py", "label": "Echo"}}), monkeypatch)

    async def body(client: Client) -> None:
        caps = await client.call("acp.capabilities", {})
        entry = next(p for p in caps["result"]["providerCatalog"] if p["providerId"] == "echo")
        assert entry["category"] == "profile" and entry["label"] == "Echo" and entry["enabled"] is True

        result = (await client.call("session.start", turn("echo", "ws-1", "hello bridge", tmp_path)))["result"]
        conforms(TurnResult, result)
        assert result["success"] is True and result["output"] == "echo: hello bridge", result
        assert result["upstreamSessionId"] == "py-1" and result["resolvedProviderId"] == "echo"
        ups = client.updates(result["turnId"])
        for update in ups:
            conforms(SessionUpdate, update)
        assert [u["delta"] for u in ups if u["type"] == "delta"] == ["echo: ", "hello bridge"]
        assert ups[-1]["type"] == "done" and ups[-1]["status"] == "completed"

        again = (await client.call("session.message", turn("echo", "ws-1", "more", tmp_path)))["result"]
        assert again["output"] == "echo: more" and again["upstreamSessionId"] == "py-1+"
        closed = await client.call("session.close", {"sessionId": "ws-1"})
        assert closed["result"]["closed"] is True

    await _with_client(config, app, body)


async def test_profile_failures_are_results_with_profile_error_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profiles = {
        "err": {"script": "modes.py", "env": {"PROFILE_MODE": "error"}},
        "exit": {"script": "modes.py", "env": {"PROFILE_MODE": "exit"}},
        "slow": {"script": "modes.py", "env": {"PROFILE_MODE": "hang"}, "timeout_secs": 1},
        "flood": {"script": "modes.py", "env": {"PROFILE_MODE": "flood-partials"}},
    }
    config, app = make_profile_app(base_config(tmp_path, profiles, limits={"maxOutputBytes": 3000}), monkeypatch)

    async def body(client: Client) -> None:
        expected = {
            "err": ("failed", "PROFILE_ERROR"),
            "exit": ("failed", "PROFILE_EXIT"),
            "slow": ("timeout", "PROFILE_TIMEOUT"),
            "flood": ("failed", "OUTPUT_LIMIT"),
        }
        for n, (provider, (status, code)) in enumerate(expected.items()):
            result = (await client.call("session.start", turn(provider, f"f-{n}", "go", tmp_path)))["result"]
            conforms(TurnResult, result)
            assert (result["status"], result["error"]["code"]) == (status, code), result
            deltas = [u["delta"] for u in client.updates(result["turnId"]) if u["type"] == "delta"]
            assert "".join(deltas) == result["output"]
        _, alive = psutil.wait_procs(children(), timeout=5)
        assert not alive, alive

    await _with_client(config, app, body)


async def test_session_cancel_over_websocket_ends_the_profile_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profiles = {"hang": {"script": "modes.py", "env": {"PROFILE_MODE": "hang"}}}
    config, app = make_profile_app(base_config(tmp_path, profiles), monkeypatch)

    async def body(client: Client) -> None:
        start = await client.send("session.start", turn("hang", "c-1", "wait", tmp_path))
        await client.wait(lambda: any(u["type"] == "delta" for u in client.updates()))
        assert (await client.call("session.cancel", {"sessionId": "c-1"}))["result"]["cancelled"] is True
        await client.wait(lambda: start in client.replies, 10)
        result = client.replies[start]["result"]
        assert result["status"] == "cancelled" and result["output"] == "started", result
        gone, alive = psutil.wait_procs(children(), timeout=5)
        assert not alive, alive

    await _with_client(config, app, body)


async def test_an_agentproc_profile_over_websocket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = tools_dir() / "agentproc-0.4.2" / "bin" / "python"
    if not python.exists():
        pytest.fail("agentproc 0.4.2 is not installed: run `make test` (scripts/install-profile-tools.sh)")
    profiles = {"ap": {"script": "agentproc_bot.py", "command": str(python)}}
    config, app = make_profile_app(base_config(tmp_path, profiles), monkeypatch)

    async def body(client: Client) -> None:
        result = (await client.call("session.start", turn("ap", "ap-1", "hi", tmp_path)))["result"]
        assert result["success"] is True and result["upstreamSessionId"] == "ap-1", result
        deltas = [u["delta"] for u in client.updates(result["turnId"]) if u["type"] == "delta"]
        assert deltas[:4] == ["Hel", "lo ", "wörld\n", "✓"] and "".join(deltas) == result["output"]
        assert result["output"].endswith("\nfinal body from local in ap-1")

    await _with_client(config, app, body)
