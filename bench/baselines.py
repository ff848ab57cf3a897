"""The baseline server: the least a server on the bridge's stack (Starlette on uvicorn with
``bench.serveropts``, orjson) must do to answer what the benchmark clients send.

- ``GET /api/ping``: a static JSON body.
- ``POST /acp/rpc`` and WebSocket ``/acp``: parse the request with orjson and answer a static
  hybrid envelope carrying the request's ``id`` (the body is the bridge's ``acp.capabilities``
  result, captured by the runner, so both servers send the same bytes).
- ``session.start`` / ``session.message``: relay the lines of a ``bench/fast_agent.py`` child (one
  per ``sessionId``, kept across turns like the bridge keeps its agent) as ``session.update``
  envelopes padded to the size of the bridge's, then a static reply. Over HTTP with
  ``Accept: text/event-stream`` the same envelopes go out as SSE ``data:`` lines.

It does nothing else: no validation, auth, sessions or limits. Imports no ``bridge`` module.

Run: ``python -m bench.baselines --port N --result-file capabilities.json --relay-pad BYTES``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from bench.serveropts import SETTINGS, options

FAST_AGENT = str(Path(__file__).with_name("fast_agent.py"))
TURN_METHODS = ("session.start", "session.message")
_RESPONSE_PREFIX = b'{"jsonrpc":"2.0","id"'
_PING = orjson.dumps({"status": "ok"})
_TURN_RESULT = orjson.dumps({"success": True, "status": "completed"})


def result_envelope(id_bytes: bytes, body: bytes, seq: int) -> bytes:
    return b"".join(
        (
            b'{"jsonrpc":"2.0","id":',
            id_bytes,
            b',"result":',
            body,
            b',"ok":true,"type":"res","payload":',
            body,
            b',"seq":',
            b"%d" % seq,
            b"}",
        )
    )


def relay_envelope(line: bytes, seq: int, pad: bytes) -> bytes:
    """A ``session.update`` envelope around one agent line; ``pad`` brings it to the bridge's size."""
    return b"".join(
        (
            b'{"jsonrpc":"2.0","method":"session.update","params":',
            line,
            b',"type":"event","event":"session.update","payload":',
            line,
            b',"seq":',
            b"%d" % seq,
            b',"pad":"',
            pad,
            b'"}',
        )
    )


class AgentChild:
    """One fast-agent process, handshaken on first use; turns on it run one at a time."""

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    async def _start(self) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            FAST_AGENT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            limit=8 * 1024 * 1024,
        )
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(
            b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}\n'
            b'{"jsonrpc":"2.0","id":2,"method":"session/new","params":{}}\n'
        )
        await proc.stdout.readline()
        await proc.stdout.readline()
        return proc

    async def turn(self, prompt: str) -> AsyncIterator[bytes]:
        """The agent's lines for one prompt; the last one is the prompt's response."""
        async with self._lock:
            if self._proc is None:
                self._proc = await self._start()
            stdin, stdout = self._proc.stdin, self._proc.stdout
            assert stdin is not None and stdout is not None
            params = {"sessionId": "fast-1", "prompt": [{"type": "text", "text": prompt}]}
            stdin.write(orjson.dumps({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": params}) + b"\n")
            while line := (await stdout.readline()).rstrip(b"\n"):
                yield line
                if line.startswith(_RESPONSE_PREFIX):
                    return

    async def close(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
            await self._proc.wait()


class Baseline:
    """The baseline's state: the static result body, the relay padding and the agent children."""

    def __init__(self, result_body: bytes, relay_pad: int) -> None:
        self.result_body = result_body
        self.pad = b"x" * relay_pad
        self.children: dict[str, AgentChild] = {}

    async def envelopes(self, message: dict, id_bytes: bytes, first_seq: int) -> AsyncIterator[bytes]:
        """The envelopes answering one parsed request, numbered from ``first_seq``."""
        params = message.get("params") or {}
        if message.get("method") not in TURN_METHODS:
            yield result_envelope(id_bytes, self.result_body, first_seq)
            return
        child = self.children.setdefault(params.get("sessionId", ""), AgentChild())
        seq = first_seq
        async for line in child.turn(params.get("taskPrompt", "")):
            if line.startswith(_RESPONSE_PREFIX):
                yield result_envelope(id_bytes, _TURN_RESULT, seq)
            else:
                yield relay_envelope(line, seq, self.pad)
            seq += 1

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await asyncio.gather(*(child.close() for child in self.children.values()))

    async def ping(self, request: Request) -> Response:
        return Response(_PING, media_type="application/json")

    async def rpc(self, request: Request) -> Response:
        message = orjson.loads(await request.body())
        id_bytes = orjson.dumps(message.get("id"))
        envelopes = self.envelopes(message, id_bytes, 0)
        if "text/event-stream" in request.headers.get("accept", ""):
            return StreamingResponse(_sse(envelopes), media_type="text/event-stream")
        return Response(b"".join([e async for e in envelopes]), media_type="application/json")

    async def websocket(self, websocket: WebSocket) -> None:
        await websocket.accept()
        seq = [0]
        tasks: set[asyncio.Task] = set()

        async def answer(message: dict) -> None:
            async for envelope in self.envelopes(message, orjson.dumps(message.get("id")), seq[0]):
                seq[0] += 1
                await websocket.send_text(envelope.decode())

        try:
            while True:
                message = orjson.loads(await websocket.receive_text())
                if message.get("method") in TURN_METHODS:  # long: keep reading meanwhile
                    task = asyncio.create_task(answer(message))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                else:
                    await answer(message)
        except WebSocketDisconnect:
            for task in tasks:
                task.cancel()

    def app(self) -> Starlette:
        routes = [
            Route("/api/ping", self.ping),
            Route("/acp/rpc", self.rpc, methods=["POST"]),
            WebSocketRoute("/acp", self.websocket),
        ]
        return Starlette(routes=routes, lifespan=self.lifespan)


async def _sse(envelopes: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for envelope in envelopes:
        yield b"data: " + envelope + b"\n\n"
    yield b"data: [DONE]\n\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--result-file", help="JSON result body for non-turn requests (default {})")
    parser.add_argument("--relay-pad", type=int, default=0, help="bytes added to each relayed envelope")
    for name in SETTINGS:
        parser.add_argument(f"--{name}")
    args = parser.parse_args(argv)
    body = orjson.dumps(orjson.loads(Path(args.result_file).read_bytes())) if args.result_file else b"{}"
    baseline = Baseline(body, args.relay_pad)
    opts = options(**{name: getattr(args, name) for name in SETTINGS})
    uvicorn.run(baseline.app(), host="127.0.0.1", port=args.port, log_level="warning", **opts)


if __name__ == "__main__":
    main()
