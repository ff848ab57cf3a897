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
freeze_heap()
assert gc.isenabled()
from bridge.rpc.errors import InvalidParams
from bridge.methods import METHODS
cancel = next(spec for spec in METHODS if spec.name == "session.cancel")
try:
    cancel.params.validate({{}})
except InvalidParams as exc:
    assert exc.to_error()["data"]["errors"][0]["loc"] == "sessionId", exc.to_error()
else:
    raise AssertionError("SessionRef accepted {{}}")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_first_use_modules_are_imported_ahead_in_a_worker_thread(tmp_path):
    """After start the first requests' imports (pydantic and the params models) happen in a worker
    thread, not on the event loop when the first session.start arrives."""
    script = """
import sys, threading, anyio
from bridge import heap
importers = []
real = heap._import_first_use_modules
heap._import_first_use_modules = lambda: (importers.append(threading.current_thread()), real())
anyio.run(heap.preload)
assert all(m in sys.modules for m in heap.FIRST_USE_MODULES)
assert importers and importers[0] is not threading.main_thread()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_failed_warm_up_is_logged_and_the_bridge_goes_on(tmp_path):
    script = """
import logging, anyio
from bridge import heap
heap.FIRST_USE_MODULES = ("no_such_module_xwm",)
logging.basicConfig(level=logging.WARNING)
anyio.run(heap.preload)  # returns: only logged
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "could not load" in done.stderr and "no_such_module_xwm" in done.stderr
