"""The a2a-sdk side of the A2A surface in isolation: the bounded task store and the streaming
sink (bridge/a2a_server/executor.py), and the body read timeout of its endpoints."""

from __future__ import annotations

import socket

import anyio
import anyio.lowlevel
import pytest

from compat.base import StatusEvent, TextDelta
from tests.a2a.conftest import ALICE, Bridge

pytestmark = pytest.mark.timeout(60)


def context(name: str):
    from a2a.server.context import ServerCallContext

    from bridge.a2a_server.executor import _Principal

    return ServerCallContext(user=_Principal(name))


def task(task_id: str):
    from a2a.types.a2a_pb2 import Task

    return Task(id=task_id, context_id="ctx")


async def test_the_task_store_forgets_the_oldest_task_past_its_limit() -> None:
    from bridge.a2a_server.executor import BoundedTaskStore

    store = BoundedTaskStore(limit=2)
    alice, bob = context("alice"), context("bob")
    await store.save(task("t1"), alice)
    await store.save(task("t2"), bob)
    await store.save(task("t1"), alice)  # an update is not a new task
    assert await store.get("t1", alice) is not None
    await store.save(task("t3"), alice)
    assert await store.get("t1", alice) is None
    assert [t for t in ("t2", "t3") if await store.get(t, bob if t == "t2" else alice)] == ["t2", "t3"]
    assert await store.get("t3", bob) is None  # another principal's task


async def test_one_principal_cannot_push_out_anothers_tasks() -> None:
    from bridge.a2a_server.executor import BoundedTaskStore

    store = BoundedTaskStore(limit=10, per_principal=2)
    alice, bob = context("alice"), context("bob")
    await store.save(task("a1"), alice)
    for i in range(5):
        await store.save(task(f"b{i}"), bob)
    assert await store.get("a1", alice) is not None  # bob's flood evicted only bob's own tasks
    assert [i for i in range(5) if await store.get(f"b{i}", bob)] == [3, 4]


class Recorder:
    """Stands in for the SDK's ``TaskUpdater``: records each ``add_artifact``."""

    task_id = "task-1"

    def __init__(self) -> None:
        self.chunks: list[tuple[str, bool, bool]] = []
        self.release = anyio.Event()

    async def add_artifact(self, parts, artifact_id, name, append, last_chunk) -> None:
        self.chunks.append(("".join(p.text for p in parts), append, last_chunk))
        await self.release.wait()  # a slow client


async def test_the_sink_joins_deltas_while_the_client_is_slow_and_never_blocks_the_turn() -> None:
    from bridge.a2a_server.executor import StreamingSink

    updater = Recorder()
    async with StreamingSink(updater) as sink:
        sink.emit(TextDelta("one "))
        with anyio.fail_after(5):
            while not updater.chunks:
                await anyio.lowlevel.checkpoint()
        for text in ("two ", "three "):
            sink.emit(TextDelta(text))  # the first chunk is still being sent: these wait, joined
        sink.emit(StatusEvent("knowledge.plan", "", {}))
        updater.release.set()
    assert updater.chunks == [("one ", False, False), ("two three ", True, True)]


async def test_a_turn_with_no_text_publishes_no_answer_chunk() -> None:
    from bridge.a2a_server.executor import StreamingSink

    updater = Recorder()
    updater.release.set()
    async with StreamingSink(updater):
        pass
    assert updater.chunks == []


def test_a_body_that_stalls_is_408(bridge: Bridge, monkeypatch: pytest.MonkeyPatch) -> None:
    import bridge.a2a_server.app as app

    monkeypatch.setattr(app, "BODY_READ_TIMEOUT", 0.3)
    host, port = bridge.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        head = f"POST /a2a HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\nContent-Length: 100\r\n\r\n{{"
        sock.sendall(head.encode())
        reply = sock.recv(4096).decode()
    assert reply.startswith("HTTP/1.1 408")


async def test_the_handler_s_card_is_spec_compliant_so_the_sdk_logs_no_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The handler's own card names real endpoint URLs: with empty ones the SDK warned, on the
    first A2A request of every bridge, that the card is not spec-compliant."""
    from bridge.a2a_server.app import A2AApp
    from bridge.config import load_config

    config = load_config(None, {"host": "::1", "port": 8799})
    app = A2AApp(object(), config)
    assert app.base_url == "http://[::1]:8799"
    with caplog.at_level("WARNING"):
        await app.sdk()
    assert not [r for r in caplog.records if "spec-compliant" in r.getMessage()]
