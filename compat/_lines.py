"""Lines of a child's stdout, bounded, and handed over as the bytes arrive.

Rules from field-failures.md #9: a line whose bytes before its ``\\n`` (a ``\\r`` there included)
pass the bound fails the stream with :class:`LineTooLong`, and so does unterminated data past it;
an unterminated final line is still delivered at end of file. A trailing ``\\r`` is dropped from
the line handed over.

Two ways to take lines, one reader at a time: :meth:`LineReader.read_lines` hands each line to a
callback from the pipe's own data callback when the source can push (``set_receiver``, see
``compat._child.PipeReceiveStream``), else from a loop that pulls; :meth:`LineReader.receive_line`
returns one line at a time. Bytes nobody takes wait in the source, which stops reading past its
own bound.

Must not import: ``bridge`` or ``orchestrator``.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable

import anyio
import anyio.abc

LineConsumer = Callable[[bytes], None]


class LineTooLong(Exception):
    """A stdout line (or unterminated data) exceeded the configured bound."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"agent stdout line longer than {limit} bytes")


class LineReader:
    """Splits ``source`` into lines of at most ``max_line`` bytes.

    Args:
        source: The child's stdout. With a ``set_receiver`` method (``PipeReceiveStream``) it
            pushes its bytes while someone reads; any other stream is pulled.
        max_line: Bound for one line, in bytes: what comes before its ``\\n``.
    """

    def __init__(self, source: anyio.abc.ByteReceiveStream, max_line: int) -> None:
        self._source = source
        self._push: Callable[[Callable[[bytes], None] | None], None] | None = getattr(source, "set_receiver", None)
        self._max = max_line
        self._buffer = bytearray()
        self._scanned = 0  # bytes at the start of the buffer known to hold no newline
        self._eof = False
        self._error: LineTooLong | None = None
        self._raised: Exception | None = None  # by the consumer, during a pushed delivery
        self._consumer: LineConsumer | None = None
        self._ended_event = asyncio.Event()  # set by a pushed delivery that ended the reading
        self._reading = False
        self._context: contextvars.Context | None = None  # what pushed deliveries run in

    async def read_lines(self, consumer: LineConsumer) -> None:
        """Call ``consumer(line)`` for every line, in order, until end of file.

        Pushed lines are handed over from the pipe's data callback, so ``consumer`` must not
        block; an exception it raises ends the reading and is raised here. It runs in this task's
        context, with the async library named for anyio (sniffio finds it through the current
        task, which a data callback has not): ``anyio.Event()`` and ``TaskGroup.start_soon``
        work there, what needs a current task (cancel scopes) does not. Cancelling stops the
        reading once the cancellation reaches this task (lines arriving before that are still
        handed over); bytes not yet handed over stay for the next reader.

        Raises:
            LineTooLong: A line passed the bound (the stream is unusable from then on).
        """
        self._begin()
        self._consumer = consumer
        try:
            self._deliver()
            if self._push is not None:
                self._context = _callback_context()
                self._push(self._feed)
                while not self._ended():
                    self._ended_event.clear()
                    await self._ended_event.wait()
            else:
                while not self._ended():
                    await self._pull()
                    self._deliver()
        finally:
            self._consumer = None
            if self._push is not None:
                self._push(None)
            self._reading = False
        raised, self._raised = self._raised, None
        if raised is not None:
            raise raised
        if self._error is not None:
            raise self._error

    async def receive_line(self) -> bytes:
        """The next line, without its ``\\n`` (and a trailing ``\\r``).

        Raises:
            LineTooLong: The line, or unterminated data, passed the bound.
            anyio.EndOfStream: End of file and no data left; an unterminated final line is
                returned first.
        """
        self._begin()
        try:
            while True:
                line = self._next_line()
                if line is not None:
                    return line
                if self._eof:
                    raise anyio.EndOfStream
                await self._pull()
        finally:
            self._reading = False

    # ---- framing ------------------------------------------------------------------------------

    def _next_line(self) -> bytes | None:
        if self._error is not None:
            raise self._error
        buffer = self._buffer
        end = buffer.find(b"\n", self._scanned)
        if end < 0:
            self._scanned = len(buffer)
            if len(buffer) > self._max:
                raise self._fail()
            if not self._eof or not buffer:
                return None
            end = len(buffer)  # the unterminated final line
        elif end > self._max:
            raise self._fail()
        line = bytes(buffer[:end])
        del buffer[: end + 1]
        self._scanned = 0
        return line[:-1] if line.endswith(b"\r") else line

    def _fail(self) -> LineTooLong:
        self._error = LineTooLong(self._max)
        self._buffer.clear()
        return self._error

    def _deliver(self) -> None:
        consumer = self._consumer
        while consumer is not None and self._consumer is consumer:
            try:
                line = self._next_line()
            except LineTooLong:
                break
            if line is None:
                break
            consumer(line)

    def _ended(self) -> bool:
        return self._error is not None or self._raised is not None or (self._eof and not self._buffer)

    # ---- input --------------------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        """The source's push callback; ``b""`` is end of file."""
        if data:
            self._buffer += data
        else:
            self._eof = True
        try:
            assert self._context is not None
            self._context.run(self._deliver)
        except Exception as exc:
            # From the consumer: the pipe's data callback must not see it (the transport would
            # close the pipe); read_lines raises it instead.
            self._raised = exc
            self._consumer = None
        if self._ended():
            self._ended_event.set()

    async def _pull(self) -> None:
        try:
            data = await self._source.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._eof = True
            return
        self._buffer += data

    def _begin(self) -> None:
        if self._reading:
            raise RuntimeError("another task is already reading these lines")
        self._reading = True
        self._raised = None  # a consumer's error whose reader was cancelled before raising it


def _callback_context() -> contextvars.Context:
    """A copy of the current task's context in which sniffio names the running async library."""
    context = contextvars.copy_context()
    try:
        import sniffio
    except ImportError:  # anyio then asks asyncio for the running loop, which a callback has
        return context
    context.run(sniffio.current_async_library_cvar.set, sniffio.current_async_library())
    return context
