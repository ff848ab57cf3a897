"""``compat.process.lines.LineFramer``: a child's stdout as bounded lines (field-failures #9),
with no I/O; and a real pipe that nobody reads, which stops the child rather than our memory.

* Lines split across chunks arrive whole and in order; ``\\r\\n`` ends a line too; an
  unterminated final line is delivered at end of file.
* A line over the bound, or unterminated data past it, fails the stream with ``LineTooLong``; a
  line of exactly the bound passes; the stream stays failed.
* However the bytes are split, the lines are the same (hypothesis).
"""

from __future__ import annotations

import sys

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from compat.process.env import child_env
from compat.process.lines import LineFramer, LineTooLong
from compat.process.spawn import spawn

WAIT = 10.0  # seconds: the bound on every wait below


def frame(chunks: list[bytes], max_line: int) -> list[bytes]:
    framer = LineFramer(max_line)
    lines = [line for chunk in chunks for line in framer.feed(chunk)]
    return lines + framer.finish()


def test_lines_arrive_whole_in_order_and_the_unterminated_last_one_at_eof() -> None:
    chunks = [b"one\ntw", b"o\r\nthree\n\n", b"fo", b"ur"]
    assert frame(chunks, 16) == [b"one", b"two", b"three", b"", b"four"]


@pytest.mark.parametrize("data", [b"123456789\n", b"123456789"])
def test_a_line_over_the_bound_fails_the_stream(data: bytes) -> None:
    framer = LineFramer(8)
    assert framer.feed(b"1234567\r\n12345678\n") == [b"1234567", b"12345678"]  # both pass the bound of 8
    assert framer.error is None
    assert framer.feed(b"ok\n" + data) == [b"ok"]  # the lines before it; 9 bytes fail without waiting for more
    assert framer.error is not None and framer.error.limit == 8
    with pytest.raises(LineTooLong):
        framer.feed(b"ok\n")  # the stream stays failed
    assert framer.finish() == [] and framer.buffered == 0


def test_what_is_held_of_an_unfinished_line_never_passes_the_bound() -> None:
    framer = LineFramer(1024)
    for _ in range(10):
        framer.feed(b"x" * 100)
    assert framer.buffered == 1000 and framer.error is None
    framer.feed(b"x" * 100)
    assert framer.error is not None and framer.buffered == 0


@given(
    st.lists(st.binary(max_size=40).filter(lambda b: b"\n" not in b), max_size=20),
    st.lists(st.integers(min_value=1, max_value=17), min_size=1, max_size=50),
)
def test_however_the_bytes_are_split_the_lines_are_the_same(lines: list[bytes], cuts: list[int]) -> None:
    data = b"".join(line + b"\n" for line in lines)
    chunks, start = [], 0
    for cut in cuts * (len(data) // max(1, sum(cuts)) + 1):
        if start >= len(data):
            break
        chunks.append(data[start : start + cut])
        start += cut
    chunks.append(data[start:])
    expected = [line[:-1] if line.endswith(b"\r") else line for line in lines]
    assert frame(chunks, 64) == expected


async def test_a_pipe_nobody_reads_stops_the_child_and_then_delivers_everything() -> None:
    """While nobody reads (no pumps), the child blocks on the full pipe; nothing is buffered by us.
    Once pumped, every line arrives."""
    lines, size = 4000, 100  # 400 KB: far more than a pipe holds
    script = f"import sys; sys.stdout.write(('x' * {size - 1} + '\\n') * {lines}); sys.stdout.flush()"
    process = await spawn(
        [sys.executable, "-c", script],
        cwd=None,
        env=child_env(),
        max_line_bytes=1024,
        stderr_tail_bytes=1024,
        stdin_pipe=False,
    )
    try:
        assert await process.wait(0.5) is None  # blocked on the full pipe
        seen: list[bytes] = []
        with anyio.fail_after(WAIT):
            await process.run(seen.append)
        assert len(seen) == lines and all(len(line) == size - 1 for line in seen)
        assert await process.wait(WAIT) == 0
    finally:
        await process.terminate(0.5)
