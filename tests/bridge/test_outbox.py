"""``bridge.outbox``: the bound counts what is queued and what the writer is still sending, and
an envelope larger than the bound is taken when nothing is buffered before it."""

from __future__ import annotations

import anyio

from bridge.outbox import Outbox


async def test_an_envelope_larger_than_the_bound_is_taken_when_nothing_is_buffered() -> None:
    outbox = Outbox(max_items=10, max_bytes=100)
    assert outbox.offer(b"x" * 500)
    assert not outbox.offer(b"y")  # 500 bytes before it: the client is behind
    outbox.close()
    assert [batch async for batch in outbox.batches()] == [[b"x" * 500]]


async def test_bytes_still_being_sent_count_against_the_bound() -> None:
    outbox = Outbox(max_items=10, max_bytes=100)
    assert outbox.offer(b"a" * 60) and outbox.offer(b"b" * 60)
    batches = outbox.batches()
    first = await anext(batches)  # the writer holds it: it is not sent yet
    assert first == [b"a" * 60, b"b" * 60] and outbox.buffered_bytes == 120
    assert not outbox.offer(b"c")  # once these bytes counted as gone as soon as the writer took them
    outbox.close()
    with anyio.fail_after(1):
        assert [batch async for batch in batches] == []  # the next ask: the batch was sent
    assert outbox.buffered_bytes == 0


async def test_the_count_bound_holds_too() -> None:
    outbox = Outbox(max_items=2, max_bytes=10_000)
    assert outbox.offer(b"1") and outbox.offer(b"2")
    assert not outbox.offer(b"3")
