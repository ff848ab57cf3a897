"""Raw asyncio protocols for the load clients: a WebSocket client and an HTTP/1.1 keep-alive
client that frame bytes without decoding them.

The clients share the machine's two cores with the server under test, so every byte of work they
skip is CPU the server gets: requests are pre-encoded once, frames are sent with the all-zero
masking key (RFC 6455 §5.3 lets the client pick any key; zero makes masking a no-op, which is
the whole point here), and incoming frames are handed on as ``(buffer, start, end)`` offsets.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

FrameHandler = Callable[["WsClient", bytearray, int, int], None]
ResponseHandler = Callable[["HttpClient", bytearray, int, int], None]
_OP_TEXT, _OP_BINARY, _OP_CLOSE, _OP_PING = 1, 2, 8, 9


def ws_frame(payload: bytes, opcode: int = _OP_TEXT) -> bytes:
    """A client frame (FIN, masked with the zero key) carrying ``payload``."""
    size = len(payload)
    if size < 126:
        head = bytes((0x80 | opcode, 0x80 | size))
    elif size < 65536:
        head = bytes((0x80 | opcode, 0x80 | 126)) + size.to_bytes(2, "big")
    else:
        head = bytes((0x80 | opcode, 0x80 | 127)) + size.to_bytes(8, "big")
    return head + b"\0\0\0\0" + payload


def upgrade_request(host: str, port: int, path: str) -> bytes:
    return (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: YmVuY2gtY2xpZW50LWtleQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


class WsClient(asyncio.Protocol):
    """One WebSocket connection; ``on_frame`` gets each data frame's offsets in the buffer.

    Attributes:
        opened: resolves when the server answered 101.
        closed: resolves when the connection is lost.
        sent: send times of requests awaiting a reply (the load modes use it as a FIFO).
    """

    def __init__(self, upgrade: bytes, on_frame: FrameHandler) -> None:
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.sent: deque[float] = deque()
        self.frames = 0
        self.transport: asyncio.Transport | None = None
        self._upgrade = upgrade
        self._on_frame = on_frame
        self._buf = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(self._upgrade)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(ConnectionError("closed before the upgrade"))
        if not self.closed.done():
            self.closed.set_result(None)

    def send(self, frame: bytes) -> None:
        assert self.transport is not None
        self.transport.write(frame)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        if not self.opened.done():
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            if not buf.startswith(b"HTTP/1.1 101"):
                self.opened.set_exception(ConnectionError(bytes(buf[:end]).decode("latin-1")))
                self.transport.close()  # type: ignore[union-attr]
                return
            del buf[: end + 4]
            self.opened.set_result(None)
        self._frames(buf)

    def _frames(self, buf: bytearray) -> None:
        # One pass over every complete frame, then one deletion: per-frame slicing of a large
        # buffer would copy it once per frame.
        pos, size = 0, len(buf)
        while size - pos >= 2:
            length = buf[pos + 1] & 0x7F
            head = 2
            if length == 126:
                if size - pos < 4:
                    break
                length, head = int.from_bytes(buf[pos + 2 : pos + 4], "big"), 4
            elif length == 127:
                if size - pos < 10:
                    break
                length, head = int.from_bytes(buf[pos + 2 : pos + 10], "big"), 10
            end = pos + head + length
            if end > size:
                break
            opcode = buf[pos] & 0x0F
            if opcode in (_OP_TEXT, _OP_BINARY, 0):
                self.frames += 1
                self._on_frame(self, buf, pos + head, end)
            elif opcode == _OP_PING:
                self.send(ws_frame(bytes(buf[pos + head : end]), 0xA))
            elif opcode == _OP_CLOSE:
                self.transport.close()  # type: ignore[union-attr]
            pos = end
        del buf[:pos]


def http_request(host: str, port: int, path: str, body: bytes, *, accept: str = "application/json") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: {accept}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class HttpClient(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection for responses with ``Content-Length`` (no chunking);
    ``on_response`` gets each response body's offsets."""

    def __init__(self, on_response: ResponseHandler) -> None:
        loop = asyncio.get_running_loop()
        self.connected: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.sent: deque[float] = deque()
        self.transport: asyncio.Transport | None = None
        self._on_response = on_response
        self._buf = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.connected.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def send(self, request: bytes) -> None:
        assert self.transport is not None
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        while True:
            head_end = buf.find(b"\r\n\r\n", pos)
            if head_end < 0:
                break
            at = buf.find(b"content-length:", pos, head_end)  # Starlette sends header names lowercase
            if at < 0:
                raise ValueError("a response without content-length")
            line_end = buf.find(b"\r\n", at, head_end + 2)
            end = head_end + 4 + int(buf[at + 15 : line_end])
            if end > len(buf):
                break
            self._on_response(self, buf, head_end + 4, end)
            pos = end
        del buf[:pos]
