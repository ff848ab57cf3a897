"""JSON-RPC 2.0 rules as every transport sees them: codec (no event loop) and
``Dispatcher.serve_frame`` over an in-memory stream (JSON-RPC 2.0 §4-§6; field-failures #1, #2)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.dispatch import CallContext, Dispatcher
from bridge.rpc.codec import Invalid, Request, parse_frame
from bridge.rpc.errors import InvalidRequest, ParseError
from bridge.rpc.stream import EnvelopeStream

from .conftest import WAIT, request


async def serve(
    dispatcher: Dispatcher, data: bytes | str, stream: EnvelopeStream | None = None, sink: list[bytes] | None = None
) -> list[Any]:
    """Run one frame to completion; returns the decoded envelopes (stdlib json keeps big ints)."""
    sink = [] if sink is None else sink
    stream = stream or EnvelopeStream(sink.append)
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            dispatcher.serve_frame(data, stream, CallContext(notify=stream.notify), tg)
    return [json.loads(frame) for frame in sink]


def dumps(value: Any) -> str:
    return json.dumps(value)


# ---- codec: text in, messages out (no event loop) -----------------------------------------------


def test_a_single_request_parses_to_one_request():
    frame = parse_frame(b'{"jsonrpc":"2.0","id":"a","method":"m","params":{"x":1}}')
    assert not frame.is_batch
    assert frame.messages == (Request("a", "m", {"x": 1}),)


def test_a_message_without_id_is_a_notification_and_id_null_is_a_request():
    (note,) = parse_frame(b'{"jsonrpc":"2.0","method":"m"}').messages
    (null_id,) = parse_frame(b'{"jsonrpc":"2.0","id":null,"method":"m"}').messages
    assert note.is_notification
    assert not null_id.is_notification and null_id.id is None


def test_invalid_json_raises_parse_error():
    with pytest.raises(ParseError) as info:
        parse_frame(b'{"jsonrpc":')
    assert info.value.code == -32700


def test_an_empty_frame_raises_parse_error():
    with pytest.raises(ParseError):
        parse_frame(b"")


def test_an_empty_batch_raises_invalid_request():
    with pytest.raises(InvalidRequest) as info:
        parse_frame(b"[]")
    assert info.value.code == -32600


@pytest.mark.parametrize("bad_id", ["true", "false", "{}", '{"a":1}', "[]", "[1]"])
def test_bool_object_and_array_ids_are_invalid_with_id_null(bad_id):
    (message,) = parse_frame(f'{{"jsonrpc":"2.0","id":{bad_id},"method":"m"}}').messages
    assert isinstance(message, Invalid)
    assert message.id is None and message.error.code == -32600


def test_a_big_integer_id_is_kept_exactly():
    (message,) = parse_frame(b'{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"m"}').messages
    assert message.id == 123456789012345678901234567890


@pytest.mark.parametrize("id_", [-9223372036854775809, -9999999999999999999, 18446744073709551616, 2**63 - 1])
@pytest.mark.parametrize("as_text", [True, False], ids=["websocket-str", "http-bytes"])
def test_ids_just_past_64_bits_are_kept_exactly(id_: int, as_text: bool):
    """orjson turns integers outside [-2**63, 2**64) into floats; 19 digits already get there."""
    text = '{"jsonrpc":"2.0","id":%d,"method":"m"}' % id_
    (message,) = parse_frame(text if as_text else text.encode()).messages
    assert message.id == id_ and isinstance(message.id, int)


# ---- dispatch: answers, ids, errors --------------------------------------------------------------


async def test_the_empty_batch_is_answered_with_one_error_object_not_an_array(dispatcher):
    (reply,) = await serve(dispatcher, "[]")
    assert isinstance(reply, dict)
    assert reply["id"] is None and reply["error"]["code"] == -32600


async def test_a_batch_of_non_objects_gets_one_error_per_member(dispatcher):
    (replies,) = await serve(dispatcher, "[1,2,3]")
    assert isinstance(replies, list) and len(replies) == 3
    assert all(r["id"] is None and r["error"]["code"] == -32600 for r in replies)


async def test_a_batch_of_only_notifications_sends_nothing(dispatcher, handlers):
    batch = [request("test.record", {"n": 1}, None), request("nope.b", None, None)]
    assert await serve(dispatcher, dumps(batch)) == []
    assert [c[0] for c in handlers.calls] == ["record"]


async def test_a_mixed_batch_answers_requests_and_invalid_members_only(dispatcher):
    batch = [request("test.echo", {"v": 1}, 1), request("nope", None, None), {"foo": "bar"}]
    (replies,) = await serve(dispatcher, dumps(batch))
    assert len(replies) == 2
    by_id = {r["id"]: r for r in replies}
    assert by_id[1]["result"] == {"v": 1}
    assert by_id[None]["error"]["code"] == -32600


@pytest.mark.parametrize("id_", ["req-1", "", 0, -7, 1.5, 123456789012345678901234567890])
async def test_the_id_is_echoed_exactly(dispatcher, id_):
    raw = '{"jsonrpc":"2.0","id":%s,"method":"test.echo"}' % json.dumps(id_)
    sink: list[bytes] = []
    (reply,) = await serve(dispatcher, raw, sink=sink)
    assert reply["id"] == id_ and type(reply["id"]) is type(id_)
    assert (b'"id":%s,' % json.dumps(id_).encode()) in sink[0]


async def test_an_id_with_a_lone_surrogate_escape_round_trips(dispatcher):
    sink: list[bytes] = []
    (reply,) = await serve(dispatcher, '{"jsonrpc":"2.0","id":"a\\ud800","method":"test.echo"}', sink=sink)
    assert reply["id"] == "a\ud800"


async def test_a_null_id_request_is_answered_with_id_null(dispatcher):
    (reply,) = await serve(dispatcher, dumps(request("test.echo", {"a": 1}, None) | {"id": None}))
    assert reply["id"] is None and reply["result"] == {"a": 1}


@pytest.mark.parametrize("version", [None, "1.0", 2.0, "2"])
async def test_jsonrpc_must_be_exactly_2_0(dispatcher, version):
    message = {"id": 5, "method": "test.echo"}
    if version is not None:
        message["jsonrpc"] = version
    (reply,) = await serve(dispatcher, dumps(message))
    assert reply["id"] == 5 and reply["error"]["code"] == -32600


@pytest.mark.parametrize("params", [[1, 2], "x", 3, True])
async def test_params_that_are_not_an_object_are_invalid_params(dispatcher, params):
    (reply,) = await serve(dispatcher, dumps(request("test.echo", params, 9)))
    assert reply["error"]["code"] == -32602
    # every -32602 lists its failures (docs/api.md "Errors"), even one raised without a list
    assert reply["error"]["data"]["errors"] == [{"loc": "", "type": "invalid", "msg": reply["error"]["message"]}]


async def test_an_unknown_method_is_method_not_found(dispatcher):
    (reply,) = await serve(dispatcher, dumps(request("nope", None, 7)))
    assert reply["id"] == 7 and reply["error"]["code"] == -32601


async def test_unknown_and_failing_notifications_are_never_answered(dispatcher):
    for method in ("nope.notify", "test.fail", "test.needs_int"):
        assert await serve(dispatcher, dumps(request(method, {"x": "no"}, None))) == []


async def test_an_unexpected_exception_is_internal_error_without_its_text(dispatcher):
    sink: list[bytes] = []
    (reply,) = await serve(dispatcher, dumps(request("test.fail", None, 3)), sink=sink)
    assert reply["error"]["code"] == -32603
    assert b"secret internal detail" not in sink[0]


async def test_invalid_json_is_answered_with_parse_error_and_id_null(dispatcher):
    (reply,) = await serve(dispatcher, '{"jsonrpc": "2.0", "method"')
    assert reply["id"] is None and reply["error"]["code"] == -32700


async def test_a_reply_carries_the_hybrid_envelope_fields(dispatcher):
    (ok,) = await serve(dispatcher, dumps(request("test.echo", {"a": 1}, "x")))
    (err,) = await serve(dispatcher, dumps(request("nope", None, "y")))
    assert ok == {
        "jsonrpc": "2.0",
        "id": "x",
        "result": {"a": 1},
        "ok": True,
        "type": "res",
        "payload": {"a": 1},
        "seq": 0,
    }
    assert err["ok"] is False and err["type"] == "res" and err["payload"] is None


# ---- seq -----------------------------------------------------------------------------------------


async def test_seq_counts_notifications_then_the_reply_on_one_stream(dispatcher):
    (*notes, reply) = await serve(dispatcher, dumps(request("test.stream", {"n": 3}, 1)))
    assert [n["seq"] for n in notes] == [0, 1, 2]
    assert [n["method"] for n in notes] == ["test.tick"] * 3
    assert notes[0]["type"] == "event" and notes[0]["event"] == "test.tick"
    assert reply["seq"] == 3 and reply["result"] == {"sent": 3}


async def test_seq_continues_across_frames_on_the_same_stream(dispatcher):
    sink: list[bytes] = []
    stream = EnvelopeStream(sink.append)
    await serve(dispatcher, dumps(request("test.echo", None, 1)), stream, sink)
    await serve(dispatcher, dumps(request("test.echo", None, 2)), stream, sink)
    assert [json.loads(f)["seq"] for f in sink] == [0, 1]


async def test_batch_replies_take_consecutive_seq_values(dispatcher):
    batch = [request("test.echo", None, i) for i in range(4)]
    (replies,) = await serve(dispatcher, dumps(batch))
    assert sorted(r["seq"] for r in replies) == [0, 1, 2, 3]


# ---- property: any input parses or raises the documented errors --------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_messages = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.sampled_from(["2.0", "1.0"]) | _json,
        "id": _json,
        "method": st.text(max_size=8) | _json,
        "params": _json,
    },
)


def _check(data: bytes | str) -> None:
    try:
        frame = parse_frame(data)
    except (ParseError, InvalidRequest):
        return
    assert frame.messages
    for message in frame.messages:
        assert isinstance(message, (Request, Invalid))
        if isinstance(message, Invalid):
            assert message.error.code in (-32600, -32700)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_parse_or_raise_the_documented_errors(data):
    _check(data)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_text_parses_or_raises_the_documented_errors(text):
    _check(text)


@settings(max_examples=300, deadline=None)
@given(_messages | st.lists(_messages, max_size=4) | _json)
def test_any_json_value_becomes_requests_or_invalid_messages(value):
    _check(json.dumps(value))


def test_cut_utf8_keeps_a_lone_surrogate_it_counted() -> None:
    """A lone surrogate counts as the 3 bytes of the U+FFFD it becomes on the wire; the cut once
    dropped it, and so the text after it moved up into the room."""
    from bridge.rpc.codec import cut_utf8, scrub, utf8_len

    text = "a\ud83db" + "x" * 10
    cut = cut_utf8(text, 6)
    assert cut == "a\ud83dbx" and utf8_len(cut) <= 6
    assert scrub(cut) == "a\ufffdbx"
    assert cut_utf8("héllo", 2) == "h" and cut_utf8("ab", 0) == ""
