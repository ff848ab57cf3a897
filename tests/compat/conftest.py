"""Fixtures for the ACP adapter tests: adapters over the fake agent, a recording sink, and
bounded waits on OS state (process gone, log line written)."""

from __future__ import annotations

import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from compat.acp.adapter import AcpAdapter
from compat.base import TextDelta, TurnEvent, TurnRequest
from compat.settings import Limits, ProviderConfig, Timeouts
from orchestrator.registry import ProviderRegistry
from orchestrator.service import Orchestrator
from tests.helpers import in_background

FAKE_AGENT = Path(__file__).resolve().parents[1] / "fakes" / "fake_acp_agent.py"
TEST_TIMEOUTS = {
    "initialize_timeout": 5.0,
    "session_new_timeout": 5.0,
    "turn_timeout": 20.0,
    "cancel_grace": 1.0,
    "idle_timeout": 60.0,
}


class RecordingSink:
    """A ``TurnSink`` that records events; ``ask_permission`` answers ``answer`` or, with
    ``hold``, waits until the adapter cancels it."""

    def __init__(self, answer: str | None = None, *, hold: bool = False) -> None:
        self.events: list[TurnEvent] = []
        self.asked: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
        self.answer = answer
        self.hold = hold
        self.began = False
        self._changed = anyio.Event()

    def begin(self) -> None:
        self.began = True

    def emit(self, event: TurnEvent) -> None:
        self.events.append(event)
        self._changed.set()

    async def ask_permission(self, tool_call: dict[str, Any], options: list[dict[str, Any]]) -> str | None:
        self.asked.append((tool_call, options))
        self._changed.set()
        if self.hold:
            await anyio.sleep_forever()
        return self.answer

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TextDelta))

    def of(self, cls: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, cls)]

    async def wait_for(self, predicate: Callable[[RecordingSink], bool], timeout: float = 5.0) -> None:
        """Wait (bounded) until ``predicate(self)`` holds after some emit or permission ask."""
        with anyio.fail_after(timeout):
            while not predicate(self):
                self._changed = anyio.Event()
                await self._changed.wait()


def turn_request(prompt: str = "hello", cwd: Path | str = "/tmp", **fields: Any) -> TurnRequest:
    return TurnRequest(
        session_id="s1", thread_id="t1", turn_id=uuid.uuid4().hex, prompt=prompt, working_directory=str(cwd), **fields
    )


def read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def received(path: Path, method: str) -> list[dict[str, Any]]:
    return [e for e in read_log(path) if e.get("event") == "recv" and e.get("method") == method]


def process_alive(pid: int) -> bool:
    """Running and not a zombie (here PID 1 does not reap orphans, so killed grandchildren of
    a dead agent stay zombies: they are gone as far as we are concerned)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def wait_gone(pids: list[int], timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while any(process_alive(pid) for pid in pids):
            await anyio.sleep(0.02)  # polling OS state; no event exists for another's exit


async def wait_log(path: Path, predicate: Callable[[dict[str, Any]], bool], timeout: float = 5.0) -> dict[str, Any]:
    with anyio.fail_after(timeout):
        while True:
            for entry in read_log(path):
                if predicate(entry):
                    return entry
            await anyio.sleep(0.02)  # the fake agent writes its log from another process


class AgentFactory:
    """Builds running ``AcpAdapter``s (entered as services) that run the fake agent, and closes
    them after the test."""

    def __init__(self, tmp_path: Path, stack: contextlib.AsyncExitStack) -> None:
        self.log = tmp_path / "agent.log"
        self.state = tmp_path / "state.json"
        self.adapters: list[AcpAdapter] = []
        self._stack = stack

    def config(self, *modes: str, perm_kinds: str | None = None, **fields: Any) -> ProviderConfig:
        args = [str(FAKE_AGENT), "--log", str(self.log), "--state", str(self.state)]
        for mode in modes:
            args += ["--mode", mode]
        if perm_kinds is not None:
            args += ["--perm-kinds", perm_kinds]
        fields.setdefault("command", sys.executable)
        fields.setdefault("args", args)
        return ProviderConfig(label="Fake", **fields)

    async def __call__(
        self, *modes: str, limits: dict[str, Any] | None = None, timeouts: dict[str, Any] | None = None, **fields: Any
    ) -> AcpAdapter:
        """A running adapter (its task group hosts the agents' pumps)."""
        return await self._stack.enter_async_context(in_background(self._adapter(modes, limits, timeouts, fields)))

    async def orchestrator(
        self, *modes: str, limits: dict[str, Any] | None = None, timeouts: dict[str, Any] | None = None, **fields: Any
    ) -> Orchestrator:
        """A running orchestrator whose one provider, ``fake``, is an adapter of the fake agent:
        turns then end the way the bridge ends them (``orchestrator.machine``)."""
        adapter = self._adapter(modes, limits, timeouts, fields)
        orch = Orchestrator(
            ProviderRegistry({"fake": adapter}, {"fake"}),
            [Path("/").resolve()],
            adapter.limits,
            adapter.timeouts,
        )
        return await self._stack.enter_async_context(in_background(orch))

    def _adapter(
        self, modes: tuple[str, ...], limits: dict[str, Any] | None, timeouts: dict[str, Any] | None, fields: Any
    ) -> AcpAdapter:
        adapter = AcpAdapter(
            "fake",
            self.config(*modes, **fields),
            Limits(**(limits or {})),
            Timeouts(**{**TEST_TIMEOUTS, **(timeouts or {})}),
        )
        self.adapters.append(adapter)
        return adapter


@pytest.fixture
async def make_agent(tmp_path: Path) -> AsyncIterator[AgentFactory]:
    async with contextlib.AsyncExitStack() as stack:
        factory = AgentFactory(tmp_path, stack)
        yield factory
        with anyio.fail_after(20):
            for adapter in factory.adapters:
                await adapter.aclose()
