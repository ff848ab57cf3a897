"""Editor mode over WebSocket (docs/api.md "Editor mode"): a real ``serve`` process, the official
Python ACP SDK's WebSocket transport as the editor, behind the bridge's token check. Sessions are
the token's: one started by the desktop app's methods is listed and loaded in the editor, never
for another token."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml
from acp import PROTOCOL_VERSION, connect_to_agent, text_block
from acp.schema import ClientCapabilities, UserMessageChunk
from acp.ws import create_websocket_stream
from websockets.exceptions import InvalidStatus

from tests.editor.test_acp_stdio import Editor
from tests.sessions.test_restart import Bridge
from tests.test_app_integration import FAKE_AGENT

pytestmark = pytest.mark.timeout(60)
TOKENS = [{"name": "alice", "token": "alice-token-0123"}, {"name": "bob", "token": "bob-token-456789"}]
ALICE = {"Authorization": "Bearer alice-token-0123"}
BOB = {"Authorization": "Bearer bob-token-456789"}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Bridge]:
    data = {
        "workspaceRoots": [str(tmp_path)],
        "authTokens": TOKENS,
        "providers": {
            "echo": {"command": sys.executable, "args": [str(FAKE_AGENT)]},
            "slow": {"command": sys.executable, "args": [str(FAKE_AGENT), "--mode", "slow"]},
        },
        "timeouts": {"cancelGrace": 1},
    }
    cfg = tmp_path / "bridge.yaml"
    cfg.write_text(yaml.safe_dump(data))
    bridge = Bridge(tmp_path, cfg)
    try:
        yield bridge
    finally:
        bridge.stop()


@contextlib.asynccontextmanager
async def editor_on(bridge: Bridge, who: dict[str, str], editor: Editor) -> AsyncIterator[Any]:
    transport = await create_websocket_stream(f"ws://127.0.0.1:{bridge.port}/acp", headers=who)
    conn = connect_to_agent(editor, transport)
    try:
        init = await conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities())
        assert init.protocol_version == 1 and init.auth_methods == []
        yield conn
    finally:
        await conn.close()
        await transport.close()


async def test_a_prompt_round_trip_over_the_websocket(served: Bridge, tmp_path: Path) -> None:
    editor = Editor()
    async with editor_on(served, ALICE, editor) as conn:
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.set_config_option(session_id=new.session_id, config_id="provider", value="echo")
        answer = await conn.prompt(session_id=new.session_id, prompt=[text_block("over the wire")])
    assert answer.stop_reason == "end_turn"
    assert editor.text() == "echo: over the wire"


async def test_the_upgrade_still_needs_a_token(served: Bridge) -> None:
    with pytest.raises(InvalidStatus) as refused:
        await create_websocket_stream(f"ws://127.0.0.1:{served.port}/acp")
    assert refused.value.response.status_code == 401


async def test_a_session_the_app_started_opens_in_the_editor_of_the_same_token_only(
    served: Bridge, tmp_path: Path
) -> None:
    start = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "session.start",
        "params": {
            "sessionId": "from-the-app",
            "taskPrompt": "hello from the app",
            "workingDirectory": str(tmp_path),
            "routing": {"explicitProviderId": "echo"},
        },
    }
    async with httpx.AsyncClient(timeout=30) as http:
        started = (await http.post(f"{served.url}/acp/rpc", json=start, headers=ALICE)).json()
    assert started["result"]["success"]
    mine = Editor()
    async with editor_on(served, ALICE, mine) as conn:
        listed = await conn.list_sessions()
        assert [s.session_id for s in listed.sessions] == ["from-the-app"]
        await conn.load_session(session_id="from-the-app", cwd=str(tmp_path), mcp_servers=[])
    assert "echo: hello from the app" in mine.text()
    theirs = Editor()
    async with editor_on(served, BOB, theirs) as conn:
        assert (await conn.list_sessions()).sessions == []
        with pytest.raises(Exception) as unknown:
            await conn.load_session(session_id="from-the-app", cwd=str(tmp_path), mcp_servers=[])
        assert getattr(unknown.value, "code", None) == -32004
    assert theirs.updates == []


async def test_a_turn_that_outlived_its_socket_is_replayed_and_streams_on_after_session_load(
    served: Bridge, tmp_path: Path
) -> None:
    first = Editor()
    async with editor_on(served, ALICE, first) as conn:
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.set_config_option(session_id=new.session_id, config_id="provider", value="slow")
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: conn.prompt(session_id=new.session_id, prompt=[text_block("count")]))
            with anyio.fail_after(20):
                while "1 " not in first.text():
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()  # the editor goes away mid-turn
    second = Editor()
    async with editor_on(served, ALICE, second) as conn:
        await conn.load_session(session_id=new.session_id, cwd=str(tmp_path), mcp_servers=[])
        assert second.of(UserMessageChunk)[0].content.text == "count"
        assert second.text().startswith("0 1 "), "what the turn streamed before the reload"
        seen = len(second.text())
        with anyio.fail_after(20):
            while len(second.text()) <= seen + 4:  # and what it streams after, live
                await anyio.sleep(0.01)
        await conn.cancel(session_id=new.session_id)
    numbers = second.text().split()
    assert numbers == [str(n) for n in range(len(numbers))], "no gap, no duplicate"
