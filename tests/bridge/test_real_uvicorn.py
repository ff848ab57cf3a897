"""A few behaviours that only a real uvicorn on 127.0.0.1 shows: denial responses on the wire,
a slow consumer dropped while another client carries on, keep-alive pings, SSE keep-alive
comments, early 413, and SIGTERM → exit 0 (field-failures #5, #6, #7, #8)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from typing import Any

import anyio
import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from bridge.auth import ExposureError
from bridge.http_app import create_app
from bridge.server import run

from .conftest import WAIT, Handlers, make_config, real_server, request

pytestmark = pytest.mark.timeout(60)

TOKEN = "tok-real-123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def ws_frame(text: str) -> bytes:
    """One masked client text frame (RFC 6455 §5.2); the mask is zero, which is allowed."""
    payload = text.encode()
    n = len(payload)
    length = (
        bytes([0x80 | n])
        if n < 126
        else bytes([0x80 | 126]) + n.to_bytes(2, "big")
        if n < 65536
        else bytes([0x80 | 127]) + n.to_bytes(8, "big")
    )
    return b"\x81" + length + b"\x00\x00\x00\x00" + payload


async def raw_ws(port: int) -> anyio.abc.SocketStream:
    """A raw TCP WebSocket client: handshake done, then entirely under the test's control."""
    stream = await anyio.connect_tcp("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    await stream.send(
        f"GET /acp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += await stream.receive(1)  # byte by byte: leave any frame after the head unread
    assert head.startswith(b"HTTP/1.1 101"), head
    return stream


async def read_frames(stream: anyio.abc.SocketStream) -> tuple[int, int | None]:
    """Reads server frames (unmasked, RFC 6455 §5.2) until a close frame or EOF.

    Returns:
        (payload bytes read, the close code or None when the connection just ended).
    """
    buf, total = bytearray(), 0

    async def need(n: int) -> None:
        while len(buf) < n:
            buf.extend(await stream.receive())

    try:
        while True:
            await need(2)
            opcode, n, head = buf[0] & 0x0F, buf[1] & 0x7F, 2
            if n >= 126:
                head = 4 if n == 126 else 10
                await need(head)
                n = int.from_bytes(buf[2:head], "big")
            await need(head + n)
            payload = bytes(buf[head : head + n])
            del buf[: head + n]
            total += n
            if opcode == 0x8:
                return total, int.from_bytes(payload[:2], "big")
    except (anyio.EndOfStream, anyio.BrokenResourceError):
        return total, None


async def read_to_eof(stream: anyio.abc.SocketStream) -> bytes:
    data = bytearray()
    try:
        while True:
            data += await stream.receive()
    except (anyio.EndOfStream, anyio.BrokenResourceError):
        return bytes(data)


def app_for(handlers: Handlers, **config: Any) -> tuple[Any, Any]:
    config.setdefault("auth_tokens", [TOKEN])
    cfg = make_config(**config)
    return cfg, create_app(cfg, handlers.dispatcher())


@pytest.mark.parametrize(
    ("headers", "status", "code"), [({}, 401, -32001), ({"Origin": "https://evil.example"}, 403, -32003)]
)
async def test_a_refused_upgrade_answers_the_status_with_a_json_body(handlers, headers, status, code, caplog):
    with caplog.at_level("INFO"):
        async with real_server(*app_for(handlers)) as port:
            with anyio.fail_after(WAIT), pytest.raises(InvalidStatus) as info:
                async with connect(f"ws://127.0.0.1:{port}/acp", additional_headers=headers):
                    pass
    response = info.value.response
    assert response.status_code == status
    assert json.loads(response.body)["error"]["code"] == code
    # uvicorn's websockets-sansio logs a refusal as an incomplete handshake (Kludex/uvicorn#3138)
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


async def test_requests_on_one_socket_run_concurrently(handlers):
    async with real_server(*app_for(handlers)) as port:
        with anyio.fail_after(WAIT):
            async with connect(f"ws://127.0.0.1:{port}/acp", additional_headers=AUTH) as ws:
                await ws.send(json.dumps(request("test.slow", {"gate": "r"}, 1)))
                await ws.send(json.dumps(request("test.echo", None, 2)))
                first = json.loads(await ws.recv())
                await ws.send(json.dumps(request("test.release", {"gate": "r"}, 3)))
                rest = {json.loads(await ws.recv())["id"], json.loads(await ws.recv())["id"]}
    assert first["id"] == 2 and rest == {1, 3}


async def test_a_slow_consumer_is_dropped_without_stalling_another_client(handlers):
    cfg, app = app_for(handlers, limits={"max_connection_queue": 64})
    async with real_server(cfg, app) as port:
        stuck = await raw_ws(port)
        await stuck.send(ws_frame(json.dumps(request("test.stream", {"n": 200_000, "size": 1024}, 1))))
        with anyio.fail_after(WAIT * 2):
            async with connect(f"ws://127.0.0.1:{port}/acp", additional_headers=AUTH) as ws:
                await ws.send(json.dumps(request("test.stream", {"n": 500}, 7)))
                frames = [json.loads(await ws.recv()) for _ in range(501)]
                await handlers.event("stream-cancelled").wait()  # the stuck client's producer
                await ws.send(json.dumps(request("test.echo", None, 8)))
                after = json.loads(await ws.recv())
            # The stuck client finally reads: what was buffered, then close 1013 if the close frame
            # could leave within CLOSE_TIMEOUT, else just EOF.
            drained, code = await read_frames(stuck)
            if code is not None:
                await stuck.send(b"\x88\x82\x00\x00\x00\x00" + code.to_bytes(2, "big"))  # close reply
                await read_to_eof(stuck)
    assert [f["seq"] for f in frames] == list(range(501)) and frames[-1]["id"] == 7
    assert after["id"] == 8
    assert handlers.cancelled == ["stream"]
    assert code in (None, 1013)
    assert drained < 64 * 1024 * 1024  # bounded: nowhere near the 200 MB it asked for


@pytest.mark.parametrize("burst", [False, True], ids=["paced", "burst"])
async def test_a_result_larger_than_the_queue_bound_reaches_a_client_that_reads(handlers, burst):
    """A turn's result carries its output twice (``result`` and ``payload``): with output near
    ``maxOutputBytes`` one envelope passed ``maxConnectionQueueBytes`` and a client reading as fast
    as it could was dropped (1013) instead of getting its result."""
    bound = 256 * 1024
    cfg, app = app_for(handlers, limits={"max_connection_queue_bytes": bound, "max_message_bytes": 4 * bound})
    big = "r" * (bound // 2 + 1000)  # the echoed envelope holds it twice: past the bound
    async with real_server(cfg, app) as port:
        with anyio.fail_after(WAIT):
            async with connect(f"ws://127.0.0.1:{port}/acp", additional_headers=AUTH, max_size=None) as ws:
                await ws.send(json.dumps(request("test.stream", {"n": 50, "size": 1024, "burst": burst}, 1)))
                await ws.send(json.dumps(request("test.echo", {"big": big}, 2)))
                frames = [json.loads(await ws.recv()) for _ in range(52)]
    replies = {f["id"]: f for f in frames if "id" in f}
    assert replies[2]["result"] == {"big": big} and replies[1]["result"] == {"sent": 50}


async def test_an_sse_client_that_stops_reading_is_dropped(handlers):
    cfg, app = app_for(handlers, limits={"max_connection_queue": 64})
    body = json.dumps(request("test.stream", {"n": 200_000, "size": 1024}, 1)).encode()
    async with real_server(cfg, app) as port:
        stuck = await anyio.connect_tcp("127.0.0.1", port)
        await stuck.send(
            f"POST /acp/rpc HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Accept: text/event-stream\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        with anyio.fail_after(WAIT):
            await handlers.event("stream-cancelled").wait()  # never blocked on the stuck client
        await stuck.aclose()
    assert handlers.cancelled == ["stream"]


async def test_a_socket_that_never_answers_pings_is_dropped(handlers):
    cfg, app = app_for(handlers, ws_ping_interval=0.1, ws_ping_timeout=0.1)
    async with real_server(cfg, app) as port:
        silent = await raw_ws(port)
        with anyio.fail_after(WAIT):
            data = await read_to_eof(silent)
    assert data.startswith(b"\x89")  # a ping came first
    assert b"\x88" in data and (1011).to_bytes(2, "big") in data  # then close 1011 (ping timeout)


async def test_an_idle_sse_stream_gets_keep_alive_comments(handlers):
    cfg, app = app_for(handlers, sse_keepalive=0.05)
    headers = {"Accept": "text/event-stream", **AUTH}
    async with real_server(cfg, app) as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        with anyio.fail_after(WAIT):
            body = request("test.slow", {"gate": "k"}, 1)
            async with http.stream("POST", "/acp/rpc", json=body, headers=headers) as response:
                lines = response.aiter_lines()
                async for line in lines:
                    if line.startswith(":"):
                        break
                await http.post("/acp/rpc", json=request("test.release", {"gate": "k"}, 2), headers=AUTH)
                data = [line async for line in lines if line.startswith("data: ")]
    assert json.loads(data[0][len("data: ") :])["result"] == {"released": True}
    assert data[-1] == "data: [DONE]"


async def test_an_sse_client_that_disconnects_cancels_its_request(handlers):
    cfg, app = app_for(handlers)
    headers = {"Accept": "text/event-stream", **AUTH}
    async with real_server(cfg, app) as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        with anyio.fail_after(WAIT):
            body = request("test.slow", {"gate": "d"}, 1)
            async with http.stream("POST", "/acp/rpc", json=body, headers=headers):
                await handlers.event("started:d").wait()
            await handlers.event("slow-cancelled").wait()


async def test_a_notification_is_answered_204_before_it_finishes(handlers):
    cfg, app = app_for(handlers)
    async with real_server(cfg, app) as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        with anyio.fail_after(WAIT):
            response = await http.post("/acp/rpc", json=request("test.slow", {"gate": "b"}, None), headers=AUTH)
            await handlers.event("started:b").wait()
            await http.post("/acp/rpc", json=request("test.release", {"gate": "b"}), headers=AUTH)
    assert response.status_code == 204


async def test_a_large_body_is_refused_with_413_from_its_content_length(handlers):
    cfg, app = app_for(handlers, limits={"max_message_bytes": 1024 * 1024})
    async with real_server(cfg, app) as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        with anyio.fail_after(WAIT):
            response = await http.post("/acp/rpc", content=b" " * (10 * 1024 * 1024), headers=AUTH)
            ok = await http.post("/acp/rpc", json=request("test.echo", None, 1), headers=AUTH)
    assert response.status_code == 413 and response.json()["error"]["code"] == -32600
    assert ok.status_code == 200


def test_run_refuses_a_public_bind_without_a_token(handlers):
    cfg = make_config(host="0.0.0.0")
    with pytest.raises(ExposureError):
        run(cfg, create_app(cfg, handlers.dispatcher()))


RUN_SCRIPT = """
from bridge.logs import configure; configure("info")
from bridge.config import BridgeConfig
from bridge.dispatch import Dispatcher
from bridge.http_app import create_app
from bridge.server import run

config = BridgeConfig(port=0, log_level="info")
run(config, create_app(config, Dispatcher(())))
print("after run", flush=True)
"""

# The wiring the CLI can use: the dispatcher exists only inside the orchestrator's context.
SERVE_SCRIPT = """
import contextlib, anyio
from bridge.logs import configure; configure("info")
from bridge.config import BridgeConfig
from bridge.dispatch import Dispatcher
from bridge.http_app import create_app
from bridge.server import serve

@contextlib.asynccontextmanager
async def orchestrator():
    yield Dispatcher(())
    print("after run", flush=True)

async def main():
    config = BridgeConfig(port=0, log_level="info")
    async with orchestrator() as dispatcher:
        await serve(config, create_app(config, dispatcher))

anyio.run(main)
"""


@pytest.mark.parametrize("script", [RUN_SCRIPT, SERVE_SCRIPT], ids=["run", "serve"])
def test_sigterm_shuts_down_gracefully_and_exits_0(script):
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:  # bounded by the module timeout
            if "Application startup complete" in line:
                break
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT * 2) == 0
        assert proc.stdout.read() == "after run\n"  # shutdown ran to the end
    finally:
        proc.kill()
        proc.wait()
