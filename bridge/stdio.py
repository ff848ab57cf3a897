"""``acp-stdio``: the bridge's JSON-RPC methods over stdin/stdout (docs/api.md "stdio";
xworkmate-original.md §5.8).

In: one JSON frame per line, or LSP-style ``Content-Length: N`` headers, a blank line and N
bytes, detected per message. Out: one envelope per line, notifications interleaved; the process is
one ``seq`` stream. Requests run concurrently; on EOF the in-flight ones finish, the queue drains,
and ``serve_stdio`` returns. A message over ``max_message_bytes`` is answered with -32600 (id null)
and skipped without being buffered whole. stdout carries protocol frames only; logs go to stderr.

Imports ``bridge.*`` and anyio only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio
import anyio.abc
from anyio.abc import TaskGroup
from anyio.from_thread import BlockingPortal

from bridge.config import Limits
from bridge.dialect import EditorFactory, LineAgent, is_acp_initialize
from bridge.dispatch import CallContext, Dispatcher, run_closers
from bridge.outbox import Outbox
from bridge.rpc.codec import Reply
from bridge.rpc.errors import InvalidRequest
from bridge.rpc.stream import EnvelopeStream
from compat.telemetry import METRICS

log = logging.getLogger(__name__)

READ_CHUNK = 64 * 1024  # bytes per read from stdin
FLUSH_TIMEOUT = 5.0
"""Seconds ``stdio_streams`` waits at exit for the last envelopes to reach stdout."""
_HEADER = re.compile(rb"(?i)content-length[ \t]*:[ \t]*(\d{1,18})")
OVERSIZED: Any = object()
"""What ``FrameReader.messages`` yields for a message past the limit (already discarded)."""


class ByteSource(Protocol):
    """Chunks of input; ``receive`` raises ``anyio.EndOfStream`` at EOF (a memory object stream
    or anyio's ``ByteReceiveStream`` fit)."""

    async def receive(self) -> bytes: ...


class ByteSink(Protocol):
    """Where encoded envelopes go (a memory object stream or anyio's ``ByteSendStream`` fit)."""

    async def send(self, item: bytes) -> None: ...


class FrameReader:
    """Splits a byte stream into messages, holding at most about ``limit`` + one chunk in memory.

    Args:
        source: yields chunks; ``anyio.EndOfStream`` (or a closed stream) means EOF.
        limit: the largest message in bytes; longer ones are reported as ``OVERSIZED``.
    """

    def __init__(self, source: ByteSource, limit: int) -> None:
        self._source, self._limit = source, limit
        self._buf = bytearray()

    async def messages(self) -> AsyncIterator[bytes]:
        """Each message's bytes, or ``OVERSIZED``; blank lines are skipped."""
        while (line := await self._line()) is not None:
            if line is OVERSIZED:
                yield line
            elif header := _HEADER.fullmatch(line.strip()):
                yield await self._body(int(header.group(1)))
            elif line.strip():
                yield line

    async def _fill(self) -> bool:
        try:
            self._buf += await self._source.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        return True

    async def _line(self) -> Any:
        """The next line without its terminator; ``OVERSIZED``; or None at EOF."""
        searched = 0
        while (end := self._buf.find(b"\n", searched)) < 0:
            if len(self._buf) > self._limit:
                return await self._discard_line()
            searched = len(self._buf)
            if not await self._fill():
                line, self._buf = bytes(self._buf), bytearray()
                return line or None
        line = bytes(self._buf[:end]).removesuffix(b"\r")
        del self._buf[: end + 1]
        return OVERSIZED if len(line) > self._limit else line

    async def _discard_line(self) -> Any:
        self._buf.clear()
        while await self._fill():
            if (end := self._buf.find(b"\n")) >= 0:
                del self._buf[: end + 1]
                break
            self._buf.clear()
        return OVERSIZED

    async def _body(self, length: int) -> Any:
        """After a ``Content-Length`` header: skip the other headers, then take ``length`` bytes."""
        while (line := await self._line()) is not None and line is not OVERSIZED and line.strip():
            pass
        if length > self._limit:
            await self._skip(length)
            return OVERSIZED
        while len(self._buf) < length and await self._fill():
            pass
        body = bytes(self._buf[:length])
        del self._buf[:length]
        return body

    async def _skip(self, length: int) -> None:
        while length > 0 and (self._buf or await self._fill()):
            taken = min(length, len(self._buf))
            del self._buf[:taken]
            length -= taken


async def serve_stdio(
    dispatcher: Dispatcher,
    *,
    stdin: ByteSource | None = None,
    stdout: ByteSink | None = None,
    limits: Limits,
    on_eof: Callable[[], Awaitable[None]] | None = None,
    editor: EditorFactory | None = None,
    stop_signals: tuple[signal.Signals, ...] = (),
) -> None:
    """Serve JSON-RPC on a pair of byte streams until EOF on ``stdin``, then until the requests
    in flight are answered.

    Args:
        dispatcher: runs the frames; the principal is ``local``.
        stdin: chunks of input. Default (with ``stdout`` also None): the process's own stdin and
            stdout, claimed with ``stdio_streams()`` for the duration.
        stdout: receives one envelope per ``send``, each ending in ``\\n``.
        limits: ``max_message_bytes`` per input message; ``max_connection_queue`` envelopes (and
            ``max_connection_queue_bytes``) may wait for stdout before the bridge gives up on a
            reader that stopped reading.
        on_eof: awaited at EOF, before the requests in flight are waited for: ``acp-stdio``'s
            editor is gone, so its running turns are cancelled (and recorded as such) rather than
            left running (docs/api.md "Graceful shutdown").
        editor: builds the ACP agent that serves the process when its first message is an ACP
            ``initialize`` (docs/api.md "Editor mode"); None keeps the bridge's own methods only.
        stop_signals: signals that end the input as EOF does (``acp-stdio``: SIGTERM, SIGINT,
            SIGHUP; editors stop their agents with them). Main thread only.
    """
    if stdin is not None and stdout is not None:
        await _StdioLink(dispatcher, stdin, stdout, limits, on_eof, editor, stop_signals).run()
        return
    async with stdio_streams() as (process_in, process_out):
        link = _StdioLink(dispatcher, stdin or process_in, stdout or process_out, limits, on_eof, editor, stop_signals)
        await link.run()


_TOO_LARGE = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request: message too large"}}'


class _StdioLink:
    def __init__(
        self,
        dispatcher: Dispatcher,
        stdin: ByteSource,
        stdout: ByteSink,
        limits: Limits,
        on_eof: Callable[[], Awaitable[None]] | None = None,
        editor: EditorFactory | None = None,
        stop_signals: tuple[signal.Signals, ...] = (),
    ) -> None:
        self._dispatcher, self._stdout, self._limit = dispatcher, stdout, limits.max_message_bytes
        self._on_eof = on_eof
        self._editor = editor
        self._reader = FrameReader(stdin, limits.max_message_bytes)
        self._outbox = Outbox(limits.max_connection_queue, limits.max_connection_queue_bytes)
        self._stream = EnvelopeStream(self._enqueue)
        self._closers: list[Callable[[], None]] = []
        self._ctx = CallContext(
            "local", self._stream.notify, "stdio", closers=self._closers, backlog=lambda: self._outbox.buffered_bytes
        )
        self._scope = anyio.CancelScope()
        self._reading: anyio.CancelScope | None = None  # where the input is being read (``_input``)
        self._stopped = False  # a stop signal came: the input has ended
        self._stop_signals = stop_signals

    async def run(self) -> None:
        METRICS.connections.add(1, "stdio")
        try:
            await self._run()
        finally:
            METRICS.connections.add(-1, "stdio")

    async def _run(self) -> None:
        with self._scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._write_loop)
                watching = anyio.CancelScope()  # the signal watch ends with the input
                if self._stop_signals:
                    tg.start_soon(self._stop_on, self._stop_signals, watching)
                try:
                    async with anyio.create_task_group() as requests:
                        await self._read_loop(requests)
                        if self._on_eof is not None:
                            await self._on_eof()
                finally:
                    watching.cancel()
                    run_closers(self._closers)
                    self._outbox.close()  # every request finished: the writer drains, then ends

    async def _read_loop(self, requests: TaskGroup) -> None:
        messages = aiter(self._reader.messages())
        first = None
        with self._input():
            first = await anext(messages, None)
        if first is not None and first is not OVERSIZED and self._editor is not None and is_acp_initialize(first):
            agent = self._editor(self._write_line, lambda: self._outbox.buffered_bytes)
            await self._serve_editor(agent, first, messages)
            return
        if first is not None:
            self._serve(first, requests)
        with self._input():
            async for message in messages:
                self._serve(message, requests)

    async def _stop_on(self, signals: tuple[signal.Signals, ...], watching: anyio.CancelScope) -> None:
        """A stop signal ends the input as EOF would: the running turns are cancelled (recorded)
        and answered, and the process exits 0 (docs/api.md "Command line")."""
        with watching, anyio.open_signal_receiver(*signals) as received:
            async for signum in received:
                log.info("%s: stopping as at the end of stdin", signal.Signals(signum).name)
                self._stopped = True
                if self._reading is not None:
                    self._reading.cancel()
                return

    @contextlib.contextmanager
    def _input(self) -> Iterator[None]:
        """Where the input is read: a stop signal ends it here, as EOF would."""
        with anyio.CancelScope() as scope:
            self._reading = scope
            if self._stopped:
                scope.cancel()
            try:
                yield
            finally:
                self._reading = None

    def _serve(self, message: Any, requests: TaskGroup) -> None:
        if message is OVERSIZED:
            error = InvalidRequest("Invalid Request: message too large", maxMessageBytes=self._limit)
            self._stream.reply(Reply.from_error(None, error))
        else:
            self._dispatcher.serve_frame(message, self._stream, self._ctx, requests)

    async def _serve_editor(self, agent: LineAgent, first: bytes, messages: AsyncIterator[Any]) -> None:
        """The ACP dialect: plain JSON-RPC lines to and from ``agent`` until EOF; then the
        editor's running turns are cancelled (``on_eof``) and answered."""
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(agent.run)
                agent.feed(first)
                with self._input():
                    async for message in messages:
                        await agent.room()  # a pipelining editor waits in the pipe
                        if message is OVERSIZED:
                            self._enqueue(_TOO_LARGE)
                        else:
                            agent.feed(message)
                if self._on_eof is not None:
                    await self._on_eof()
                    self._on_eof = None
                with anyio.move_on_after(FLUSH_TIMEOUT):
                    await agent.idle()
                tg.cancel_scope.cancel()
        finally:
            run_closers(agent.closers)

    def _write_line(self, line: bytes) -> None:
        self._enqueue(line.removesuffix(b"\n"))

    async def _write_loop(self) -> None:
        try:
            async for batch in self._outbox.batches():
                for envelope in batch:
                    await self._stdout.send(envelope + b"\n")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            log.info("stdout closed; stopping")
            self._scope.cancel()

    def _enqueue(self, envelope: bytes) -> None:
        # After shutdown the outbox ignores offers: a turn that outlives the request notifies into nothing.
        if not self._outbox.offer(envelope) and not self._scope.cancel_called:
            log.error("stdout is not being read; stopping")
            self._scope.cancel()


