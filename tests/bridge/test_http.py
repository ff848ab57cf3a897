"""HTTP routes in-process (httpx.ASGITransport, Starlette TestClient): status codes and their
order, CORS, size limits, 204 for notifications, SSE framing (docs/api.md "HTTP";
xworkmate-original.md §3.2-§3.6; field-failures #1, #6, #8)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest

import bridge
import bridge.http_app
from bridge.config import token_principal
from bridge.http_app import create_app, image_info

from .conftest import WAIT, Handlers, TestClient, make_config, request

ORIGIN = "http://localhost:5173"
TOKEN = "tok-http-123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SSE = {"Accept": "text/event-stream, application/json", **AUTH}
HEX = "0123456789abcdef0123456789abcdef01234567"


@asynccontextmanager
async def client(handlers: Handlers, **config: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process client; the app's lifespan runs around it, as under uvicorn."""
    config.setdefault("auth_tokens", [TOKEN])
    bind_host = config.pop("bind_host", None)
    app = create_app(make_config(**config), handlers.dispatcher(), bind_host=bind_host)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            with anyio.fail_after(WAIT):
                yield http


def envelope(response: httpx.Response) -> dict[str, Any]:
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


def sse_events(text: str) -> list[Any]:
    """The ``data:`` payloads of an SSE body, in order (``[DONE]`` kept as a string)."""
    events = []
    for block in text.split("\n\n"):
        data = [line[len("data: ") :] for line in block.split("\n") if line.startswith("data: ")]
        if data:
            payload = "\n".join(data)
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


# ---- plain routes --------------------------------------------------------------------------------


async def test_the_root_answers_the_banner_as_plain_text(handlers):
    async with client(handlers) as http:
        response = await http.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert response.text == "xworkmate-bridge is running"


async def test_ping_without_image_reports_the_package_version(handlers, monkeypatch):
    monkeypatch.delenv("IMAGE", raising=False)
    async with client(handlers) as http:
        response = await http.get("/api/ping")
    assert response.status_code == 200
    expected = {"status": "ok", "image": "", "tag": "", "commit": "", "version": bridge.__version__}
    assert {k: v for k, v in response.json().items() if k != "buildDate"} == expected


async def test_ping_parses_the_image_variable_and_needs_no_token(handlers, monkeypatch):
    monkeypatch.setenv("IMAGE", f"ghcr.io/x-evor/xworkmate-bridge:{HEX}")
    async with client(handlers) as http:
        body = (await http.get("/api/ping")).json()
    assert body.pop("buildDate")
    assert body == {
        "status": "ok",
        "image": f"ghcr.io/x-evor/xworkmate-bridge:{HEX}",
        "tag": HEX,
        "commit": HEX,
        "version": HEX,
    }


@pytest.mark.parametrize(
    ("image", "tag", "commit"),
    [
        ("ghcr.io/x/bridge:main-2026-04-12", "main-2026-04-12", ""),
        (f"ghcr.io/x/bridge:{HEX}@sha256:{'a' * 64}", HEX, HEX),
        ("ghcr.io/x/bridge@sha256:abc", "", ""),
        ("localhost:5000/bridge", "", ""),
        ("localhost:5000/bridge:v1.2", "v1.2", ""),
        (f"bridge:{HEX.upper()}", HEX.upper(), ""),
    ],
)
def test_image_tags_and_commits_are_parsed_as_the_original_does(image, tag, commit):
    info = image_info(image)
    assert set(info) == {"status", "image", "tag", "commit", "version"}
    assert (info["tag"], info["commit"], info["version"]) == (tag, commit, tag)


async def test_an_unknown_path_is_404_with_a_json_envelope(handlers):
    async with client(handlers) as http:
        response = await http.get("/nope")
    assert response.status_code == 404
    assert envelope(response)["error"]["code"] == -32004


# ---- /acp/rpc: statuses and their order ----------------------------------------------------------


async def test_options_is_204_with_cors_headers_for_an_allowed_origin(handlers):
    async with client(handlers) as http:
        response = await http.options("/acp/rpc", headers={"Origin": ORIGIN})
    assert response.status_code == 204
    assert response.headers["access-control-allow-origin"] == ORIGIN
    assert response.headers["access-control-allow-methods"] == "POST, OPTIONS"
    assert response.headers["access-control-allow-headers"] == "Authorization, Content-Type, Accept"
    assert response.headers["access-control-max-age"] == "600"
    assert response.headers["vary"] == "Origin"


