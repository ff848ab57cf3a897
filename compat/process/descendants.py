"""Finding everything a child started, so that ending it leaves nothing behind (field-failures
#15), without watching the process table while it runs.

Each child leads its own process group, which a group signal reaches as a whole. Descendants
can leave the group (``setsid``, ``setpgid``), and a descendant whose parent exits is re-parented.
On Linux the bridge makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``), so such
orphans are re-parented to the bridge instead of to init, where the bridge can still find them:

- at kill time, :func:`find_descendants` walks the leader's tree (while the leader lives) and adds
  the bridge's adopted children that carry the leader's *spawn mark*, an environment variable
  every child is started with (:data:`MARK_VARIABLE`, inherited by what it starts);
- :func:`reap_orphans` reaps the adopted children that exited: at once those it can tell are the
  bridge's own (in one of its agents' process groups, or seen alive with a spawn mark), and any
  other that has been a zombie for a whole sweep interval (a daemon that called ``setsid`` and
  exited before anyone saw it: a zombie's environment can no longer be read). Code that waits for
  a child of its own (asyncio's child watcher, ``Popen.wait``) reaps it within milliseconds, long
  before that; a child nobody waits for would stay a zombie for the bridge's life.
  :func:`reap_orphans_forever` sweeps every :data:`ORPHAN_SWEEP` seconds once a child started,
  and ending a child sweeps too.

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
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from compat.telemetry import METRICS

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


_observers: list[tuple[Callable[[int], None], Callable[[int], None]]] = []


def observe(started: Callable[[int], None], reaped: Callable[[int], None]) -> Callable[[], None]:
    """Call ``started(pid)`` for each child the bridge starts and ``reaped(pid)`` once its owner
    reaped it (the session store records them, so a bridge killed with ``kill -9`` has its agents
    ended at its next start). Returns the function that stops it."""
    pair = (started, reaped)
    _observers.append(pair)
    return lambda: _observers.remove(pair) if pair in _observers else None


def live() -> int:
    """Children the bridge started that have not been reaped yet."""
    return len(_leaders)


METRICS.agents_live.set_function(live)


def register(pid: int) -> None:
    """``pid`` is a child the bridge started, leading its own process group."""
    with _lock:
        _leaders.add(pid)
        _groups.add(pid)
    METRICS.agents_started.inc()
    for started, _ in tuple(_observers):
        started(pid)


def unregister(pid: int) -> None:
    """The child ``pid`` was reaped by its owner (its group may live on in descendants)."""
    with _lock:
        _leaders.discard(pid)
    for _, reaped in tuple(_observers):
        reaped(pid)


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
        if _environ_mark(proc.pid) == mark:
            found[proc.pid] = proc
            with contextlib.suppress(psutil.Error):
                for sub in proc.children(recursive=True):
                    found[sub.pid] = sub
    found.pop(leader, None)
    with _lock:  # ours: once they exit and are re-parented here, reap_orphans reaps them at once
        _marked.update(dict.fromkeys(found, mark))
    return list(found.values())


ORPHAN_SWEEP = 10.0
"""Seconds between two sweeps for adopted children that exited (:func:`reap_orphans_forever`)."""

_reaping = threading.Lock()  # one sweep at a time (the periodic one, and the one after a kill)
_unclaimed: dict[int, float] = {}  # zombies not known to be ours: pid → when a sweep first saw it


def reap_orphans(unclaimed_for: float = ORPHAN_SWEEP) -> int:
    """Reap the adopted children that exited (see the module note); returns how many. Reads
    ``/proc``: call it from a worker thread.

    Args:
        unclaimed_for: seconds a zombie not known to be ours stays for its owner to reap it
            before the bridge does.

    Adopted children alive now are remembered by their spawn mark, so they can be reaped at once
    when they exit. Groups with no member left are forgotten, so a reused process-group id is
    never taken for one of ours.
    """
    global _unclaimed
    if not _subreaper:
        return 0
    with _reaping:
        now = time.monotonic()
        with _lock:
            leaders = set(_leaders)
        reaped = 0
        unclaimed: dict[int, float] = {}
        for pid in _children():
            if pid in leaders:
                continue  # its owner reaps it (``AgentProcess``)
            if not _is_zombie(pid):
                if (mark := _environ_mark(pid)) is not None:
                    with _lock:
                        _marked.setdefault(pid, mark)
                continue
            with _lock:
                ours = pid in _marked or _group_of(pid) in _groups
            seen = _unclaimed.get(pid, now)
            if not (ours or now - seen >= unclaimed_for):
                unclaimed[pid] = seen  # maybe another owner's, about to reap it
                continue
            try:
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG)
                reaped += 1
            except ChildProcessError:
                pass  # somebody else reaped it meanwhile
            with _lock:
                _marked.pop(pid, None)
        _unclaimed = unclaimed
        with _lock:
            for group in [g for g in _groups if g not in _leaders and not _group_alive(g)]:
                _groups.discard(group)
    return reaped


async def reap_orphans_forever(interval: float = ORPHAN_SWEEP) -> None:
    """Sweep with :func:`reap_orphans` every ``interval`` seconds, in a worker thread; sweeps
    only once the bridge is a subreaper (its first child started). Never returns."""
    import anyio
    import anyio.to_thread

    while True:
        await anyio.sleep(interval)
        if _subreaper:
            try:
                await anyio.to_thread.run_sync(reap_orphans, interval)
            except Exception:  # a sweep must never end the bridge's task group
                logger.exception("reaping adopted children failed")


def _children() -> list[int]:
    """This process's children: ``/proc/self/task/*/children`` (a file per thread, no walk of the
    process table), else psutil's walk where the kernel lacks those files."""
    pids: list[int] = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        tasks = []
    listed = False
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children", "rb") as f:
                pids += map(int, f.read().split())
            listed = True
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
    if listed:
        return pids
    import psutil

    try:
        return [c.pid for c in psutil.Process().children()]
    except psutil.Error:
        return []


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"Z"  # the state follows "(comm) "


def _environ_mark(pid: int) -> str | None:
    """The spawn mark in ``pid``'s environment, if it has one that can be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return None
    prefix = MARK_VARIABLE.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode("ascii", "replace")
    return None


def _adopted() -> list[psutil.Process]:
    """This process's children that it did not start as agents (when it is a subreaper, what it
    adopted; without one, other code's children, which the callers filter by mark and group)."""
    import psutil

    with _lock:
        leaders = set(_leaders)
    found = []
    for pid in _children():
        if pid not in leaders:
            with contextlib.suppress(psutil.Error):
                found.append(psutil.Process(pid))
    return found


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