@asynccontextmanager
async def stdio_streams() -> AsyncIterator[tuple[ByteSource, ByteSink]]:
    """The process's stdin and stdout as streams for ``serve_stdio``.

    While open, file descriptor 1 and ``sys.stdout`` point at stderr, so a stray ``print`` or a
    child process that inherits stdout cannot corrupt the protocol; the frames go to a private
    duplicate of the original stdout. Blocking reads and writes run in daemon threads, so a
    parent that stops reading (or never closes stdin) cannot keep the process from exiting.
    """
    protocol_fd = os.dup(1)
    saved_fd, saved_stdout = os.dup(1), sys.stdout
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    in_tx, in_rx = anyio.create_memory_object_stream[bytes](4)
    out_tx, out_rx = anyio.create_memory_object_stream[bytes](0)
    try:
        async with BlockingPortal() as portal:
            _daemon(_pump_in, 0, in_tx, portal)
            writer = _daemon(_pump_out, protocol_fd, out_rx, portal)
            try:
                yield in_rx, out_tx
            finally:
                out_tx.close()  # the writer thread sees EndOfStream after its last write
                in_rx.close()
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(writer.join, FLUSH_TIMEOUT)
                    await portal.stop(cancel_remaining=True)
    finally:
        sys.stdout = saved_stdout
        os.dup2(saved_fd, 1)
        os.close(saved_fd)


def _daemon(target: Callable[..., None], *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=f"stdio-{target.__name__}", daemon=True)
    thread.start()
    return thread


def _pump_in(fd: int, sender: Any, portal: BlockingPortal) -> None:
    try:
        while chunk := os.read(fd, READ_CHUNK):
            portal.call(sender.send, chunk)
    except (OSError, RuntimeError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass  # stdin failed, the portal stopped, or serve_stdio is done reading
    finally:
        _call_quietly(portal, sender.close)


def _pump_out(fd: int, receiver: Any, portal: BlockingPortal) -> None:
    try:
        while True:
            data = memoryview(portal.call(receiver.receive))
            while data:
                data = data[os.write(fd, data) :]
    except (OSError, RuntimeError, anyio.EndOfStream, anyio.ClosedResourceError):
        pass  # done, stdout closed (EPIPE), or the portal stopped
    finally:
        _call_quietly(portal, receiver.close)  # a later send fails instead of waiting forever
        os.close(fd)


def _call_quietly(portal: BlockingPortal, func: Callable[[], None]) -> None:
    try:
        portal.call(func)
    except RuntimeError:
        pass  # the portal already stopped