@pytest.mark.parametrize("headers", [{"Origin": "https://evil.example"}, {"Origin": "null"}, {}])
async def test_options_is_204_without_cors_headers_otherwise(handlers, headers):
    async with client(handlers) as http:
        response = await http.options("/acp/rpc", headers=headers)
    assert response.status_code == 204
    assert not any(name.startswith("access-control-") for name in response.headers)


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
async def test_other_methods_are_405_with_an_invalid_request_envelope(handlers, method):
    async with client(handlers) as http:
        response = await http.request(method, "/acp/rpc", headers={"Origin": "https://evil.example"})
    assert response.status_code == 405
    assert response.headers["allow"] == "POST, OPTIONS"
    body = envelope(response)
    assert body["id"] is None and body["error"]["code"] == -32600


@pytest.mark.parametrize("origin", ["https://evil.example", "http://localhost.evil.example", "null"])
async def test_a_disallowed_origin_is_403_before_anything_runs(handlers, origin):
    async with client(handlers) as http:
        response = await http.post("/acp/rpc", json=request("test.record"), headers={"Origin": origin, **AUTH})
    assert response.status_code == 403
    assert envelope(response)["error"]["code"] == -32003
    assert handlers.calls == []


async def test_cors_headers_go_on_every_response_to_an_allowed_origin(handlers):
    async with client(handlers) as http:
        ok = await http.post("/acp/rpc", json=request("test.echo"), headers={"Origin": ORIGIN, **AUTH})
        denied = await http.post("/acp/rpc", json=request("test.echo"), headers={"Origin": ORIGIN})
    for response in (ok, denied):
        assert response.headers["access-control-allow-origin"] == ORIGIN
        assert response.headers["vary"] == "Origin"
    assert (ok.status_code, denied.status_code) == (200, 401)


async def test_check_order_is_origin_then_token_then_size_then_json(handlers):
    big = b"x" * 2048
    async with client(handlers, limits={"max_message_bytes": 1024}) as http:
        evil = await http.post("/acp/rpc", content=big, headers={"Origin": "https://evil.example"})
        no_token = await http.post("/acp/rpc", content=big, headers={"Origin": ORIGIN})
        too_big = await http.post("/acp/rpc", content=big, headers={"Origin": ORIGIN, **AUTH})
        bad_json = await http.post("/acp/rpc", content=b"{not json", headers={"Origin": ORIGIN, **AUTH})
    assert [r.status_code for r in (evil, no_token, too_big, bad_json)] == [403, 401, 413, 400]
    codes = [envelope(r)["error"]["code"] for r in (evil, no_token, too_big, bad_json)]
    assert codes == [-32003, -32001, -32600, -32700]


async def test_a_missing_or_wrong_token_is_401_with_an_unauthorized_envelope(handlers):
    async with client(handlers) as http:
        missing = await http.post("/acp/rpc", json=request("test.record"))
        wrong = await http.post("/acp/rpc", json=request("test.record"), headers={"Authorization": "Bearer nope"})
    for response in (missing, wrong):
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        body = envelope(response)
        assert body["id"] is None and body["error"]["code"] == -32001
    assert handlers.calls == []


@pytest.mark.parametrize("header", [f"Bearer {TOKEN}", f"bearer {TOKEN}", TOKEN])
async def test_the_token_names_the_principal(handlers, header):
    async with client(handlers, auth_tokens=[{"name": "desk", "token": TOKEN}]) as http:
        response = await http.post("/acp/rpc", json=request("test.whoami"), headers={"Authorization": header})
    assert envelope(response)["result"] == {"principal": "desk"}


async def test_with_no_token_loopback_requests_run_as_local(handlers):
    async with client(handlers, auth_tokens=[], bind_host="127.0.0.1") as http:
        response = await http.post("/acp/rpc", json=request("test.whoami"))
    assert envelope(response)["result"] == {"principal": "local"}


async def test_with_no_token_a_public_bind_refuses_requests(handlers):
    async with client(handlers, auth_tokens=[], bind_host="0.0.0.0") as http:
        response = await http.post("/acp/rpc", json=request("test.whoami"))
    assert response.status_code == 401


@pytest.mark.parametrize("body", [b"", b"{", b"\xff\xfe", b'{"jsonrpc":"2.0","id":1,"method":"x"} trailing'])
async def test_invalid_json_is_400_with_parse_error_and_id_null(handlers, body):
    async with client(handlers) as http:
        response = await http.post("/acp/rpc", content=body, headers=AUTH)
    assert response.status_code == 400
    reply = envelope(response)
    assert reply["id"] is None and reply["error"]["code"] == -32700


