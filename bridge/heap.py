"""Start-up and the garbage collector: the collector is off while the bridge builds what lives
until exit, then that heap is frozen out of its reach (``gc.freeze``), and what the first requests
would import is imported ahead, off the event loop.

bridge.cli calls :func:`pause_gc_for_start` before importing anything heavy, so this module
imports only the standard library at the top.
"""

from __future__ import annotations

import gc
import importlib
import logging

FIRST_USE_MODULES = ("orchestrator.models", "compat.knowledge.params", "psutil")
"""What the first requests would import on the event loop (pydantic and the params models: ~60 ms;
psutil with the first agent: ~6 ms), imported ahead by :func:`preload` in a worker thread."""


def pause_gc_for_start() -> None:
    """Stop the cyclic garbage collector until :func:`freeze_heap` (``gc.disable``).

    Start-up allocates modules, classes and the orchestrator, nearly all alive until exit, so the
    collections it triggers find little to free: with them off, ``serve`` answers its first request
    ~14 ms sooner (bench case 6). Reference counting still frees everything else.
    """
    gc.disable()


def freeze_heap() -> None:
    """Move every object alive now out of the collector's reach (``gc.freeze``) and turn the
    collector back on.

    What the bridge builds at start lives until exit, yet each full collection would walk all of it
    again; this is the use the CPython docs give for ``gc.freeze`` (bench case 2, 100 connections:
    full collections of ~65 ms before, under 1 ms after).
    """
    gc.freeze()
    gc.enable()


async def preload() -> None:
    """Import :data:`FIRST_USE_MODULES` in a worker thread, then freeze the heap again; a failure
    is only logged (the first request then imports what it needs, and reports it).

    Left young, the objects those imports build were walked by every generation-1 collection until
    they aged out: pauses of 40-170 ms on the event loop while 100 sessions streamed (bench case 4:
    delay p99 46-59 ms over five rounds without the second freeze, 14-43 ms over three with it).
    """
    import anyio.to_thread

    try:
        await anyio.to_thread.run_sync(_import_first_use_modules)
    except Exception as exc:
        logging.getLogger(__name__).warning("could not load %s ahead of use: %r", FIRST_USE_MODULES, exc)
    gc.freeze()  # what they built (pydantic's validators, psutil) joins the heap the collector skips


def _import_first_use_modules() -> None:
    for name in FIRST_USE_MODULES:
        importlib.import_module(name)
