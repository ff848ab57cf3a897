"""The process layer's worker threads, apart from anyio's default limiter (40 threads shared by
every ``to_thread`` call in the bridge, process-table reads included).

- :func:`exit_waits`: where pidfds are missing, each live child's exit is waited for by a thread
  of its own (as asyncio's ``ThreadedChildWatcher`` does); from the default pool, 40 live
  children would hold every thread, and every other ``to_thread`` call (the process-table reads
  that end an agent among them) would wait.
- :func:`start_lock` and :func:`start_thread`: children are started one at a time on a thread of
  their own, so the event loop runs while a start waits for the child to reach ``exec``
  (``compat.process.spawn``), and a start never waits for the default pool.

One limiter per event loop (``anyio.lowlevel.RunVar``), as anyio keeps its default one.

Must not import: ``bridge`` or ``orchestrator``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

from anyio import CapacityLimiter, Lock
from anyio.lowlevel import RunVar

T = TypeVar("T")
_exit: RunVar[CapacityLimiter] = RunVar("xworkmate_exit_waits")
_starts: RunVar[Lock] = RunVar("xworkmate_starts")
_start_thread: RunVar[CapacityLimiter] = RunVar("xworkmate_start_thread")


def _per_loop(var: RunVar[T], make: Callable[[], T]) -> T:
    """The event loop's value of ``var``, made on first use."""
    try:
        return var.get()
    except LookupError:
        value = make()
        var.set(value)
        return value


def exit_waits() -> CapacityLimiter:
    """Threads that wait for a child's exit where pidfds are missing: one per live child."""
    return _per_loop(_exit, lambda: CapacityLimiter(math.inf))


def start_lock() -> Lock:
    """Held while a child starts: one start at a time, so starts never contend for the GIL."""
    return _per_loop(_starts, Lock)


def start_thread() -> CapacityLimiter:
    """The thread a start runs on (held under :func:`start_lock`, so never waited for)."""
    return _per_loop(_start_thread, lambda: CapacityLimiter(1))