async def test_json_rpc_errors_after_parsing_are_http_200(handlers):
    async with client(handlers) as http:
        unknown = await http.post("/acp/rpc", json=request("nope", None, "a"), headers=AUTH)
        invalid = await http.post("/acp/rpc", json={"foo": "bar"}, headers=AUTH)
        empty = await http.post("/acp/rpc", content=b"[]", headers=AUTH)
        params = await http.post("/acp/rpc", json=request("test.echo", [1], 2), headers=AUTH)
    assert [r.status_code for r in (unknown, invalid, empty, params)] == [200] * 4
    codes = [envelope(r)["error"]["code"] for r in (unknown, invalid, empty, params)]
    assert codes == [-32601, -32600, -32600, -32602]
    assert isinstance(empty.json(), dict)


async def test_a_request_gets_one_json_envelope_and_its_notifications_are_discarded(handlers):
    async with client(handlers) as http:
        response = await http.post("/acp/rpc", json=request("test.stream", {"n": 3}, 7), headers=AUTH)
    assert response.status_code == 200
    assert envelope(response) == {
        "jsonrpc": "2.0",
        "id": 7,
        "result": {"sent": 3},
        "ok": True,
        "type": "res",
        "payload": {"sent": 3},
        "seq": 0,
    }


async def test_a_mixed_batch_is_answered_with_an_array(handlers):
    batch = [request("test.echo", {"a": 1}, 1), request("test.record", None, None), {"foo": 1}]
    async with client(handlers) as http:
        response = await http.post("/acp/rpc", json=batch, headers=AUTH)
    replies = envelope(response)
    assert response.status_code == 200 and len(replies) == 2
    assert {r["id"] for r in replies} == {1, None}


# ---- 204 for notifications -------------------------------------------------------------------------


async def test_a_notification_gets_204_at_once_and_still_runs(handlers):
    async with client(handlers) as http:
        response = await http.post("/acp/rpc", json=request("test.slow", {"gate": "n"}, None), headers=SSE)
        assert response.status_code == 204 and response.content == b""
        await handlers.event("started:n").wait()  # running in the background while we already have the 204
        await http.post("/acp/rpc", json=request("test.release", {"gate": "n"}), headers=AUTH)


async def test_a_batch_of_only_notifications_gets_204_and_runs(handlers):
    batch = [request("test.record", {"k": 1}, None), request("nope", None, None)]
    async with client(handlers) as http:
        response = await http.post("/acp/rpc", json=batch, headers=AUTH)
        await handlers.event("recorded").wait()
    assert response.status_code == 204 and response.content == b""


def test_without_a_lifespan_a_notification_still_runs_after_its_204(handlers):
    app = create_app(make_config(auth_tokens=[TOKEN]), handlers.dispatcher())
    http = TestClient(app)  # not entered: no lifespan
    response = http.post("/acp/rpc", json=request("test.record", {"k": 2}, None), headers=AUTH)
    assert response.status_code == 204
    assert handlers.calls == [("record", {"k": 2}, token_principal(TOKEN))]


# ---- body size -------------------------------------------------------------------------------------


async def test_a_body_at_the_limit_is_read_completely(handlers):
    message = json.dumps(request("test.echo", {"p": "y" * 100}, 1)).encode()
    body = message + b" " * (1024 - len(message))
    async with client(handlers, limits={"max_message_bytes": 1024}) as http:
        response = await http.post("/acp/rpc", content=body, headers=AUTH)
    assert response.status_code == 200 and envelope(response)["result"] == {"p": "y" * 100}


async def test_a_body_over_the_limit_by_content_length_is_413(handlers):
    async with client(handlers, limits={"max_message_bytes": 1024}) as http:
        response = await http.post("/acp/rpc", content=b" " * 1025, headers=AUTH)
    assert response.status_code == 413
    body = envelope(response)
    assert body["id"] is None and body["error"]["code"] == -32600


async def test_a_streamed_body_over_the_limit_is_413_without_reading_the_rest(handlers):
    produced = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal produced
        for _ in range(1000):
            produced += 1
            yield b" " * 1024

    async with client(handlers, limits={"max_message_bytes": 4096}) as http:
        response = await http.post("/acp/rpc", content=chunks(), headers=AUTH)
    assert response.status_code == 413
    assert produced <= 8


async def test_a_stalled_body_times_out_with_408(handlers, monkeypatch):
    monkeypatch.setattr(bridge.http_app, "BODY_READ_TIMEOUT", 0.05)

    async def stall() -> AsyncIterator[bytes]:
        yield b'{"jsonrpc":"2.0",'
        await anyio.sleep_forever()

    async with client(handlers) as http:
        response = await http.post("/acp/rpc", content=stall(), headers=AUTH)
    assert response.status_code == 408
    assert envelope(response)["error"]["code"] == -32600


# ---- SSE ---------------------------------------------------------------------------------------


