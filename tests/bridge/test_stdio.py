"""``acp-stdio`` over in-memory streams and one real subprocess (docs/api.md "stdio";
xworkmate-original.md §5.8)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import anyio
import pytest

from bridge.config import Limits
from bridge.stdio import READ_CHUNK, FrameReader, serve_stdio

from .conftest import WAIT, Handlers, request

pytestmark = pytest.mark.timeout(30)


class Collector:
    """A stdout that records what it is sent."""

    def __init__(self, *, broken: bool = False) -> None:
        self.lines: list[bytes] = []
        self.broken = broken

    async def send(self, item: bytes) -> None:
        if self.broken:
            raise anyio.BrokenResourceError
        self.lines.append(item)

    def envelopes(self) -> list[Any]:
        assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in self.lines)
        return [json.loads(line) for line in self.lines]


def line(message: Any) -> bytes:
    return json.dumps(message).encode() + b"\n"


def framed(message: Any, *, crlf: bool = True, extra: bytes = b"") -> bytes:
    body = json.dumps(message).encode()
    sep = b"\r\n" if crlf else b"\n"
    return b"Content-Length: " + str(len(body)).encode() + sep + extra + sep + body


async def run(handlers: Handlers, *chunks: bytes, limit: int = 4096, stdout: Collector | None = None) -> Collector:
    """Feed ``chunks`` then EOF; return once ``serve_stdio`` returned."""
    stdout = stdout or Collector()
    tx, rx = anyio.create_memory_object_stream[bytes](len(chunks) + 1)
    for chunk in chunks:
        tx.send_nowait(chunk)
    tx.close()
    with anyio.fail_after(WAIT):
        limits = Limits(max_message_bytes=limit)
        await serve_stdio(handlers.dispatcher(), stdin=rx, stdout=stdout, limits=limits)
    return stdout


async def test_one_json_request_per_line_gets_one_envelope_per_line(handlers):
    out = await run(handlers, line(request("test.echo", {"a": 1}, 1)) + line(request("nope", None, 2)))
    replies = {r["id"]: r for r in out.envelopes()}
    assert replies[1]["result"] == {"a": 1}
    assert replies[2]["error"]["code"] == -32601


async def test_notifications_are_interleaved_and_seq_counts_for_the_process(handlers):
    out = await run(handlers, line(request("test.stream", {"n": 3}, 1)), line(request("test.echo", None, 2)))
    envelopes = out.envelopes()
    assert sorted(e["seq"] for e in envelopes) == list(range(5))
    assert [e["seq"] for e in envelopes] == list(range(5))  # written in seq order
    assert sum(1 for e in envelopes if e.get("method") == "test.tick") == 3


async def test_content_length_framing_is_detected_per_message(handlers):
    out = await run(
        handlers,
        framed(request("test.echo", {"f": "lsp"}, 1)),
        line(request("test.echo", {"f": "ndjson"}, 2)),
        framed(request("test.echo", {"f": "lf"}, 3), crlf=False, extra=b"Content-Type: application/json\n"),
        b"content-length: 0\r\n\r\n",  # an empty body is a parse error, not a hang
    )
    envelopes = out.envelopes()
    assert {e["id"]: e["result"]["f"] for e in envelopes if "result" in e} == {1: "lsp", 2: "ndjson", 3: "lf"}
    assert [e["error"]["code"] for e in envelopes if "error" in e] == [-32700]


async def test_input_split_at_any_byte_is_reassembled(handlers):
    data = framed(request("test.echo", {"x": 1}, 1)) + line(request("test.echo", {"x": 2}, 2))
    out = await run(handlers, *(data[i : i + 1] for i in range(len(data))))
    assert sorted(e["id"] for e in out.envelopes()) == [1, 2]


async def test_crlf_blank_lines_and_a_final_line_without_newline_are_handled(handlers):
    body = json.dumps(request("test.echo", None, 1)).encode()
    last = json.dumps(request("test.echo", None, 2)).encode()  # no newline after it
    out = await run(handlers, b"\n\r\n  \n" + body + b"\r\n" + last)
    assert sorted(e["id"] for e in out.envelopes()) == [1, 2]


async def test_invalid_json_gets_parse_error_with_id_null_and_reading_goes_on(handlers):
    out = await run(handlers, b"{nope\n", line(request("test.echo", None, 2)))
    first, second = out.envelopes()
    assert first["id"] is None and first["error"]["code"] == -32700
    assert second["id"] == 2


async def test_an_oversized_line_is_answered_and_skipped(handlers):
    big = line(request("test.echo", {"p": "x" * 5000}, 1))
    out = await run(handlers, big[:3000], big[3000:] + line(request("test.echo", None, 2)), limit=1024)
    first, second = out.envelopes()
    assert first["id"] is None and first["error"]["code"] == -32600
    assert first["error"]["data"]["maxMessageBytes"] == 1024
    assert second["id"] == 2


async def test_an_oversized_content_length_body_is_answered_and_skipped(handlers):
    out = await run(
        handlers, framed(request("test.echo", {"p": "x" * 5000}, 1)), line(request("test.echo", None, 2)), limit=1024
    )
    first, second = out.envelopes()
    assert first["error"]["code"] == -32600 and second["id"] == 2


async def test_an_oversized_line_is_never_buffered_whole():
    limit, sizes = 1024, []

    class Source:
        def __init__(self) -> None:
            self.chunks = [b"x" * READ_CHUNK for _ in range(64)] + [b"\n", b'{"ok":1}\n']

        async def receive(self) -> bytes:
            sizes.append(len(reader._buf))
            if not self.chunks:
                raise anyio.EndOfStream
            return self.chunks.pop(0)

    reader = FrameReader(Source(), limit)
    messages = [m async for m in reader.messages()]
    assert len(messages) == 2 and messages[1] == b'{"ok":1}'
    assert max(sizes) <= limit + READ_CHUNK


async def test_eof_waits_for_in_flight_requests_then_returns(handlers):
    out = Collector()
    tx, rx = anyio.create_memory_object_stream[bytes](4)
    tx.send_nowait(line(request("test.slow", {"gate": "eof"}, 1)))
    tx.close()
    returned = anyio.Event()

    async def serve() -> None:
        await serve_stdio(handlers.dispatcher(), stdin=rx, stdout=out, limits=Limits())
        returned.set()

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            await handlers.event("started:eof").wait()
            assert not returned.is_set()  # stdin is at EOF, but the request is still running
            handlers.event("eof").set()
    assert out.envelopes()[0]["result"] == {"released": True}


async def test_a_closed_stdout_stops_serving_quietly(handlers):
    out = await run(handlers, line(request("test.echo", None, 1)), stdout=Collector(broken=True))
    assert out.lines == []


async def test_the_principal_is_local(handlers):
    out = await run(handlers, line(request("test.whoami", None, 1)))
    assert out.envelopes()[0]["result"] == {"principal": "local"}


STDIO_SCRIPT = textwrap.dedent(
    """
    import anyio
    from bridge.config import Limits
    from bridge.dispatch import Method, Dispatcher
    from bridge.stdio import serve_stdio

    async def noisy(params, ctx):
        print("noise from a handler")  # must not reach the protocol stream
        ctx.notify("test.tick", {"i": 0})
        return params

    async def main():
        await serve_stdio(Dispatcher([Method("test.noisy", noisy)]), limits=Limits())  # the process's stdio
        print("after serving")  # fd 1 and sys.stdout are restored

    anyio.run(main)
    """
)


def test_process_stdout_carries_protocol_frames_only_and_eof_exits_0():
    requests = line(request("test.noisy", {"a": 1}, 1)) + framed(request("test.noisy", {"b": 2}, 2))
    command = [sys.executable, "-c", STDIO_SCRIPT]
    done = subprocess.run(command, input=requests, capture_output=True, timeout=WAIT * 3)
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert lines[-1] == "after serving"
    envelopes = [json.loads(text) for text in lines[:-1]]
    assert sorted(e["seq"] for e in envelopes) == [0, 1, 2, 3]
    assert {e["id"] for e in envelopes if "id" in e} == {1, 2}
    assert done.stderr.decode().count("noise from a handler") == 2
