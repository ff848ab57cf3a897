"""Small test helpers shared by the suites."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import anyio
import msgspec
import orjson

from bridge.config import BridgeConfig
from bridge.rpc.codec import encode_body
from bridge.server import BridgeServer, uvicorn_config

T = TypeVar("T")


def wire(value: Any) -> Any:
    """A result model (or anything holding them) as the wire object a client decodes."""
    return orjson.loads(encode_body(value))


def conforms(model: type[T], data: Any) -> T:
    """``data`` (a wire object) read as ``model``; raises ``msgspec.ValidationError`` when it does
    not fit (a missing field, a wrong type, an unknown field where the model forbids them)."""
    return msgspec.convert(data, model)


@contextlib.asynccontextmanager
async def in_background(manager: contextlib.AbstractAsyncContextManager[T]) -> AsyncIterator[T]:
    """Enter ``manager`` in its own task and exit it there.

    pytest-asyncio may run an async fixture's setup and teardown in different tasks, and anyio task
    groups must be exited in the task that entered them.
    """
    ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()

    async def hold() -> None:
        try:
            async with manager as value:
                ready.set_result(value)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    task = asyncio.create_task(hold())
    try:
        yield await asyncio.wait_for(asyncio.shield(ready), 30)
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


@contextlib.asynccontextmanager
async def real_server(config: BridgeConfig, app: Any) -> AsyncIterator[int]:
    """Run ``app`` under the bridge's uvicorn settings on 127.0.0.1; yields the port.

    The socket is bound and listening before uvicorn starts, so clients can connect at once
    (the backlog holds them until uvicorn accepts): no readiness polling.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = BridgeServer(uvicorn_config(msgspec.structs.replace(config, log_level="warning"), app))
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: server.serve(sockets=[sock]))
        try:
            yield sock.getsockname()[1]
        finally:
            server.should_exit = True  # uvicorn checks it every 0.1 s, also during startup
    sock.close()


_client_ids = itertools.count(1)


class WsClient:
    """A WebSocket client that collects notifications and returns responses by id."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.notes: list[dict[str, Any]] = []
        self.replies: dict[Any, dict[str, Any]] = {}
        self.changed = anyio.Event()

    async def pump(self) -> None:
        async for frame in self.ws:
            message = orjson.loads(frame)
            if "method" in message:
                self.notes.append(message)
            else:
                self.replies[message["id"]] = message
            self.changed.set()
            self.changed = anyio.Event()

    async def send(self, method: str, params: dict[str, Any]) -> int:
        request_id = next(_client_ids)
        await self.ws.send(
            orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).decode()
        )
        return request_id

    async def wait(self, predicate: Any, timeout: float = 20) -> None:
        with anyio.fail_after(timeout):
            while not predicate():
                await self.changed.wait()

    async def call(self, method: str, params: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
        request_id = await self.send(method, params)
        await self.wait(lambda: request_id in self.replies, timeout)
        return self.replies[request_id]

    def updates(self, turn_id: str | None = None) -> list[dict[str, Any]]:
        ups = [n["params"] for n in self.notes if n["method"] == "session.update"]
        return [u for u in ups if turn_id is None or u["turnId"] == turn_id]


@contextlib.asynccontextmanager
async def dispatcher_of(config: BridgeConfig) -> AsyncIterator[Any]:
    """The real orchestrator of ``config``, entered, and a dispatcher over it."""
    from bridge.methods import build_dispatcher
    from bridge.wiring import build_orchestrator

    async with build_orchestrator(config) as orch:
        yield build_dispatcher(orch)


async def rpc(dispatcher: Any, method: str, params: dict[str, Any], principal: str = "local") -> Any:
    """The result of one request as ``principal``, or ``{"error": …}``, as a client decodes it."""
    from bridge.dispatch import CallContext
    from bridge.rpc.codec import Request

    reply = await dispatcher.call(Request(1, method, params), CallContext(principal))
    assert reply is not None
    return {"error": reply.error} if reply.error is not None else wire(reply.result)


@contextlib.contextmanager
def serving(command: list[str], env: dict[str, str], cwd: Any) -> Any:
    """Run a bridge command until it logs "listening on"; SIGTERM it (then kill) afterwards."""
    import signal
    import subprocess

    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "listening on" in line:
                break
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        finally:
            proc.kill()
