"""Shared fixtures for the transport tests: a Dispatcher with small test handlers, configs, and a
real uvicorn on an ephemeral 127.0.0.1 port."""

from __future__ import annotations

import warnings
from typing import Any

import anyio
import pytest

from bridge.config import BridgeConfig
from bridge.dispatch import CallContext, Dispatcher, Method
from bridge.rpc.errors import InvalidParams
from compat.settings import convert
from tests.helpers import real_server  # noqa: F401  (re-exported for the bridge tests)

with warnings.catch_warnings():  # Starlette 1.x asks for httpx2 in its test client; httpx works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient  # noqa: F401  (re-exported for the tests)

WAIT = 5.0  # seconds: upper bound for any single wait in these tests


class Handlers:
    """Test methods. Events are created lazily inside the running loop (anyio needs one)."""

    def __init__(self) -> None:
        self._events: dict[str, anyio.Event] = {}
        self.calls: list[tuple[str, Any, str]] = []
        self.contexts: list[CallContext] = []
        self.cancelled: list[str] = []

    def event(self, name: str) -> anyio.Event:
        if name not in self._events:
            self._events[name] = anyio.Event()
        return self._events[name]

    async def echo(self, params: dict, ctx: CallContext) -> Any:
        self.calls.append(("echo", params, ctx.principal))
        self.contexts.append(ctx)
        return params

    async def whoami(self, params: dict, ctx: CallContext) -> Any:
        return {"principal": ctx.principal}

    async def slow(self, params: dict, ctx: CallContext) -> Any:
        """Waits for ``release`` (same gate name); records a cancellation."""
        self.event(f"started:{params.get('gate', 'g')}").set()
        try:
            await self.event(params.get("gate", "g")).wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled.append("slow")
            self.event("slow-cancelled").set()
            raise
        return {"released": True}

    async def release(self, params: dict, ctx: CallContext) -> Any:
        self.event(params.get("gate", "g")).set()
        return {"ok": True}

    async def stream(self, params: dict, ctx: CallContext) -> Any:
        """Sends ``n`` notifications of ``size`` bytes, yielding to the loop between them unless
        ``burst`` (then all are queued before the writer can run)."""
        n, pad = int(params.get("n", 3)), "x" * int(params.get("size", 0))
        try:
            for i in range(n):
                ctx.notify("test.tick", {"i": i, "pad": pad} if pad else {"i": i})
                if not params.get("burst"):
                    await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class():
            self.cancelled.append("stream")
            self.event("stream-cancelled").set()
            raise
        return {"sent": n}

    async def record(self, params: dict, ctx: CallContext) -> Any:
        self.calls.append(("record", params, ctx.principal))
        self.event("recorded").set()
        return None

    async def fail(self, params: dict, ctx: CallContext) -> Any:
        raise RuntimeError("secret internal detail")

    async def unencodable(self, params: dict, ctx: CallContext) -> Any:
        return {"value": object()}  # a handler's bug: JSON cannot hold it

    async def needs_int(self, params: dict, ctx: CallContext) -> Any:
        if not isinstance(params.get("x"), int):
            raise InvalidParams("x must be an integer")
        return params["x"]

    def dispatcher(self) -> Dispatcher:
        names = ("echo", "whoami", "slow", "release", "stream", "record", "fail", "needs_int", "unencodable")
        return Dispatcher(Method(f"test.{name}", getattr(self, name)) for name in names)


@pytest.fixture
def handlers() -> Handlers:
    return Handlers()


@pytest.fixture
def dispatcher(handlers: Handlers) -> Dispatcher:
    return handlers.dispatcher()


def make_config(**values: Any) -> BridgeConfig:
    """A BridgeConfig from snake_case keys; ``limits`` may be a dict of overrides."""
    return convert(values, BridgeConfig)


def request(method: str, params: Any = None, id_: Any = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    if id_ is not None:
        message["id"] = id_
    return message