async def test_sse_streams_notifications_then_the_reply_then_done(handlers):
    async with client(handlers) as http:
        response = await http.post("/acp/rpc", json=request("test.stream", {"n": 3}, "r1"), headers=SSE)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert all(line.startswith("data: ") for line in response.text.split("\n") if line)
    *notes, reply, done = sse_events(response.text)
    assert [(n["method"], n["params"]["i"], n["seq"]) for n in notes] == [("test.tick", i, i) for i in range(3)]
    assert reply["id"] == "r1" and reply["result"] == {"sent": 3} and reply["seq"] == 3
    assert done == "[DONE]"


async def test_sse_tells_proxies_not_to_cache_or_transform_the_stream(handlers):
    """``no-store`` (sse-starlette's default) does not stop a transforming proxy or CDN from
    buffering or compressing the stream; ``no-transform`` does."""
    async with client(handlers) as http:
        response = await http.post("/acp/rpc", json=request("test.stream", {"n": 1}, "r1"), headers=SSE)
    assert response.headers["cache-control"] == "no-cache, no-transform"
    assert response.headers["x-accel-buffering"] == "no"


async def test_sse_batch_streams_every_notification_then_the_array_then_done(handlers):
    batch = [
        request("test.stream", {"n": 2}, 1),
        request("test.stream", {"n": 2}, 2),
        request("test.echo", {}, 3),
        request("test.record", None, None),
    ]
    async with client(handlers) as http:
        response = await http.post("/acp/rpc", json=batch, headers=SSE)
    events = sse_events(response.text)
    *notes, replies, done = events
    assert len(notes) == 4 and all(n["method"] == "test.tick" for n in notes)
    assert sorted(r["id"] for r in replies) == [1, 2, 3]
    assert [n["seq"] for n in notes] == [0, 1, 2, 3]
    assert sorted(r["seq"] for r in replies) == [4, 5, 6]
    assert done == "[DONE]"


async def test_sse_carries_errors_too(handlers):
    async with client(handlers) as http:
        response = await http.post("/acp/rpc", json=request("nope", None, 4), headers=SSE)
    reply, done = sse_events(response.text)
    assert response.status_code == 200 and reply["error"]["code"] == -32601 and done == "[DONE]"


async def test_sse_is_chosen_only_when_accept_contains_event_stream(handlers):
    async with client(handlers) as http:
        headers = {"Accept": "application/json", **AUTH}
        response = await http.post("/acp/rpc", json=request("test.echo"), headers=headers)
    assert response.headers["content-type"].startswith("application/json")


def test_sse_through_the_starlette_test_client(handlers):
    app = create_app(make_config(auth_tokens=[TOKEN]), handlers.dispatcher())
    with TestClient(app) as http:
        response = http.post("/acp/rpc", json=request("test.stream", {"n": 2}, 5), headers=SSE)
    assert [e if isinstance(e, str) else e["seq"] for e in sse_events(response.text)] == [0, 1, 2, "[DONE]"]


# ---- lifespan --------------------------------------------------------------------------------------


async def wait_for(handlers: Handlers, name: str) -> None:
    with anyio.fail_after(WAIT):
        await handlers.event(name).wait()


def test_the_callers_lifespan_wraps_the_background_task_group(handlers):
    log: list[str] = []

    @asynccontextmanager
    async def outer(app: Any) -> AsyncIterator[dict[str, Any]]:
        log.append("enter")
        yield {"from_outer": True}
        log.append(f"exit, background cancelled: {handlers.cancelled == ['slow']}")

    app = create_app(make_config(auth_tokens=[TOKEN]), handlers.dispatcher(), lifespan=outer)
    with TestClient(app) as http:
        response = http.post("/acp/rpc", json=request("test.slow", {"gate": "bg"}, None), headers=AUTH)
        assert response.status_code == 204
        http.portal.call(wait_for, handlers, "started:bg")  # running in the background
        assert log == ["enter"]
    assert log == ["enter", "exit, background cancelled: True"]


async def test_a_result_json_cannot_hold_is_answered_internal_error_over_json_and_sse(handlers):
    """A handler's bug must not leave the client without an answer: plain HTTP answered a text
    500, and an SSE stream ended with only ``[DONE]``."""
    async with client(handlers) as http:
        plain = await http.post("/acp/rpc", json=request("test.unencodable", {}), headers=AUTH)
        streamed = await http.post("/acp/rpc", json=request("test.unencodable", {}, id_=2), headers=SSE)
    assert plain.status_code == 200
    assert (envelope(plain)["id"], envelope(plain)["error"]["code"]) == (1, -32603)
    *_, reply, done = sse_events(streamed.text)
    assert (reply["id"], reply["error"]["code"], done) == (2, -32603, "[DONE]")
