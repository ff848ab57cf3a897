"""The baseline of case 8: a minimal ACP client that drives ``bench/fast_agent.py`` itself, with no
bridge in between, as an editor talking ACP to an agent would (spawn, ``initialize``,
``session/new``, ``session/prompt``, then the ``session/update`` lines and the prompt response).

Both sides of case 8 time a request with an :class:`Exchange`: the frame (bridge) or line (agent)
is timestamped in the protocol callback that receives it, before any parsing, so neither side
pays a wake-up of a coroutine the other does not. Lines are split on a raw pipe protocol and
handed on as offsets, like the WebSocket frames of ``bench.wire``; only responses are parsed.

The fast agent sends its client no requests (no permissions, no file system), so every line that
starts with an ``id`` is a response.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import os
import subprocess
import time
from typing import Any

import orjson

RESPONSE_PREFIX = b'{"jsonrpc":"2.0","id"'  # a response, from the bridge or the agent
AGENT_DELTA = b'"sessionUpdate":"agent_message_chunk"'  # in the agent's session/update lines
CLOSE_TIMEOUT = 10.0  # seconds for the agent to exit once its stdin is closed, then it is killed


class Exchange:
    """One request in flight: when its timer started, its first delta and its response arrived.

    Attributes:
        started: ``perf_counter`` seconds when the timer started (before the send, or before the
            agent's spawn for a cold direct turn).
        first: ``perf_counter`` seconds at the first message holding ``delta``, or None.
        done: ``perf_counter`` seconds at the response, or None.
        reply: resolves with the response's bytes.
    """

    def __init__(self, started: float, delta: bytes) -> None:
        self.started = started
        self.first: float | None = None
        self.done: float | None = None
        self.reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._delta = delta

    def received(self, buf: bytearray, start: int, end: int) -> None:
        """Timestamp one message (``buf[start:end]``) of this exchange."""
        now = time.perf_counter()
        if buf.startswith(RESPONSE_PREFIX, start):
            if not self.reply.done():
                self.done = now
                self.reply.set_result(bytes(buf[start:end]))
        elif self.first is None and buf.find(self._delta, start, end) >= 0:
            self.first = now

    def first_seconds(self) -> float | None:
        return None if self.first is None else self.first - self.started

    def result_seconds(self) -> float | None:
        return None if self.done is None else self.done - self.started


class _AgentPipe(asyncio.Protocol):
    """The agent's stdout split into lines, each handed to the exchange in flight as offsets."""

    def __init__(self) -> None:
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.exchange: Exchange | None = None
        self._buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        while (newline := buf.find(b"\n", pos)) >= 0:
            if self.exchange is not None:
                self.exchange.received(buf, pos, newline)
            pos = newline + 1
        del buf[:pos]  # one deletion per read, as in bench.wire

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class DirectAgent:
    """One agent process driven over ACP on its stdin/stdout, one request at a time.

    The agent starts with ``subprocess.Popen`` on the event loop and its pipes are then attached
    to the loop: ``Popen`` uses ``vfork`` (0.6 ms on the bench machine, median of 15), where
    uvloop's ``subprocess_exec`` forks the whole client (4.7 ms); the bridge starts its agents
    with ``Popen`` too, so the baseline carries no spawn cost the bridge does not. Blocking the
    loop for the spawn costs nothing: the client is waiting for this agent alone.
    """

    def __init__(self, popen: subprocess.Popen[bytes], stdin: asyncio.WriteTransport, pipe: _AgentPipe) -> None:
        self._popen = popen
        self._stdin = stdin
        self._pipe = pipe
        self._ids = itertools.count(1)
        self.session_id = ""

    @classmethod
    async def spawn(cls, argv: list[str], cwd: str) -> DirectAgent:
        """Start the agent (no handshake yet).

        Raises:
            OSError: the command or ``cwd`` is missing (from ``Popen``).
        """
        loop = asyncio.get_running_loop()
        stdin_read, stdin_write = os.pipe()  # close-on-exec: the agent gets them as 0 and 1 only
        stdout_read, stdout_write = os.pipe()
        try:
            popen = subprocess.Popen(argv, stdin=stdin_read, stdout=stdout_write, stderr=subprocess.DEVNULL, cwd=cwd)
        except BaseException:
            os.close(stdin_write)
            os.close(stdout_read)
            raise
        finally:
            os.close(stdin_read)
            os.close(stdout_write)
        _, pipe = await loop.connect_read_pipe(_AgentPipe, _pipe_file(loop, stdout_read, "rb"))
        stdin, _ = await loop.connect_write_pipe(asyncio.BaseProtocol, _pipe_file(loop, stdin_write, "wb"))
        return cls(popen, stdin, pipe)

    async def request(self, method: str, params: dict[str, Any], started: float | None = None) -> Exchange:
        """Send one request and wait for its response.

        Args:
            method: the ACP method.
            params: its params.
            started: ``perf_counter`` seconds to time from (default: just before the write).

        Returns:
            The exchange, complete.
        """
        line = orjson.dumps({"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params}) + b"\n"
        exchange = Exchange(time.perf_counter() if started is None else started, AGENT_DELTA)
        self._pipe.exchange = exchange
        self._stdin.write(line)
        await asyncio.wait([exchange.reply, self._pipe.closed], return_when=asyncio.FIRST_COMPLETED)
        self._pipe.exchange = None
        if not exchange.reply.done():
            raise ConnectionError(f"the agent exited during {method}")
        return exchange

    async def open_session(self, cwd: str) -> None:
        """``initialize``, then ``session/new``; keeps the agent's session id."""
        await self.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        exchange = await self.request("session/new", {"cwd": cwd, "mcpServers": []})
        self.session_id = orjson.loads(exchange.reply.result())["result"]["sessionId"]

    async def prompt(self, text: str, started: float | None = None) -> Exchange:
        """One ``session/prompt`` on the open session (see :meth:`request` for ``started``)."""
        params = {"sessionId": self.session_id, "prompt": [{"type": "text", "text": text}]}
        return await self.request("session/prompt", params, started)

    async def close(self) -> None:
        """Close the agent's stdin and wait for it to exit (bounded, then killed)."""
        self._stdin.close()
        try:
            await asyncio.wait_for(asyncio.shield(self._pipe.closed), CLOSE_TIMEOUT)
        except TimeoutError:
            self._popen.kill()
            await self._pipe.closed
        self._popen.wait(CLOSE_TIMEOUT)  # its stdout is closed: it has exited, or is about to


def _pipe_file(loop: asyncio.AbstractEventLoop, fd: int, mode: str) -> io.FileIO:
    """A file object for a pipe transport of ``loop`` that sees ``fd`` closed exactly once.

    uvloop's pipe transports close the descriptor themselves and then call the file object's
    ``close()`` as well; asyncio's only call ``close()``. A second close could hit the number
    reused meanwhile by the next agent's pipe.
    """
    uvloop = any(cls.__module__.partition(".")[0] == "uvloop" for cls in type(loop).__mro__)
    return io.FileIO(fd, mode, closefd=not uvloop)


def stop_reason(exchange: Exchange) -> str:
    """The turn's status as the bridge would name it: ``completed`` for ``end_turn``."""
    response = orjson.loads(exchange.reply.result())
    reason = (response.get("result") or {}).get("stopReason", "error")
    return "completed" if reason == "end_turn" else reason
