"""Agent starts the bridge's stop or a cancel reaches while they wait, through the ACP adapter
as turns use it: a turn cancelled before its agent starts starts none, and an agent whose start
finishes after the adapter stopped is ended, not left running.

``compat.process.spawn`` starts a child without awaiting; the wait here stands for any await
before it (a turn waiting for ``maxLiveAgents``, a start that ever awaits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from compat.acp.adapter import AcpAdapter
from compat.settings import Limits, Timeouts

from .conftest import TEST_TIMEOUTS, AgentFactory, RecordingSink, process_alive, turn_request, wait_gone


def _held_start(monkeypatch: pytest.MonkeyPatch, pids: list[int]) -> tuple[anyio.Event, anyio.Event]:
    """Make each agent start wait for ``release`` (once one waits, ``entered`` is set), then start."""
    from compat.acp import connection as connection_module

    release, entered = anyio.Event(), anyio.Event()
    real_spawn, real_start = connection_module.spawn, connection_module.AcpConnection.start

    async def held_start(cls: Any, argv: Any, **kwargs: Any) -> Any:
        entered.set()
        await release.wait()
        return await real_start(argv, **kwargs)

    def recording_spawn(*args: Any, **kwargs: Any) -> Any:
        process = real_spawn(*args, **kwargs)
        pids.append(process.pid)
        return process

    monkeypatch.setattr(connection_module, "spawn", recording_spawn)
    monkeypatch.setattr(connection_module.AcpConnection, "start", classmethod(held_start))
    return release, entered


def _adapter(tmp_path: Path, limits: Limits) -> AcpAdapter:
    factory = AgentFactory(tmp_path, None)  # type: ignore[arg-type]
    return AcpAdapter("fake", factory.config(), limits, Timeouts(**TEST_TIMEOUTS))


async def test_turns_cancelled_while_their_starts_wait_start_no_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids: list[int] = []
    release, entered = _held_start(monkeypatch, pids)
    adapter = _adapter(tmp_path, Limits(max_live_agents=100))
    with anyio.fail_after(20):
        async with anyio.create_task_group() as host:
            await host.start(adapter.run)
            async with anyio.create_task_group() as turns:
                for i in range(10):
                    turns.start_soon(adapter.open_session(f"s{i}").run_turn, turn_request(), RecordingSink())
                await entered.wait()  # the starts wait
                turns.cancel_scope.cancel()
                release.set()
            assert pids == []  # the ten waiting started nothing
            await adapter.aclose()
            await wait_gone(pids)
            host.cancel_scope.cancel()


async def test_an_agent_started_after_the_adapter_stopped_is_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids: list[int] = []
    release, entered = _held_start(monkeypatch, pids)
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
                    await entered.wait()  # the start waits
                    host.cancel_scope.cancel()  # the bridge stops: the adapter's run() ends
                release.set()  # the child starts now, with no adapter to host it
            assert pids
            await wait_gone(pids)  # ended by start_connection, not left running
    finally:
        for pid in pids:
            if process_alive(pid):
                psutil.Process(pid).kill()
