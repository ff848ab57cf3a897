"""Findings 1 and 7 of the hostile-clients issue, at the server's protocol level: connections
that never finish their headers are closed after ``headerTimeout``; connections are capped, and
those without a valid token lower; a client dropped for not reading loses its socket too.

Scaled down from the thousands the findings needed: the test config lowers the limits, and a
client that authenticated before the attack must still be answered."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest

from tests.bridge.conftest import Handlers, make_config, request
from tests.bridge.test_real_uvicorn import TOKEN as RAW_WS_TOKEN
from tests.bridge.test_real_uvicorn import raw_ws, ws_frame
from tests.helpers import real_server
from tests.security.conftest import AUTH, WAIT, serve, side_call

pytestmark = [pytest.mark.timeout(60), pytest.mark.anyio]


async def half_request(port: int) -> anyio.abc.SocketStream:
    stream = await anyio.connect_tcp("127.0.0.1", port)
    await stream.send(b"POST /acp/rp")  # half a request line, then nothing
    return stream


async def read_all(stream: anyio.abc.SocketStream) -> bytes:
    data = b""
    try:
        while True:
            data += await stream.receive()
    except (anyio.EndOfStream, anyio.BrokenResourceError):
        return data


async def test_a_connection_without_complete_headers_is_closed_after_the_header_timeout(tmp_path: Path) -> None:
    async with serve(tmp_path, timeouts={"headerTimeout": 0.5}) as port:
        stalled = [await half_request(port) for _ in range(10)]
        with anyio.fail_after(WAIT):
            answers = [await read_all(s) for s in stalled]  # EOF: the bridge closed them
        assert await side_call(port)
    assert answers == [b""] * 10


CAPS = {"jsonrpc": "2.0", "id": 1, "method": "acp.capabilities"}


async def refused_while_held(port: int, held: int) -> tuple[bytes, int]:
    """A client connects and is served; ``held`` connections then hold a slot each; what a new
    connection gets back, and the status the first client's kept-alive connection still gets."""
    url = f"http://127.0.0.1:{port}/acp/rpc"
    async with httpx.AsyncClient(timeout=WAIT, limits=httpx.Limits(max_connections=1)) as valid:
        assert (await valid.post(url, json=CAPS, headers=AUTH)).status_code == 200  # its connection is in
        holders = [await half_request(port) for _ in range(held)]
        refused = await anyio.connect_tcp("127.0.0.1", port)
        await refused.send(b"GET /api/ping HTTP/1.1\r\nHost: x\r\n\r\n")
        with anyio.fail_after(WAIT):
            answer = await read_all(refused)
        again = await valid.post(url, json=CAPS, headers=AUTH)
        for holder in holders:
            await holder.aclose()
    return answer, again.status_code


async def test_past_max_connections_a_new_one_gets_503_while_a_client_already_in_is_served(tmp_path: Path) -> None:
    limits = {"maxConnections": 8, "maxUnauthenticatedConnections": 100}
    async with serve(tmp_path, limits=limits, timeouts={"headerTimeout": 30}) as port:
        answer, again = await refused_while_held(port, 7)
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503")
    error = json.loads(payload)["error"]
    assert error["code"] == -32006 and error["data"]["limit"] == "maxConnections"
    assert again == 200


async def test_connections_without_a_valid_token_are_capped_lower(tmp_path: Path) -> None:
    limits = {"maxConnections": 100, "maxUnauthenticatedConnections": 4}
    async with serve(tmp_path, limits=limits, timeouts={"headerTimeout": 30}) as port:
        answer, again = await refused_while_held(port, 4)
        with anyio.fail_after(WAIT):  # once they are gone, new connections are taken again
            while True:
                try:
                    async with httpx.AsyncClient(timeout=WAIT) as fresh:
                        url = f"http://127.0.0.1:{port}/acp/rpc"
                        if (await fresh.post(url, json=CAPS, headers=AUTH)).status_code == 200:
                            break
                except httpx.HTTPError:
                    pass
                await anyio.sleep(0.05)  # polling the server's state: bounded by fail_after
    assert b"maxUnauthenticatedConnections" in answer and answer.startswith(b"HTTP/1.1 503")
    assert again == 200


async def test_a_dropped_slow_websocket_client_loses_its_socket_within_seconds() -> None:
    handlers = Handlers()
    config = make_config(auth_tokens=[RAW_WS_TOKEN], limits={"max_connection_queue": 64})
    from bridge.http_app import create_app

    app = create_app(config, handlers.dispatcher())
    async with real_server(config, app) as port:
        stuck = await raw_ws(port)  # reads nothing from here on
        await stuck.send(ws_frame(json.dumps(request("test.stream", {"n": 200_000, "size": 4096}, 1))))
        with anyio.fail_after(WAIT):
            await handlers.event("stream-cancelled").wait()  # dropped
        async with httpx.AsyncClient(timeout=WAIT) as side:  # another client is answered meanwhile
            headers = {"Authorization": f"Bearer {RAW_WS_TOKEN}"}
            echoed = await side.post(
                f"http://127.0.0.1:{port}/acp/rpc", json=request("test.echo", {"k": 1}), headers=headers
            )
        assert echoed.json()["result"] == {"k": 1}
        with anyio.fail_after(WAIT):  # aborted 5 s after the drop, whatever it had queued
            while app.connections.open:
                await anyio.sleep(0.1)  # polling the server's count: bounded by fail_after
        await stuck.aclose()


async def test_a_slow_request_behind_a_local_proxy_is_not_cut_off_by_the_header_timeout(tmp_path: Path) -> None:
    """The header timer stops when the app sees the request, found by the TCP peer's address: a
    proxy's X-Forwarded-For must not hide it (the turn below outlasts the header timeout)."""
    async with serve(tmp_path, timeouts={"headerTimeout": 0.2}) as port, httpx.AsyncClient(timeout=WAIT) as client:
        body = {"jsonrpc": "2.0", "id": 1, "method": "session.start", "params": {"sessionId": "p", "taskPrompt": "hi"}}
        headers = {**AUTH, "X-Forwarded-For": "203.0.113.7"}
        answer = await client.post(f"http://127.0.0.1:{port}/acp/rpc", json=body, headers=headers)
        again = await client.post(f"http://127.0.0.1:{port}/acp/rpc", json=CAPS, headers=AUTH)  # kept alive
    assert answer.json()["result"]["status"] == "completed" and again.status_code == 200
