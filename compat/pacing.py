"""One caller per pass of the event loop, for costly steps that many tasks reach at once.

The ends of turns are such a step. When 100 agents' turns end within ~20 ms (bench case 4), each
end (the adapter's wind-down, the ``done`` update, the result and the reply: ~0.4 ms of the loop
between them) was a ready task in the same passes of the loop, and the loop read no pipe until
all of them had run, so the updates still streaming for the other sessions waited behind them:
delay p99 of the last 250 ms of updates 3.5-4.7 ms, 79-91 of them over 1 ms (3 runs). Admitted
one per pass, the loop reads its pipes between two turn ends: 1.0-1.6 ms, 16-60 over 1 ms. The
work is the same; turn ends that arrive together end one after the other, as the CPU made them
do anyway (the last reply came 26-33 ms after its agent's result either way).

Must not import: ``bridge`` or ``orchestrator``.
"""

from __future__ import annotations

import asyncio
from collections import deque

from anyio.lowlevel import RunVar


class PassGate:
    """Admits one caller per pass of the event loop, in arrival order (asyncio loops only).

    A caller finding the gate free in this pass goes on at once, without a pass of its own; the
    others wait for a later pass each. A waiter cancelled before its pass gives the pass on.
    """

    def __init__(self) -> None:
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._taken = False  # a caller went through in this pass

    async def wait(self) -> None:
        """Return in a pass of the loop that no other caller of this gate has taken.

        Raises:
            Cancellation, while waiting (the pass then goes to the next waiter).
        """
        if not self._taken and not self._waiters:
            self._take()
            return
        admitted = asyncio.get_running_loop().create_future()
        self._waiters.append(admitted)
        await admitted

    def _take(self) -> None:
        self._taken = True
        asyncio.get_running_loop().call_soon(self._next_pass)  # runs in the next pass

    def _next_pass(self) -> None:
        self._taken = False
        while self._waiters:
            admitted = self._waiters.popleft()
            if not admitted.done():  # else cancelled while it waited
                admitted.set_result(None)  # its task resumes in the next pass, as does _next_pass
                self._take()
                return


_TURN_ENDS: RunVar[PassGate] = RunVar("compat.pacing turn ends")


def turn_ends() -> PassGate:
    """The event loop's gate for the ends of turns (a ``RunVar``: one per loop). Adapters pass
    it when their agent's result arrives, the orchestrator again before it finishes the turn."""
    try:
        return _TURN_ENDS.get()
    except LookupError:
        gate = PassGate()
        _TURN_ENDS.set(gate)
        return gate
