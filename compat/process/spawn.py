"""Starting a local child: ``subprocess.Popen`` in a process group of its own, with pipes of the
bridge's own, and a spawn mark in its environment (``compat.process.descendants``).

``Popen`` runs on a thread of its own, one start at a time (``compat.process.threads``).
It uses ``vfork``, so a start copies none of the bridge's memory, but the caller waits until the
child reaches ``exec``. That is milliseconds (7 ms at p50 and up to 24 ms each while 100 agents
start at once on 2 cores), or as long as the file system or an on-access scanner holds the
``exec`` or the ``chdir``: in the event loop, one such start holds every request and stream of
the bridge (an ``exec`` held 3 s froze ``/api/ping`` for 2.9 s; on the thread, 0.00 s), and 100
starts at once held the loop for 1,048 ms in one stall (25 ms on the thread). The thread is also
why bench case 4's delay p99 is far over its target (20-23 ms against the baseline's 0.7-0.8):
streams already running go on during such a storm and share the CPUs with the agents still
starting. Starts in the loop measured 4.3-5.8 ms (4.7-5.1x, still failing), with the loop-lag
probe's p99 at 130-200 ms during the storm instead of 16, and the first chunk later (p50 0.95-1.16 s
instead of 0.73-0.79). One start at a time, not one per thread of anyio's pool of 40: 40
concurrent starts contended for the GIL and stalled the loop for 250-900 ms at a time; and not
on that pool, whose threads may all be busy.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Mapping, Sequence

import anyio

from bridge.rpc.redact import redact
from compat.process.child import AgentProcess
from compat.process.descendants import MARK_VARIABLE, become_subreaper, new_mark, register
from compat.process.threads import start_lock, start_thread

logger = logging.getLogger(__name__)


def _has_controlling_terminal() -> bool:
    try:
        os.close(os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY))
    except OSError:
        return False
    return True


NEW_SESSION = _has_controlling_terminal()
"""Whether children start in a new session (``setsid``) rather than only a new process group.

Either way each child leads its own process group, which is signalled as a whole. A session is new
only when the bridge has a controlling terminal, so that an agent's prompt on ``/dev/tty`` (ssh,
git, sudo) fails at once instead of stopping in the background (``SIGTTIN``) until the turn times
out. Otherwise children stay in the bridge's session: with autogroup scheduling (Linux's default
on desktops) every session is a scheduling group of its own, and N agents would get N shares of the
CPUs to the bridge's one.
"""


START_SLOT_WAIT = 30.0
"""Seconds a start waits for the one before it (100 starts at once take ~2.5 s on 2 cores). A start
that takes longer is held in ``exec`` or ``chdir`` by the file system (a hung network mount) and
cannot be cut off: the starts behind it fail with a :class:`SpawnError` that says so, instead of
each waiting out its turn's ``turnTimeout``."""


class SpawnError(Exception):
    """The command could not be started (not found, not executable, bad cwd)."""

    def __init__(self, command: str, reason: str) -> None:
        self.command = command
        self.reason = reason
        super().__init__(f"cannot start {command!r}: {reason}")


async def spawn(
    argv: Sequence[str],
    *,
    cwd: str | None,
    env: Mapping[str, str],
    max_line_bytes: int,
    stderr_tail_bytes: int,
    stdin_pipe: bool = True,
) -> AgentProcess:
    """Start ``argv`` as the leader of its own process group with piped stdout and stderr (and
    stdin, or ``/dev/null``); see :data:`NEW_SESSION` for its session.

    Args:
        argv: Command and arguments; ``argv[0]`` should already be resolved to a path.
        cwd: Working directory, or None for ours.
        env: The complete child environment (``compat.process.child_env``); the spawn mark is added.
        max_line_bytes: Bound for one stdout line, in bytes (``Limits.max_agent_line_bytes``).
        stderr_tail_bytes: How many trailing stderr bytes to keep (``Limits.stderr_tail_bytes``).
        stdin_pipe: False gives the child ``/dev/null`` as stdin (exec profiles, field-failures #14).

    Raises:
        SpawnError: The command is missing, empty or not executable, ``cwd`` does not exist,
            an argument or environment value holds a NUL byte (a client's ``model`` may), or the
            start before this one is stuck (:data:`START_SLOT_WAIT`).
    """
    if not argv or not argv[0]:
        raise SpawnError("", "no command")
    become_subreaper()
    mark = new_mark()
    child_env = {**env, MARK_VARIABLE: mark}
    try:
        popen, fds = await _start(argv, stdin_pipe, cwd, child_env)
    except OSError as exc:
        if cwd is not None and not os.path.isdir(cwd):
            raise SpawnError(argv[0], f"working directory does not exist: {cwd}") from exc
        raise SpawnError(argv[0], exc.strerror or type(exc).__name__) from exc
    except ValueError as exc:  # "embedded null byte": Popen refuses it before anything starts
        raise SpawnError(argv[0], "an argument or environment value contains a NUL byte") from exc
    register(popen.pid)
    logger.debug("spawned pid %d: %s", popen.pid, redact(" ".join(argv)))
    return AgentProcess(popen, fds, mark, max_line_bytes=max_line_bytes, stderr_tail_bytes=stderr_tail_bytes)


async def _start(
    argv: Sequence[str], stdin_pipe: bool, cwd: str | None, env: Mapping[str, str]
) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    """:func:`_popen` on the start thread, one start at a time. A caller cancelled while it waits
    for its turn starts nothing; a start, once begun, is finished and handed back.

    Raises:
        SpawnError: the start before it has not finished for :data:`START_SLOT_WAIT` seconds.
    """
    lock = start_lock()
    with anyio.move_on_after(START_SLOT_WAIT) as waiting:
        await lock.acquire()
    if waiting.cancelled_caught:
        raise SpawnError(
            argv[0],
            f"another agent's start has not finished for {START_SLOT_WAIT:g} s (its command or "
            "working directory may be on a file system that does not answer)",
        )
    try:
        with anyio.CancelScope(shield=True):
            return await anyio.to_thread.run_sync(_popen, argv, stdin_pipe, cwd, env, limiter=start_thread())
        raise AssertionError("unreachable: a shielded scope is never cancelled")  # for the type checker
    finally:
        lock.release()


def _popen(
    argv: Sequence[str], stdin_pipe: bool, cwd: str | None, env: Mapping[str, str]
) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    """``Popen`` with pipes of our own; returns the child and our ends (``stdout``, ``stderr``,
    ``stdin``), non-blocking. ``os.pipe`` makes them close-on-exec, so no other child inherits
    them; they are not Popen's, whose file objects would close them again when collected."""
    ours: dict[str, int] = {}
    theirs: list[int] = []
    try:
        for name in ("stdout", "stderr", "stdin") if stdin_pipe else ("stdout", "stderr"):
            read_end, write_end = os.pipe()
            ours[name], child_end = (write_end, read_end) if name == "stdin" else (read_end, write_end)
            theirs.append(child_end)
        popen = subprocess.Popen(
            list(argv),
            stdin=theirs[2] if stdin_pipe else subprocess.DEVNULL,
            stdout=theirs[0],
            stderr=theirs[1],
            cwd=cwd,
            env=dict(env),
            start_new_session=NEW_SESSION,
            process_group=None if NEW_SESSION else 0,
        )
    except BaseException:
        for fd in ours.values():
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    for fd in ours.values():
        os.set_blocking(fd, False)
    return popen, ours
