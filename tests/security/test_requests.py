"""Findings 2 and 3 of the hostile-clients issue: no body is read before the token is checked,
and batches are bounded in length and in the size of their reply."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest
from websockets.asyncio.client import connect

from tests.security.conftest import AUTH, TOKEN, WAIT, serve, side_call

pytestmark = [pytest.mark.timeout(60), pytest.mark.anyio]


async def stalled_tokenless_post(port: int, declared: int) -> bytes:
    """Headers announcing ``declared`` body bytes, then 1 KiB of them, then nothing: what the
    bridge answers (it must not wait for the rest)."""
    stream = await anyio.connect_tcp("127.0.0.1", port)
    async with stream:
        head = (
            f"POST /acp/rpc HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
        )
        await stream.send(head.encode() + b"[" * 1024)
        answer = b""
        with anyio.fail_after(WAIT):
            try:
                while chunk := await stream.receive():
                    answer += chunk
            except anyio.EndOfStream:
                pass  # closed after the 401: nothing of the body is waited for
    return answer


async def test_a_tokenless_body_is_never_read_and_its_connection_closed(tmp_path: Path) -> None:
    async with serve(tmp_path) as port:
        answers: list[bytes] = []

        async def attacker() -> None:
            answers.append(await stalled_tokenless_post(port, 4 * 1024 * 1024))

        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(attacker)
            caps = await side_call(port)
    assert caps["providerCatalog"]
    assert len(answers) == 20 and all(a.startswith(b"HTTP/1.1 401") for a in answers)
    assert all(b"-32001" in a for a in answers)


async def test_a_batch_longer_than_max_batch_size_gets_one_limit_error(tmp_path: Path) -> None:
    call = {"jsonrpc": "2.0", "method": "acp.capabilities"}
    async with serve(tmp_path, limits={"maxBatchSize": 5}) as port, httpx.AsyncClient(timeout=WAIT) as client:
        url = f"http://127.0.0.1:{port}/acp/rpc"
        long = (await client.post(url, json=[{**call, "id": i} for i in range(6)], headers=AUTH)).json()
        ok = (await client.post(url, json=[{**call, "id": i} for i in range(5)], headers=AUTH)).json()
        assert await side_call(port)
    assert long["id"] is None and long["error"]["code"] == -32006
    assert long["error"]["data"]["limit"] == "maxBatchSize" and long["error"]["data"]["value"] == 5
    assert isinstance(ok, list) and len(ok) == 5


async def test_a_batch_reply_past_max_batch_reply_bytes_is_one_error_on_http_and_websocket(tmp_path: Path) -> None:
    batch = [{"jsonrpc": "2.0", "id": i, "method": "acp.capabilities"} for i in range(20)]
    async with serve(tmp_path, limits={"maxBatchReplyBytes": 8192}) as port:
        async with httpx.AsyncClient(timeout=WAIT) as client:
            http = (await client.post(f"http://127.0.0.1:{port}/acp/rpc", json=batch, headers=AUTH)).json()
        async with connect(f"ws://127.0.0.1:{port}/acp", additional_headers=AUTH, open_timeout=WAIT) as ws:
            await ws.send(json.dumps(batch))
            with anyio.fail_after(WAIT):
                frame = json.loads(await ws.recv())
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": "after", "method": "acp.capabilities"}))
            with anyio.fail_after(WAIT):
                after = json.loads(await ws.recv())
    for reply in (http, frame):
        assert reply["error"]["code"] == -32006 and reply["error"]["data"]["limit"] == "maxBatchReplyBytes"
    assert after["id"] == "after" and after["result"]["providerCatalog"]  # the socket goes on
    assert TOKEN not in json.dumps(http)
