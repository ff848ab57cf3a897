"""Attacks the bridge already held when the hostile-clients issue was filed, kept as regression
tests, each against the real server on 127.0.0.1 with a side client that must stay answered; and
finding 9 (no existence oracle in ``workingDirectory``)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from compat.knowledge.errors import SourceError
from compat.knowledge.sources.base import MAX_RESPONSE_BYTES
from compat.knowledge.sources.http import request_json
from tests.security.conftest import AUTH, TOKEN, WAIT, serve, side_call

pytestmark = [pytest.mark.timeout(60), pytest.mark.anyio]
CALL = {"jsonrpc": "2.0", "id": 1, "method": "acp.capabilities"}


async def rpc(port: int, body: Any, headers: dict[str, str] | None = None, raw: bytes | None = None) -> httpx.Response:
    async with httpx.AsyncClient(timeout=WAIT) as client:
        url = f"http://127.0.0.1:{port}/acp/rpc"
        if raw is not None:
            return await client.post(url, content=raw, headers={**AUTH, **(headers or {})})
        return await client.post(url, json=body, headers=headers if headers is not None else AUTH)


@pytest.mark.parametrize(
    "headers,url_token,status,code",
    [
        ({}, False, 401, -32001),
        ({"Authorization": "Bearer wrong-token-000"}, False, 401, -32001),
        ({}, True, 401, -32001),  # a token in the URL is never accepted (it ends up in logs)
        ({**AUTH, "Origin": "https://evil.example"}, False, 403, -32003),
    ],
)
async def test_who_may_call(tmp_path: Path, headers, url_token, status, code) -> None:
    async with serve(tmp_path) as port, httpx.AsyncClient(timeout=WAIT) as client:
        url = f"http://127.0.0.1:{port}/acp/rpc" + (f"?token={TOKEN}" if url_token else "")
        response = await client.post(url, json=CALL, headers=headers)
        assert await side_call(port)
    assert response.status_code == status and response.json()["error"]["code"] == code


async def test_a_cross_site_websocket_is_refused(tmp_path: Path) -> None:
    async with serve(tmp_path) as port:
        with pytest.raises(InvalidStatus) as err:
            async with connect(
                f"ws://127.0.0.1:{port}/acp", additional_headers={**AUTH, "Origin": "https://evil.example"}
            ):
                pass
        assert await side_call(port)
    assert err.value.response.status_code == 403


@pytest.mark.parametrize(
    "path", ["{root}/../../etc", "/proc/self/cwd", "{link}", "/etc", "/root/.ssh", "{root}/../absent"]
)
async def test_working_directories_outside_the_roots_get_one_message_whether_or_not_they_exist(
    tmp_path: Path, path: str
) -> None:
    (tmp_path / "link").symlink_to("/etc")
    given = path.format(root=tmp_path, link=tmp_path / "link")
    params = {"sessionId": "s", "taskPrompt": "hi", "workingDirectory": given}
    async with serve(tmp_path) as port:
        reply = (await rpc(port, {**CALL, "method": "session.start", "params": params})).json()
        assert await side_call(port)
    assert reply["error"]["code"] == -32602
    assert reply["error"]["message"] == f"workingDirectory is outside the workspace roots: {given}"


@pytest.mark.parametrize("path", ["/etc/passwd", "{root}/../../etc/passwd", "{link}", "/proc/self/environ"])
async def test_attachments_outside_the_roots_are_refused(tmp_path: Path, path: str) -> None:
    (tmp_path / "link").symlink_to("/etc/passwd")
    given = path.format(root=tmp_path, link=tmp_path / "link")
    params = {"sessionId": "s", "taskPrompt": "hi", "attachments": [{"name": "x", "path": given}]}
    async with serve(tmp_path) as port:
        reply = (await rpc(port, {**CALL, "method": "session.start", "params": params})).json()
    assert reply["error"]["code"] == -32602 and reply["error"]["data"]["field"] == "attachments.0.path"


@pytest.mark.parametrize("path", ["../../../etc/passwd", "/etc/passwd", "..", "a/../../b"])
async def test_knowledge_read_stays_inside_its_source(tmp_path: Path, path: str) -> None:
    async with serve(tmp_path) as port:
        sources = (await rpc(port, {**CALL, "method": "knowledge.sources", "params": {}})).json()["result"]
        source = sources["sources"][0]["id"]
        reply = (
            await rpc(port, {**CALL, "method": "knowledge.read", "params": {"sourceId": source, "path": path}})
        ).json()
    assert "error" in reply and reply["error"]["code"] in (-32602, -32004)
    assert "root:" not in json.dumps(reply)


@pytest.mark.parametrize(
    "raw,code",
    [
        (b"[" * 100_000, -32700),  # 100k nested brackets
        (b'{"jsonrpc":"2.0","id":1,"method":"acp.capabilities","params":{"x":"\xff\xfe"}}', -32700),  # invalid UTF-8
    ],
    ids=["nested", "bad-utf8"],
)
async def test_hostile_bodies_are_errors_and_the_bridge_goes_on(tmp_path: Path, raw: bytes, code: int) -> None:
    async with serve(tmp_path) as port:
        response = await rpc(port, None, {"Content-Type": "application/json"}, raw=raw)
        assert await side_call(port)
    assert response.json()["error"]["code"] in (code, -32600)


async def test_oversize_bodies_and_frames_and_binary_frames(tmp_path: Path) -> None:
    limit = 64 * 1024
    async with serve(tmp_path, limits={"maxMessageBytes": limit}) as port:
        big = await rpc(port, None, raw=b" " * (limit + 1))
        assert big.status_code == 413
        async with connect(f"ws://127.0.0.1:{port}/acp", additional_headers=AUTH, open_timeout=WAIT) as ws:
            await ws.send(b"\x00binary")
            with anyio.fail_after(WAIT):
                binary = json.loads(await ws.recv())
            await ws.send(json.dumps(CALL))
            with anyio.fail_after(WAIT):
                after = json.loads(await ws.recv())  # the socket stayed open
        async with connect(f"ws://127.0.0.1:{port}/acp", additional_headers=AUTH, open_timeout=WAIT) as ws:
            await ws.send("x" * (limit + 1))
            with pytest.raises(ConnectionClosed) as closed:
                with anyio.fail_after(WAIT):
                    await ws.recv()
        assert await side_call(port)
    assert binary["error"]["code"] == -32600 and after["id"] == 1
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


async def test_a_gzip_bomb_from_a_knowledge_source_is_cut_at_the_response_limit() -> None:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing; 4x the limit unpacked, built a MiB at a time
    chunk = b" " * (1024 * 1024)
    bomb = packer.compress(b"[") + b"".join(packer.compress(chunk) for _ in range(4 * MAX_RESPONSE_BYTES // len(chunk)))
    bomb += packer.compress(b"]") + packer.flush()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, content=bomb, headers={"content-encoding": "gzip", "content-type": "application/json"}
        )

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(SourceError) as err:
            await request_json(client, "GET", "http://source.test/bomb")
    assert err.value.reason == "too_large" and len(bomb) < MAX_RESPONSE_BYTES
