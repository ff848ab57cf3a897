"""Cold start (bench case 6): what the bridge leaves for first use, and the collector around it.

Each check runs in a fresh interpreter, since what is imported and frozen is process-wide.
"""

from __future__ import annotations

import subprocess
import sys


def test_loading_the_configuration_and_building_the_app_leave_pydantic_for_later(tmp_path):
    """Cold start (bench case 6): pydantic, psutil and sse-starlette load on first use, and the
    collector is off until the heap is frozen; the first request needing params still validates."""
    (tmp_path / "cfg.yaml").write_text("providers: {}\n")
    script = f"""
import gc, sys
from bridge.heap import freeze_heap, pause_gc_for_start
pause_gc_for_start()
from bridge.cli import build_app
from bridge.config import load_config
build_app(load_config({str(tmp_path / "cfg.yaml")!r}))
early = sorted(m for m in ("pydantic", "psutil", "sse_starlette") if m in sys.modules)
assert early == [], early
assert not gc.isenabled()
freeze_heap(collect=False)
assert gc.isenabled()
from bridge.rpc.errors import InvalidParams
from bridge.methods import _models
from compat.params import validated
try:
    validated(_models().SessionRef, {{}})
except InvalidParams as exc:
    assert exc.to_error()["data"]["errors"][0]["loc"] == "sessionId", exc.to_error()
else:
    raise AssertionError("SessionRef accepted {{}}")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_heap_is_frozen_again_only_when_no_turn_runs(tmp_path):
    """After start, first-use modules load in a worker thread; a collection (a ~20 ms pause) and a
    freeze follow only at a moment ``idle()`` allows, and only when more modules have loaded."""
    script = """
import gc, sys, anyio
from bridge import heap
heap.SETTLE_INTERVAL = 0.01
heap.pause_gc_for_start()
heap.freeze_heap(collect=False)
frozen_at_start = gc.get_freeze_count()
idle = [False]

async def main():
    async with anyio.create_task_group() as tg:
        tg.start_soon(heap.settle_heap, lambda: idle[0])
        with anyio.fail_after(30):
            while not all(m in sys.modules for m in heap.FIRST_USE_MODULES):
                await anyio.sleep(0.01)
            for _ in range(20):  # busy: several checks pass without a freeze
                await anyio.sleep(0.01)
            assert gc.get_freeze_count() <= frozen_at_start, "froze while a turn ran"  # frozen objects may die
            idle[0] = True
            while gc.get_freeze_count() <= frozen_at_start:  # pydantic's objects join the frozen ones
                await anyio.sleep(0.01)
        assert "pydantic" in sys.modules and gc.isenabled()
        tg.cancel_scope.cancel()

anyio.run(main)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_failed_warm_up_is_logged_and_the_bridge_goes_on(tmp_path):
    script = """
import logging, sys, anyio
from bridge import heap
heap.SETTLE_INTERVAL = 0.01
heap.FIRST_USE_MODULES = ("no_such_module_xwm",)
logging.basicConfig(level=logging.WARNING)

async def main():
    with anyio.move_on_after(0.5):  # settle_heap runs for the server's life: it must not have ended
        await heap.settle_heap(lambda: True)
        raise AssertionError("settle_heap returned")

anyio.run(main)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "could not load" in done.stderr and "no_such_module_xwm" in done.stderr


def test_full_collections_wait_for_a_quiet_moment_or_the_period(tmp_path):
    """While turns run, CPython starts no full collection however many objects age (bench case 4:
    one was a 20-37 ms stall for every stream); settle_heap runs it when no turn runs, and
    ``FULL_COLLECTION_PERIOD`` after the last one at the latest. The young ones stay automatic."""
    script = """
import gc, sys, time, anyio
from bridge import heap
heap.SETTLE_INTERVAL = 0.01
heap.FIRST_USE_MODULES = ()
heap.FULL_COLLECTION_PERIOD = 3600.0
full, young = [], []
gc.callbacks.append(lambda phase, info: phase == "stop" and (full if info["generation"] == 2 else young).append(1))
idle = [False]
kept = []

def age_objects(count):  # enough survivors for several generation-1 collections
    kept.extend([[]] * 1 for _ in range(count))

async def main():
    async with anyio.create_task_group() as tg:
        tg.start_soon(heap.settle_heap, lambda: idle[0])
        await anyio.sleep(0.05)
        full.clear()
        with anyio.fail_after(30):
            for _ in range(20):
                age_objects(50_000)
                await anyio.sleep(0.01)
            assert young and not full, (len(young), len(full))  # busy: the young ones only
            idle[0] = True
            while not full:
                await anyio.sleep(0.01)
            idle[0] = False
            full.clear()
            heap.FULL_COLLECTION_PERIOD = 0.05
            age_objects(50_000)
            while not full:  # busy, but the period has passed
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert gc.get_threshold()[2] == 10, gc.get_threshold()  # CPython's own rule is back

anyio.run(main)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr


def test_serve_and_acp_stdio_shorten_the_gil_switch_interval(tmp_path):
    """Both long-running commands set ``GIL_SWITCH_INTERVAL`` before they start serving: with
    CPython's 5 ms the event loop waited up to 5 ms for the GIL after each system call while
    agent-starting threads ran (bench case 4: loop lag p99 72-137 ms against 19-33 ms)."""
    (tmp_path / "cfg.yaml").write_text("providers: {}\n")
    script = f"""
import sys
import bridge.server, bridge.stdio
from bridge import cli
seen = []
bridge.server.run = lambda config, app: seen.append(("serve", sys.getswitchinterval()))
async def serve_stdio(dispatcher, limits):
    seen.append(("acp-stdio", sys.getswitchinterval()))
bridge.stdio.serve_stdio = serve_stdio
default = sys.getswitchinterval()
assert cli.main(["serve", "--config", {str(tmp_path / "cfg.yaml")!r}]) == 0
sys.setswitchinterval(default)
assert cli.main(["acp-stdio", "--config", {str(tmp_path / "cfg.yaml")!r}]) == 0
assert default == 0.005 and seen == [("serve", cli.GIL_SWITCH_INTERVAL), ("acp-stdio", cli.GIL_SWITCH_INTERVAL)], seen
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
