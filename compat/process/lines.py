"""Bounded lines out of a byte stream (field-failures.md #9), with no I/O: bytes in, lines out.

A line whose bytes before its ``\\n`` (a ``\\r`` there included) pass the bound fails the stream
with :class:`LineTooLong`, and so does unterminated data past it; an unterminated final line is
still delivered at end of file. A trailing ``\\r`` is dropped from each line.

Must not import: ``bridge`` or ``orchestrator``.
"""

from __future__ import annotations


class LineTooLong(Exception):
    """A stdout line (or unterminated data) exceeded the configured bound."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"agent stdout line longer than {limit} bytes")


class LineFramer:
    """Splits fed bytes into lines of at most ``max_line`` bytes.

    Args:
        max_line: bound for one line, in bytes: what comes before its ``\\n``.
    """

    __slots__ = ("_buffer", "_error", "_max", "_scanned")

    def __init__(self, max_line: int) -> None:
        self._max = max_line
        self._buffer = bytearray()
        self._scanned = 0  # bytes at the start of the buffer known to hold no newline
        self._error: LineTooLong | None = None

    @property
    def buffered(self) -> int:
        """Bytes of an unfinished line held (at most ``max_line``)."""
        return len(self._buffer)

    @property
    def error(self) -> LineTooLong | None:
        """Set once a line passed the bound; the stream yields nothing more."""
        return self._error

    def feed(self, data: bytes) -> list[bytes]:
        """The lines that ``data`` completes, in order, up to a line that passes the bound (then
        :attr:`error` is set: take the lines, then raise it).

        Raises:
            LineTooLong: the stream had already failed.
        """
        if self._error is not None:
            raise self._error
        buffer = self._buffer
        buffer += data
        lines: list[bytes] = []
        start = 0
        while (end := buffer.find(b"\n", max(start, self._scanned))) >= 0:
            if end - start > self._max:
                self._fail()
                return lines
            line = bytes(buffer[start:end])
            lines.append(line[:-1] if line.endswith(b"\r") else line)
            start = end + 1
            self._scanned = 0
        del buffer[:start]
        self._scanned = len(buffer)
        if len(buffer) > self._max:
            self._fail()
        return lines

    def finish(self) -> list[bytes]:
        """End of file: the unterminated final line, if any."""
        if self._error is not None or not self._buffer:
            return []
        line = bytes(self._buffer)
        self._buffer.clear()
        self._scanned = 0
        return [line[:-1] if line.endswith(b"\r") else line]

    def _fail(self) -> LineTooLong:
        self._error = LineTooLong(self._max)
        self._buffer.clear()
        return self._error
