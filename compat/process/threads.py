"""The process layer's worker threads, apart from anyio's default limiter (40 threads shared by
every ``to_thread`` call in the bridge, process-table reads included).

- :func:`spawn_threads`: children start (``Popen`` up to ``exec``) on threads of their own, so a
  start never queues behind other work (bench case 4: 100 sessions at once once queued the last
  start ~750 ms behind the first).
- :func:`exit_waits`: where pidfds are missing, each live child's exit is waited for by a thread
  of its own (as asyncio's ``ThreadedChildWatcher`` does); from the default pool, 40 live
  children would have held every thread and stalled the next start.

One limiter per event loop (``anyio.lowlevel.RunVar``), as anyio keeps its default one.

Must not import: ``bridge`` or ``orchestrator``.
"""

from __future__ import annotations

import math

from anyio import CapacityLimiter
from anyio.lowlevel import RunVar

SPAWN_THREADS = 40
"""Children starting at once; more wait (a start holds its thread for milliseconds). With 8,
bench case 4's 100 starts queued and its delay p99 was 205 ms (38.7x the baseline); with 40,
28.7 ms (5.3x), on the 2-core machine of the issue-14 session."""

_spawn: RunVar[CapacityLimiter] = RunVar("xworkmate_spawn_threads")
_exit: RunVar[CapacityLimiter] = RunVar("xworkmate_exit_waits")


def spawn_threads() -> CapacityLimiter:
    """The threads children start on (:data:`SPAWN_THREADS`)."""
    return _get(_spawn, SPAWN_THREADS)


def exit_waits() -> CapacityLimiter:
    """Threads that wait for a child's exit where pidfds are missing: one per live child."""
    return _get(_exit, math.inf)


def _get(var: RunVar[CapacityLimiter], tokens: float) -> CapacityLimiter:
    try:
        return var.get()
    except LookupError:
        limiter = CapacityLimiter(tokens)
        var.set(limiter)
        return limiter
