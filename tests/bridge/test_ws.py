"""``GET /acp`` in-process (Starlette TestClient, and a scripted fake socket for the failure paths),
plus the frame-size limit under a real uvicorn (docs/api.md "WebSocket"; field-failures #1, #2,
#4, #5, #6, #7, #8)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from starlette.testclient import WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect, WebSocketDisconnected
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosedError

import bridge.ws
from bridge.http_app import create_app
from bridge.ws import Connection

from .conftest import WAIT, Handlers, TestClient, make_config, real_server, request

pytestmark = pytest.mark.timeout(30)

TOKEN = "tok-ws-123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def http(handlers: Handlers) -> TestClient:
    app = create_app(make_config(auth_tokens=[{"name": "desk", "token": TOKEN}]), handlers.dispatcher())
    with TestClient(app) as client:
        yield client


def send(ws: Any, message: Any) -> None:
    ws.send_text(json.dumps(message))


# ---- frames --------------------------------------------------------------------------------------


def test_a_request_is_answered_on_the_socket(http):
    with http.websocket_connect("/acp", headers=AUTH) as ws:
        send(ws, request("test.echo", {"a": 1}, "x"))
        reply = ws.receive_json()
    assert reply["id"] == "x" and reply["result"] == {"a": 1} and reply["seq"] == 0


def test_a_binary_frame_gets_invalid_request_and_the_socket_stays_open(http):
    with http.websocket_connect("/acp", headers=AUTH) as ws:
        ws.send_bytes(json.dumps(request("test.echo", None, 1)).encode())
        error = ws.receive_json()
        send(ws, request("test.echo", None, 2))
        after = ws.receive_json()
    assert error["id"] is None and error["error"]["code"] == -32600
    assert after["id"] == 2 and "result" in after


def test_an_empty_text_frame_gets_parse_error_and_the_socket_stays_open(http):
    with http.websocket_connect("/acp", headers=AUTH) as ws:
        ws.send_text("")
        error = ws.receive_json()
        send(ws, request("test.echo", None, 2))
        after = ws.receive_json()
    assert error["id"] is None and error["error"]["code"] == -32700
    assert after["id"] == 2


def test_a_slow_request_does_not_block_a_fast_one_on_the_same_socket(http):
    with http.websocket_connect("/acp", headers=AUTH) as ws:
        send(ws, request("test.slow", {"gate": "s"}, 1))
        send(ws, request("test.echo", {"fast": True}, 2))
        first = ws.receive_json()
        send(ws, request("test.release", {"gate": "s"}, 3))
        rest = {ws.receive_json()["id"] for _ in range(2)}
    assert first["id"] == 2
    assert rest == {1, 3}


def test_notifications_and_replies_share_one_seq_counter_per_connection(http):
    with http.websocket_connect("/acp", headers=AUTH) as ws:
        send(ws, request("test.stream", {"n": 3}, 1))
        frames = [ws.receive_json() for _ in range(4)]
        send(ws, request("test.echo", None, 2))
        frames.append(ws.receive_json())
    assert [f["seq"] for f in frames] == [0, 1, 2, 3, 4]
    assert [f.get("method") for f in frames[:3]] == ["test.tick"] * 3
    assert frames[3]["id"] == 1 and frames[4]["id"] == 2


def test_batches_follow_json_rpc_on_the_socket(http):
    with http.websocket_connect("/acp", headers=AUTH) as ws:
        ws.send_text("[]")
        empty = ws.receive_json()
        send(ws, [request("test.record", None, None), request("nope", None, None)])
        send(ws, request("nope.notify", None, None))
        send(ws, [request("test.echo", {"b": 1}, 5), {"foo": "bar"}])
        batch = ws.receive_json()  # nothing was sent for the notifications before it
    assert isinstance(empty, dict) and empty["error"]["code"] == -32600
    assert sorted(r["id"] or 0 for r in batch) == [0, 5]


def test_the_principal_is_the_token_name(http):
    with http.websocket_connect("/acp", headers=AUTH) as ws:
        send(ws, request("test.whoami", None, 1))
        assert ws.receive_json()["result"] == {"principal": "desk"}


# ---- admission -----------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Origin": "http://localhost:5173"}])
def test_a_missing_or_wrong_token_refuses_the_upgrade_with_401_json(http, headers):
    with pytest.raises(WebSocketDenialResponse) as info:
        http.websocket_connect("/acp", headers=headers).__enter__()
    assert info.value.status_code == 401
    assert info.value.headers["content-type"] == "application/json"
    body = info.value.json()
    assert body["id"] is None and body["error"]["code"] == -32001


@pytest.mark.parametrize("origin", ["https://evil.example", "http://localhost.evil.example", "null"])
def test_a_disallowed_origin_refuses_the_upgrade_with_403_json_before_the_token(http, origin):
    with pytest.raises(WebSocketDenialResponse) as info:
        http.websocket_connect("/acp", headers={"Origin": origin}).__enter__()
    assert info.value.status_code == 403
    assert info.value.json()["error"]["code"] == -32003


def test_an_allowed_origin_with_a_token_is_accepted(http):
    with http.websocket_connect("/acp", headers={"Origin": "http://localhost:5173", **AUTH}) as ws:
        send(ws, request("test.echo", None, 1))
        assert ws.receive_json()["id"] == 1


def test_a_browser_may_send_the_token_as_a_bearer_subprotocol(http):
    with http.websocket_connect("/acp", subprotocols=[f"bearer.{TOKEN}"]) as ws:
        send(ws, request("test.whoami", None, 1))
        assert ws.receive_json()["result"] == {"principal": "desk"}
        assert ws.accepted_subprotocol == f"bearer.{TOKEN}"


def test_no_subprotocol_is_chosen_when_the_header_carries_the_token(http):
    with http.websocket_connect("/acp", headers=AUTH) as ws:
        assert ws.accepted_subprotocol is None


def test_a_token_in_the_url_is_not_accepted(http):
    with pytest.raises(WebSocketDenialResponse) as info:
        http.websocket_connect(f"/acp?token={TOKEN}").__enter__()
    assert info.value.status_code == 401


# ---- failure paths over a scripted socket --------------------------------------------------------


class FakeSocket:
    """Just enough of Starlette's WebSocket for ``Connection``: scripted frames in, sends recorded.

    Args:
        stall: sends never complete (a client that stopped reading).
        fail_with: sends raise this (a peer that left).
        hold: sends wait until this event is set (``holding`` is set once one waits).
    """

    def __init__(
        self, *, stall: bool = False, fail_with: BaseException | None = None, hold: anyio.Event | None = None
    ) -> None:
        self.inbound_tx, self._inbound = anyio.create_memory_object_stream[dict](100)
        self.sent: list[dict] = []
        self.wrote = anyio.Event()
        self.holding = anyio.Event()
        self.stall, self.fail_with, self.hold = stall, fail_with, hold

    def frame(self, message: Any) -> None:
        self.inbound_tx.send_nowait({"type": "websocket.receive", "text": json.dumps(message)})

    def disconnect(self) -> None:
        self.inbound_tx.send_nowait({"type": "websocket.disconnect", "code": 1001})

    async def receive(self) -> dict:
        return await self._inbound.receive()

    async def send(self, message: dict) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        if self.stall:
            await anyio.sleep_forever()
        if self.hold is not None and not self.hold.is_set():  # a full socket buffer, until released
            self.holding.set()
            await self.hold.wait()
        self.sent.append(message)
        self.wrote.set()

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        await self.send({"type": "websocket.close", "code": code})


async def test_closing_the_socket_cancels_in_flight_requests(handlers):
    sock = FakeSocket()
    sock.frame(request("test.slow", {"gate": "never"}, 1))
    connection = Connection(sock, handlers.dispatcher(), "local", queue_size=8)
    async with anyio.create_task_group() as tg:
        tg.start_soon(connection.run)
        with anyio.fail_after(WAIT):
            await handlers.event("started:never").wait()
            sock.disconnect()
            await handlers.event("slow-cancelled").wait()
    assert handlers.cancelled == ["slow"]


async def test_a_client_that_stops_reading_is_dropped_without_stalling_the_producer(handlers, monkeypatch):
    monkeypatch.setattr(bridge.ws, "CLOSE_TIMEOUT", 0.05)
    sock = FakeSocket(stall=True)
    sock.frame(request("test.stream", {"n": 10_000}, 1))
    connection = Connection(sock, handlers.dispatcher(), "local", queue_size=8)
    with anyio.fail_after(WAIT):
        await connection.run()  # returns: the overflow dropped the client
    assert handlers.cancelled == ["stream"]  # the producer was cancelled, never blocked on the socket


def burst_on_a_held_socket(handlers: Handlers, n: int, queue_size: int) -> tuple[FakeSocket, anyio.Event, Connection]:
    """A connection whose first send waits for the returned event while a burst of ``n``
    notifications (then the reply) is produced behind it."""
    hold = anyio.Event()
    sock = FakeSocket(hold=hold)
    sock.frame(request("test.stream", {"n": n, "burst": True}, 1))
    return sock, hold, Connection(sock, handlers.dispatcher(), "local", queue_size=queue_size)


async def test_overflow_sends_close_1013_when_the_socket_can_still_write(handlers):
    sock, hold, connection = burst_on_a_held_socket(handlers, 4, queue_size=2)  # the rest is queued
    async with anyio.create_task_group() as tg:
        tg.start_soon(connection.run)
        with anyio.fail_after(WAIT):
            await sock.holding.wait()
            hold.set()  # the socket can write again: the close frame goes out
    assert sock.sent[-1] == {"type": "websocket.close", "code": 1013}


async def test_updates_go_out_in_order_while_a_send_waits_for_the_socket(handlers):
    """A send that has to wait for the socket hands over to the writer: what is produced
    meanwhile is queued and follows it, in ``seq`` order."""
    sock, hold, connection = burst_on_a_held_socket(handlers, 5, queue_size=8)
    async with anyio.create_task_group() as tg:
        tg.start_soon(connection.run)
        with anyio.fail_after(WAIT):
            await sock.holding.wait()
            await anyio.wait_all_tasks_blocked()  # the send is still waiting when the rest is queued
            hold.set()
            while len(sock.sent) < 6:  # five updates and the reply
                await sock.wrote.wait()
                sock.wrote = anyio.Event()
        sock.disconnect()
    sent = [json.loads(m["text"]) for m in sock.sent]
    assert [m["seq"] for m in sent] == list(range(6))
    assert [m.get("params", {}).get("i") for m in sent[:5]] == list(range(5)) and sent[5]["id"] == 1


@pytest.mark.parametrize(
    "error",
    [
        WebSocketDisconnected("gone"),
        WebSocketDisconnect(1006),
        OSError("reset"),
        RuntimeError("Unexpected ASGI message 'websocket.send', after sending 'websocket.close'."),
    ],
)
async def test_a_send_after_the_peer_left_stops_quietly(handlers, error):
    sock = FakeSocket(fail_with=error)
    sock.frame(request("test.slow", {"gate": "g2"}, 1))
    sock.frame(request("test.echo", None, 2))
    connection = Connection(sock, handlers.dispatcher(), "local", queue_size=8)
    with anyio.fail_after(WAIT):
        await connection.run()  # no exception escapes, the connection ends
    assert handlers.cancelled == ["slow"]


async def test_notifications_after_the_connection_ended_are_dropped_silently(handlers):
    sock = FakeSocket()
    sock.frame(request("test.echo", None, 1))
    connection = Connection(sock, handlers.dispatcher(), "local", queue_size=8)
    async with anyio.create_task_group() as tg:
        tg.start_soon(connection.run)
        with anyio.fail_after(WAIT):
            await sock.wrote.wait()  # the reply went out
        sock.disconnect()
    sent = len(sock.sent)
    handlers.contexts[0].notify("session.update", {"late": True})  # a turn outliving the socket
    assert len(sock.sent) == sent


# ---- frame size (needs uvicorn: ws_max_size) -----------------------------------------------------


async def test_a_frame_over_the_limit_closes_only_that_socket_with_1009(handlers):
    config = make_config(auth_tokens=[TOKEN], limits={"max_message_bytes": 1024})
    app = create_app(config, handlers.dispatcher())
    async with real_server(config, app) as port:
        url, headers = f"ws://127.0.0.1:{port}/acp", {"Authorization": f"Bearer {TOKEN}"}
        with anyio.fail_after(WAIT):
            async with (
                connect(url, additional_headers=headers) as other,
                connect(url, additional_headers=headers) as ws,
            ):
                await ws.send(json.dumps(request("test.echo", {"p": "x" * 2000}, 1)))
                with pytest.raises(ConnectionClosedError) as info:
                    await ws.recv()
                await other.send(json.dumps(request("test.echo", {"p": "x" * 900}, 2)))
                reply = json.loads(await other.recv())
    assert info.value.rcvd is not None and info.value.rcvd.code == 1009
    assert reply["id"] == 2


async def test_seq_stays_in_wire_order_when_an_inline_reply_meets_a_slow_socket(handlers):
    """Inline methods are answered by the reader, everything else by tasks; all of it leaves
    through the one writer, so when the socket stalls with both queued the envelopes still leave
    in ``seq`` order."""
    from bridge.dispatch import Dispatcher, Method

    def capabilities(params: dict, ctx: Any) -> dict:
        return {"ok": True}

    hold = anyio.Event()
    sock = FakeSocket(hold=hold)
    methods = [Method("acp.capabilities", capabilities, inline=True), Method("test.stream", handlers.stream)]
    connection = Connection(sock, Dispatcher(methods), "local", queue_size=100)
    sock.frame(request("acp.capabilities", None, 1))
    sock.frame(request("test.stream", {"n": 3, "burst": True}, 2))
    sock.frame(request("acp.capabilities", None, 3))
    async with anyio.create_task_group() as tg:
        tg.start_soon(connection.run)
        with anyio.fail_after(WAIT):
            await sock.holding.wait()
            await anyio.wait_all_tasks_blocked()
            hold.set()
            while len(sock.sent) < 6:  # two capabilities replies, three notifications, one reply
                await sock.wrote.wait()
                sock.wrote = anyio.Event()
        sock.disconnect()
    sent = [json.loads(m["text"]) for m in sock.sent]
    assert [m["seq"] for m in sent] == list(range(6))
