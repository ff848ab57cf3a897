"""Finding everything a child started, so that ending it leaves nothing behind (field-failures
#15), without watching the process table while it runs.

Each child leads its own process group, which a group signal reaches as a whole. Descendants
can leave the group (``setsid``, ``setpgid``), and a descendant whose parent exits is re-parented.
On Linux the bridge makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``), so such
orphans are re-parented to the bridge instead of to init, where the bridge can still find them:

- at kill time, :func:`find_descendants` walks the leader's tree (while the leader lives) and adds
  the bridge's adopted children that carry the leader's *spawn mark*, an environment variable
  every child is started with (:data:`MARK_VARIABLE`, inherited by what it starts);
- :func:`reap_adopted` reaps the adopted children that exited, and only those it can tell are
  the bridge's own (in one of its agents' process groups, or seen with a spawn mark), so it never
  takes an exit status that other code in the process waits for (asyncio's child watcher, a
  ``subprocess.Popen`` of a library).

Without a subreaper (other systems, or a kernel that refuses it) the walk at kill time is the
fallback: it finds what left the group as long as its parent chain to the leader is intact.

Must not import: ``bridge`` or ``orchestrator``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import threading
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # psutil is imported with the first child, not at start (~6 ms, bench case 6)
    import psutil

logger = logging.getLogger(__name__)

MARK_VARIABLE = "XWORKMATE_BRIDGE_SPAWN"
"""The environment variable that carries a child's spawn mark (``<bridge pid>.<random>``)."""
_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h

_lock = threading.Lock()
_subreaper: bool | None = None
_leaders: set[int] = set()  # children started by the bridge and not yet reaped by their owner
_groups: set[int] = set()  # process groups those children lead; may outlive their leader
_marked: dict[int, str] = {}  # adopted children seen alive with a spawn mark, by pid


def new_mark() -> str:
    """A spawn mark for the next child."""
    return f"{os.getpid()}.{uuid.uuid4().hex[:16]}"


def become_subreaper() -> bool:
    """Make this process a child subreaper, once; whether it is one (Linux only)."""
    global _subreaper
    with _lock:
        if _subreaper is None:
            _subreaper = _set_subreaper()
        return _subreaper


def _set_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        ok = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        ok = False
    if not ok:
        logger.info("cannot become a child subreaper; orphaned descendants of agents are found only by their tree")
    return ok


def register(pid: int) -> None:
    """``pid`` is a child the bridge started, leading its own process group."""
    with _lock:
        _leaders.add(pid)
        _groups.add(pid)


def unregister(pid: int) -> None:
    """The child ``pid`` was reaped by its owner (its group may live on in descendants)."""
    with _lock:
        _leaders.discard(pid)


def is_ours(group: int) -> bool:
    """Whether ``group`` is the process group of a child the bridge started (and may still have
    members)."""
    with _lock:
        return group in _groups


def find_descendants(leader: int, mark: str, *, leader_alive: bool) -> list[psutil.Process]:
    """Everything the child ``leader`` started that still runs: its tree (while it lives) and the
    adopted children carrying ``mark`` (and their trees). Each entry is a ``psutil.Process``,
    which checks a pid was not reused before it is signalled. Reads the process table: call it
    when ending a child, not while it runs."""
    import psutil

    found: dict[int, psutil.Process] = {}
    if leader_alive:
        with contextlib.suppress(psutil.Error):
            for proc in psutil.Process(leader).children(recursive=True):
                found[proc.pid] = proc
    for proc in _adopted():
        if _mark_of(proc) == mark:
            found[proc.pid] = proc
            with contextlib.suppress(psutil.Error):
                for sub in proc.children(recursive=True):
                    found[sub.pid] = sub
    found.pop(leader, None)
    with _lock:  # ours: once they exit and are re-parented here, reap_adopted may reap them
        _marked.update(dict.fromkeys(found, mark))
    return list(found.values())


def reap_adopted() -> int:
    """Reap the adopted children that exited and are the bridge's own; returns how many.

    Adopted children alive now are remembered by their spawn mark, so they can be reaped once
    they exit (a zombie's environment can no longer be read). Groups with no member left are
    forgotten, so a reused process-group id is never taken for one of ours.
    """
    if not become_subreaper():
        return 0
    reaped = 0
    for proc in _adopted():
        pid = proc.pid
        if pid not in _marked and (mark := _mark_of(proc)) is not None:
            _marked[pid] = mark
        if not (pid in _marked or _group_of(pid) in _groups):
            continue  # not one of ours: its owner reaps it
        try:
            status = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            status = None  # somebody else reaped it meanwhile
            _marked.pop(pid, None)
        if status is not None:
            _marked.pop(pid, None)
            reaped += 1
    with _lock:
        for group in [g for g in _groups if g not in _leaders and not _group_alive(g)]:
            _groups.discard(group)
    return reaped


def _adopted() -> list[psutil.Process]:
    """This process's children that it did not start as agents (when it is a subreaper, what it
    adopted; without one, other code's children, which the callers filter by mark and group)."""
    import psutil

    try:
        children = psutil.Process().children()
    except psutil.Error:
        return []
    with _lock:
        leaders = set(_leaders)
    return [c for c in children if c.pid not in leaders]


def _mark_of(proc: psutil.Process) -> str | None:
    import psutil

    try:
        return proc.environ().get(MARK_VARIABLE)
    except (psutil.Error, OSError):
        return None  # a zombie has no environment any more; another user's is not readable


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
