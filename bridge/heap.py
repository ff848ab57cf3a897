"""The garbage collector: off while the bridge builds what lives until exit, then that heap
frozen out of the collector's reach (and frozen again when more code has loaded), and full
collections moved off the streaming path.

bridge.cli calls :func:`pause_gc_for_start` before importing anything heavy, so this module
imports only the standard library at the top.
"""

from __future__ import annotations

import gc
import importlib
import logging
import sys
import time
from collections.abc import Callable

SETTLE_INTERVAL = 2.0
"""Seconds between two checks of :func:`settle_heap`."""
FULL_COLLECTION_PERIOD = 60.0
"""Seconds, at most, between two full collections while turns run (see :func:`settle_heap`)."""
_NO_AUTOMATIC_FULL = 1 << 30  # generation-2 threshold no count reaches: CPython never starts one
FIRST_USE_MODULES = ("orchestrator.models", "compat.knowledge.params", "psutil")
"""What the first requests would import on the event loop (pydantic and the params models: ~60 ms;
psutil with the first agent: ~6 ms), imported ahead by :func:`settle_heap` in a worker thread."""


def pause_gc_for_start() -> None:
    """Stop the cyclic garbage collector until :func:`freeze_heap` (``gc.disable``).

    Start-up allocates modules, classes and the orchestrator, nearly all alive until exit, so the
    collections it triggers find little to free (:func:`settle_heap`'s first collection frees
    what there is): with them off, ``serve`` answers its first
    request ~14 ms sooner (bench case 6: 172-182 ms against 159-165 ms, 3 runs each). Reference
    counting still frees everything else.
    """
    gc.disable()


def freeze_heap(*, collect: bool) -> None:
    """Move every object alive now out of the garbage collector's reach (``gc.freeze``).

    What the bridge builds at start (modules, classes, the orchestrator) lives until
    exit, yet each full collection walked all of it again: with 100 connections in flight,
    objects outlive the young generations and full collections ran ~5 times a second at ~65 ms
    each (bench case 2, 100 connections: gc callbacks measured 0.65 s of 2.3 s in generation 2,
    p99 66 ms; after freezing 0.4 ms per full collection, p99 9 ms, throughput +40%). This is
    the use the CPython docs give for ``gc.freeze``. ``collect`` first drops start-up garbage,
    which would otherwise be kept for good; it costs a pause of ~20 ms, so the first call
    (on the cold-start path) skips it. Turns the collector back on (:func:`pause_gc_for_start`).
    """
    if collect:
        gc.collect()
    gc.freeze()
    gc.enable()  # after pause_gc_for_start


async def settle_heap(idle: Callable[[], bool]) -> None:
    """Run for the server's life: import :data:`FIRST_USE_MODULES` in a worker thread, then, every
    :data:`SETTLE_INTERVAL` seconds, collect and freeze the heap when more modules have loaded
    since the last freeze (those, the MCP surface, an agent SDK) and ``idle()`` says no turn runs.

    A collection then takes ~20 ms on the event loop; during a turn it would stall every stream
    (bench case 4: one 20 ms stall in the middle of 100 streaming sessions, right where the
    start-up probes ended). Frozen objects are never collected, so only code that stays loaded
    should be frozen, not live sessions: another reason to wait for a quiet moment.

    Full (generation 2) collections are this loop's too, for the same reason: CPython starts one
    whenever objects promoted since the last outnumber a quarter of the old ones, which right
    after the freeze means as soon as the first sessions' state (tasks, cancel scopes, pipes:
    ~700 objects per streaming ACP session) has aged. With 100 sessions streaming that was one
    20-37 ms pause 3 s into their turns, and the ~150 chunks in flight behind it set the delay's
    p99 (bench case 4: 5-10 ms with it, 1.6-1.8 ms without, same runs otherwise). So while this
    runs CPython keeps the young collections (which free nearly all per-chunk garbage) and this
    loop runs the full one: at the first check with no turn running, and at the latest
    :data:`FULL_COLLECTION_PERIOD` seconds after the previous one, which bounds the cyclic
    garbage it can hold. Either only once a generation-1 collection has run since, moving its
    survivors into the old generation (``gc.get_count()[2]``).
    """
    import anyio
    import anyio.to_thread

    try:
        await anyio.to_thread.run_sync(_import_first_use_modules)
    except Exception as exc:  # only an optimisation: the first request imports what it needs (and reports it)
        logging.getLogger(__name__).warning("could not load %s ahead of use: %r", FIRST_USE_MODULES, exc)
    frozen = 0
    young0, young1, automatic = gc.get_threshold()
    gc.set_threshold(young0, young1, _NO_AUTOMATIC_FULL)
    last_full = time.monotonic()
    try:
        while True:
            if len(sys.modules) != frozen and idle():
                freeze_heap(collect=True)
                frozen, last_full = len(sys.modules), time.monotonic()
            elif gc.get_count()[2] and (idle() or time.monotonic() - last_full >= FULL_COLLECTION_PERIOD):
                gc.collect()
                last_full = time.monotonic()
            await anyio.sleep(SETTLE_INTERVAL)
    finally:
        gc.set_threshold(young0, young1, automatic)


def _import_first_use_modules() -> None:
    for name in FIRST_USE_MODULES:
        importlib.import_module(name)
