"""Numbering of the envelopes sent on one stream (docs/api.md "Envelope": ``seq``).

A stream is one WebSocket connection, one HTTP response or one stdio process. ``seq`` is 0 for the
first envelope and +1 for each after it; a batch reply's elements take consecutive values. The
number is assigned when the envelope is handed to the sink, so the order of ``seq`` is the order
of the bytes on the wire.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bridge.rpc.codec import Reply, encode_notification
from bridge.rpc.errors import LimitReached

Sink = Callable[[bytes], None]


class EnvelopeStream:
    """Encodes replies and notifications with consecutive ``seq`` and passes them to ``sink``.

    Args:
        sink: called with each encoded frame; must not block (transports queue, bounded).
    """

    __slots__ = ("_seq", "_sink")

    def __init__(self, sink: Sink) -> None:
        self._sink = sink
        self._seq = 0

    def _next(self) -> int:
        seq = self._seq
        self._seq += 1
        return seq

    def reply(self, reply: Reply) -> None:
        self._sink(reply.encode(self._next()))

    def batch(self, replies: list[Reply], max_bytes: int | None = None) -> None:
        """Send ``replies`` as one array; when its elements together pass ``max_bytes``, one
        -32006 error (``id: null``, ``data.limit: "maxBatchReplyBytes"``) goes instead."""
        if not replies:
            return
        first = self._seq
        parts, size = [], 0
        for reply in replies:
            parts.append(encoded := reply.encode(self._next()))
            size += len(encoded)
            if max_bytes is not None and size > max_bytes:
                self._seq = first  # numbered as if the array had never been built
                error = LimitReached(
                    f"the batch's replies pass maxBatchReplyBytes ({max_bytes} bytes)",
                    limit="maxBatchReplyBytes",
                    value=max_bytes,
                )
                self.reply(Reply.from_error(None, error))
                return
        self._sink(b"[" + b",".join(parts) + b"]")

    def notify(self, method: str, params: Any) -> None:
        self._sink(encode_notification(method, params, self._next()))
