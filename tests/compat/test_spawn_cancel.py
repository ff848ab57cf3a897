"""Starts queued behind the start thread (``compat.process.spawn``), through the ACP adapter as
turns and the bridge's stop reach them: a turn cancelled while its start waits starts no agent,
and an agent whose start finishes after the adapter stopped is ended, not left running."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from compat.acp.adapter import AcpAdapter
from compat.settings import Limits, Timeouts

from .conftest import TEST_TIMEOUTS, AgentFactory, RecordingSink, process_alive, turn_request, wait_gone


def _held_popen(monkeypatch: pytest.MonkeyPatch, pids: list[int]) -> tuple[threading.Event, threading.Event]:
    """Make each start wait on ``release`` once it is on the start thread (``entered``)."""
    from compat.process import spawn as spawn_module

    release, entered = threading.Event(), threading.Event()
    real_popen = spawn_module._popen

    def held_popen(*args: Any) -> Any:
        entered.set()
        release.wait(10)
        popen, fds = real_popen(*args)
        pids.append(popen.pid)
        return popen, fds

    monkeypatch.setattr(spawn_module, "_popen", held_popen)
    return release, entered


def _adapter(tmp_path: Path, limits: Limits) -> AcpAdapter:
    factory = AgentFactory(tmp_path, None)  # type: ignore[arg-type]
    return AcpAdapter("fake", factory.config(), limits, Timeouts(**TEST_TIMEOUTS))


async def test_turns_cancelled_while_their_starts_wait_start_no_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids: list[int] = []
    release, entered = _held_popen(monkeypatch, pids)
    adapter = _adapter(tmp_path, Limits(max_live_agents=100))
    with anyio.fail_after(20):
        async with anyio.create_task_group() as host:
            await host.start(adapter.run)
            async with anyio.create_task_group() as turns:
                for i in range(10):
                    turns.start_soon(adapter.open_session(f"s{i}").run_turn, turn_request(), RecordingSink())
                await anyio.to_thread.run_sync(entered.wait, 5)  # one start is on the thread, 9 wait
                turns.cancel_scope.cancel()
                release.set()
            assert len(pids) == 1  # the one already starting; the nine waiting started nothing
            await adapter.aclose()
            await wait_gone(pids)
            host.cancel_scope.cancel()


async def test_an_agent_started_after_the_adapter_stopped_is_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids: list[int] = []
    release, entered = _held_popen(monkeypatch, pids)
    adapter = _adapter(tmp_path, Limits())
    errors: list[BaseException] = []

    async def turn() -> None:
        try:
            await adapter.open_session("s1").run_turn(turn_request(), RecordingSink())
        except Exception as exc:
            errors.append(exc)

    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as outer:
                async with anyio.create_task_group() as host:
                    await host.start(adapter.run)
                    outer.start_soon(turn)
                    await anyio.to_thread.run_sync(entered.wait, 5)  # the start is on the start thread
                    host.cancel_scope.cancel()  # the bridge stops: the adapter's run() ends
                release.set()  # the child starts now, with no adapter to host it
            assert pids
            await wait_gone(pids)  # ended by start_connection, not left running
    finally:
        for pid in pids:
            if process_alive(pid):
                psutil.Process(pid).kill()
