"""Starting a local child: ``subprocess.Popen`` in a process group of its own, with pipes of the
bridge's own, and a spawn mark in its environment (``compat.process.descendants``).

``Popen`` runs in the event loop, as ``anyio.open_process`` and asyncio's subprocesses do. It
uses ``vfork``, so a start copies none of the bridge's memory, and the loop waits only until the
child reaches ``exec``: a millisecond or two, 7-24 ms each while 100 agents start at once on
2 cores. Starting on a thread of its own instead let streams already running go on during such a
storm, but they then shared the CPUs with the agents still starting: bench case 4's delay p99 was
20-23 ms against the baseline's 0.7-0.8 (27-33x), and 4.3-4.6 ms (4.7x, 5 rounds) with starts in
the loop. The loop-lag probe's p99 during that storm rises from 16 to ~130 ms, and the first
chunk comes later (p50 0.73-0.79 s → 0.95-1.09 s, still before the baseline's 1.0-1.2 s).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Mapping, Sequence

from bridge.rpc.redact import redact
from compat.process.child import AgentProcess
from compat.process.descendants import MARK_VARIABLE, become_subreaper, new_mark, register

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


class SpawnError(Exception):
    """The command could not be started (not found, not executable, bad cwd)."""

    def __init__(self, command: str, reason: str) -> None:
        self.command = command
        self.reason = reason
        super().__init__(f"cannot start {command!r}: {reason}")


def spawn(
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
        SpawnError: The command is missing, not executable, or ``cwd`` does not exist.
    """
    become_subreaper()
    mark = new_mark()
    child_env = {**env, MARK_VARIABLE: mark}
    try:
        popen, fds = _popen(argv, stdin_pipe, cwd, child_env)
    except OSError as exc:
        if cwd is not None and not os.path.isdir(cwd):
            raise SpawnError(argv[0], f"working directory does not exist: {cwd}") from exc
        raise SpawnError(argv[0], exc.strerror or type(exc).__name__) from exc
    register(popen.pid)
    logger.debug("spawned pid %d: %s", popen.pid, redact(" ".join(argv)))
    return AgentProcess(popen, fds, mark, max_line_bytes=max_line_bytes, stderr_tail_bytes=stderr_tail_bytes)


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
