"""``compat.pacing.PassGate``: one caller per pass of the event loop, on both loops the bridge runs
on. A pass is counted by a callback that re-schedules itself: a callback scheduled in one pass
runs in the next."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from compat.pacing import PassGate, turn_ends

LOOPS = {"asyncio": asyncio.SelectorEventLoop, "uvloop": uvloop.new_event_loop}


def run_on(loop_name: str, main: Callable[[], Awaitable[Any]]) -> Any:
    with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
        return runner.run(asyncio.wait_for(main(), 10))


class Passes:
    """Counts the passes of the running loop from its creation on."""

    def __init__(self) -> None:
        self.count = 0
        self._loop = asyncio.get_running_loop()
        self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.count += 1
        self._loop.call_soon(self._tick)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_callers_arriving_together_go_through_one_per_pass_in_order(loop_name: str) -> None:
    async def main() -> list[tuple[int, int]]:
        passes, gate, through = Passes(), PassGate(), []

        async def caller(index: int) -> None:
            await gate.wait()
            through.append((index, passes.count))

        await asyncio.gather(*(caller(i) for i in range(5)))
        return through

    through = run_on(loop_name, main)
    assert [index for index, _ in through] == [0, 1, 2, 3, 4]
    at = [count for _, count in through]
    assert all(later > earlier for earlier, later in itertools.pairwise(at)), at


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_free_gate_costs_no_pass(loop_name: str) -> None:
    async def main() -> tuple[int, int, int]:
        passes, gate = Passes(), PassGate()
        before = passes.count
        await gate.wait()
        first = passes.count
        await asyncio.sleep(0.01)  # the gate is free again once a pass has gone by
        later = passes.count
        await gate.wait()
        return before, first, passes.count - later

    before, first, second = run_on(loop_name, main)
    assert first == before and second == 0


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_waiter_cancelled_before_its_pass_gives_it_on(loop_name: str) -> None:
    async def main() -> list[str]:
        gate, through = PassGate(), []

        async def caller(name: str) -> None:
            await gate.wait()
            through.append(name)

        first = asyncio.ensure_future(caller("first"))
        doomed = asyncio.ensure_future(caller("doomed"))
        last = asyncio.ensure_future(caller("last"))
        await asyncio.sleep(0)  # all three reached the gate; only "first" went through
        doomed.cancel()
        await asyncio.gather(first, last)
        assert doomed.cancelled()
        return through

    assert run_on(loop_name, main) == ["first", "last"]


def test_each_loop_has_its_own_turn_end_gate() -> None:
    async def main() -> PassGate:
        gate = turn_ends()
        assert turn_ends() is gate
        return gate

    assert run_on("asyncio", main) is not run_on("asyncio", main)
