"""``compat._lines.LineReader``: a child's stdout as bounded lines (field-failures #9), pushed to a
consumer from the pipe's data callback or pulled, with the same framing either way.

* Lines split across chunks arrive whole and in order; ``\\r\\n`` ends a line too; an
  unterminated final line is delivered at end of file.
* A line over the bound, or unterminated data past it, fails the stream with ``LineTooLong``;
  a line of exactly the bound passes.
* Stopping a reader keeps what it has not taken; an exception from the consumer reaches the
  reader, not the pipe's transport.
* A real pipe that nobody reads stops at its bound: the child blocks, memory does not grow.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable

import anyio
import anyio.abc
import pytest

from compat._child import _READ_LIMIT, _read_pipe
from compat._lines import LineReader, LineTooLong

WAIT = 10.0  # seconds: the bound on every wait below


class PushSource(anyio.abc.ByteReceiveStream):
    """A source that pushes like ``PipeReceiveStream``: ``push`` stands for the data callback."""

    def __init__(self) -> None:
        self.receiver: Callable[[bytes], None] | None = None
        self.pending: list[bytes] = []
        self.arrived = anyio.Event()

    def set_receiver(self, receiver: Callable[[bytes], None] | None) -> None:
        self.receiver = receiver
        while receiver is not None and self.pending and self.receiver is receiver:
            receiver(self.pending.pop(0))

    def push(self, data: bytes) -> None:
        if self.receiver is None:
            self.pending.append(data)
            self.arrived.set()
        else:
            self.receiver(data)

    async def receive(self, max_bytes: int = 65536) -> bytes:  # receive_line pulls
        while not self.pending:
            self.arrived = anyio.Event()
            await self.arrived.wait()
        if not self.pending[0]:
            raise anyio.EndOfStream
        return self.pending.pop(0)

    async def aclose(self) -> None:
        pass


class PullSource(anyio.abc.ByteReceiveStream):
    """A plain stream (as ``anyio.open_process`` gives): chunks are pulled."""

    def __init__(self) -> None:
        self.send, self.recv = anyio.create_memory_object_stream[bytes](100)

    def push(self, data: bytes) -> None:
        if data:
            self.send.send_nowait(data)
        else:
            self.send.close()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self.recv.receive()

    async def aclose(self) -> None:
        await self.recv.aclose()


SOURCES = {"push": PushSource, "pull": PullSource}


async def read_all(reader: LineReader) -> list[bytes]:
    lines: list[bytes] = []
    with anyio.fail_after(WAIT):
        await reader.read_lines(lines.append)
    return lines


@pytest.mark.parametrize("kind", SOURCES)
async def test_lines_arrive_whole_in_order_and_the_unterminated_last_one_at_eof(kind: str) -> None:
    source = SOURCES[kind]()
    for chunk in (b"one\ntw", b"o\r\nthree\n\n", b"fo", b"ur", b""):
        source.push(chunk)
    assert await read_all(LineReader(source, max_line=16)) == [b"one", b"two", b"three", b"", b"four"]


async def test_pushed_lines_reach_the_consumer_inside_the_data_callback() -> None:
    source, seen = PushSource(), []
    reader = LineReader(source, max_line=16)
    async with anyio.create_task_group() as tg:
        tg.start_soon(reader.read_lines, seen.append)
        with anyio.fail_after(WAIT):
            while source.receiver is None:
                await anyio.lowlevel.checkpoint()
        source.push(b"a\nb")
        assert seen == [b"a"]  # no task switch between the bytes and the consumer
        source.push(b"\n")
        assert seen == [b"a", b"b"]
        source.push(b"")
    assert source.receiver is None  # the reader let go of the pipe


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("data", [b"123456789\n", b"123456789"])
async def test_a_line_over_the_bound_fails_the_stream(kind: str, data: bytes) -> None:
    source, seen = SOURCES[kind](), []
    source.push(b"1234567\r\n12345678\n" + data)  # the bound is 8: both first lines pass
    reader = LineReader(source, max_line=8)
    with anyio.fail_after(WAIT), pytest.raises(LineTooLong) as caught:
        await reader.read_lines(seen.append)  # unterminated, 9 bytes fail without waiting for more
    assert caught.value.limit == 8
    assert seen == [b"1234567", b"12345678"]
    with pytest.raises(LineTooLong):
        await reader.receive_line()  # the stream stays failed


@pytest.mark.parametrize("kind", SOURCES)
async def test_a_stopped_reader_leaves_the_rest_for_the_next(kind: str) -> None:
    source, seen = SOURCES[kind](), []
    reader = LineReader(source, max_line=64)
    source.push(b"first\nsec")
    with anyio.move_on_after(0.05):  # a turn ends: its reader is cancelled mid-line
        await reader.read_lines(seen.append)
    assert seen == [b"first"]
    source.push(b"ond\n")
    source.push(b"")
    with anyio.fail_after(WAIT):
        assert await reader.receive_line() == b"second"
        with pytest.raises(anyio.EndOfStream):
            await reader.receive_line()


async def test_an_error_in_the_consumer_reaches_the_reader_not_the_pipe() -> None:
    source = PushSource()
    reader = LineReader(source, max_line=64)

    def consumer(line: bytes) -> None:
        raise ValueError(line.decode())

    async with anyio.create_task_group() as tg:
        failures: list[BaseException] = []

        async def read() -> None:
            try:
                await reader.read_lines(consumer)
            except ValueError as exc:
                failures.append(exc)

        tg.start_soon(read)
        with anyio.fail_after(WAIT):
            while source.receiver is None:
                await anyio.lowlevel.checkpoint()
        source.push(b"boom\n")  # the data callback itself raises nothing
    assert [str(f) for f in failures] == ["boom"]


async def test_a_pushed_consumer_can_start_tasks_and_create_events() -> None:
    """Consumers run outside any task; anyio still finds its backend there (the JSON-RPC peer
    starts a task per incoming request, the orchestrator one to stop a turn over its limit)."""
    source, done = PushSource(), []
    reader = LineReader(source, max_line=64)
    async with anyio.create_task_group() as tg:

        async def handle(line: bytes) -> None:
            done.append(line)

        def consumer(line: bytes) -> None:
            anyio.Event()
            tg.start_soon(handle, line)

        tg.start_soon(reader.read_lines, consumer)
        with anyio.fail_after(WAIT):
            while source.receiver is None:
                await anyio.lowlevel.checkpoint()
        asyncio.get_running_loop().call_soon(source.push, b"req\n")  # from a bare loop callback
        asyncio.get_running_loop().call_soon(source.push, b"")
    assert done == [b"req"]


async def test_a_pipe_nobody_reads_stops_at_its_bound_and_then_delivers_everything() -> None:
    lines, size = 4000, 100  # 400 KB: three times the bound
    read_end, write_end = os.pipe()
    script = f"import os; os.write({write_end}, (('x' * {size - 1} + '\\n') * {lines}).encode())"
    writer = subprocess.Popen([sys.executable, "-c", script], pass_fds=(write_end,))
    os.close(write_end)
    connected: list[asyncio.BaseTransport] = []
    try:
        pipe = await _read_pipe(asyncio.get_running_loop(), read_end, connected)
        with anyio.fail_after(WAIT):
            while not pipe._paused:
                await anyio.sleep(0.01)  # polling another process's progress: bounded
        assert pipe._buffered <= _READ_LIMIT + 65536
        assert writer.poll() is None  # blocked on the full pipe, not buffered by us
        seen: list[bytes] = []
        with anyio.fail_after(WAIT):
            await LineReader(pipe, max_line=1024).read_lines(seen.append)
        assert len(seen) == lines and all(len(line) == size - 1 for line in seen)
    finally:
        for transport in connected:
            transport.close()
        writer.kill()
        writer.wait()
