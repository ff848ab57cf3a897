"""Local child processes for adapters: spawn in a process group, drain stderr, read bounded lines,
terminate without leaving anything behind.

Shared by every adapter that runs a local command (ACP agents, exec profiles). The rules come
from field-failures.md: stderr is always drained into a bounded tail (#13), stdout lines are
bounded and an unterminated final line is still delivered (#9), the child gets its own process
group so a kill reaches launcher wrappers and grandchildren (#15), and every wait is bounded.

Descendants that call ``setsid`` leave the group, and once the leader is reaped they are
re-parented out of reach. So while the agent works, :meth:`AgentProcess.track_descendants` keeps
a snapshot of its descendants (pid and start time, via psutil, refreshed about once a second and
whenever the owner calls :meth:`AgentProcess.refresh_descendants`), and
:meth:`AgentProcess.terminate` signals the group and every snapshot entry still running. On Linux
the snapshot walks ``/proc/<pid>/task/<tid>/children`` from the leader down (a few small reads,
on the event loop); elsewhere it reads the whole process table in a worker thread.

The caller hosts the pumps: it runs :meth:`AgentProcess.pump_stderr` in a task group it owns and
reads stdout with :meth:`AgentProcess.read_lines` (or :meth:`AgentProcess.receive_line`). Between
pumps the pipes keep buffering (up to about 128 KiB each), so a briefly idle reader never blocks
the child.

Secrets in stderr: the tail is redacted as a whole and only then cut to the size a client sees,
and every cut starts on a line boundary (:func:`cut_tail`), so no part of a secret that a cut
would split is ever shown.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import anyio.to_thread

from bridge.rpc.redact import redact, register_env_secrets
from compat._child import PidfdProcess, pidfd_works
from compat._lines import LineConsumer, LineReader

if TYPE_CHECKING:  # psutil is imported with the first child, not at start (~6 ms, bench case 6)
    import psutil

logger = logging.getLogger(__name__)

ENV_ALLOW = (
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "TZ",
    "TMPDIR",
    "SSL_CERT_FILE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
)
ENV_ALLOW_PREFIXES = ("LC_", "XDG_")
ENV_NEVER = frozenset({"BRIDGE_AUTH_TOKEN"})
"""Never handed to a child, even when an operator lists it: it would let the agent drive us."""

_KILL_WAIT = 2.0  # seconds to wait for the leader after SIGKILL (it cannot ignore it)
_PREVIEW_CHARS = 300
_SCAN_RAMP = (0.05, 0.1, 0.2, 0.4, 0.8)  # seconds between the first descendant scans: launchers
_SCAN_EVERY = 1.0  # fork early, and a short-lived leader must not take its tree out of view
_SCAN_JITTER = 0.5
"""Each wait between two scans is its delay times a random factor in 1 ± this. Agents whose
turns start together would otherwise scan in the same milliseconds: with 100 streaming (bench
case 4) every scan time was a burst of ~5 ms on the event loop, and the updates arriving in it
(about 20 per burst, seven bursts a turn) were a large part of the samples over the relay's
delay p99."""
_BLANK = re.compile(r"\s")
_PIDFD = pidfd_works()


def cut_tail(text: str, max_bytes: int) -> str:
    """The end of ``text`` in at most ``max_bytes`` UTF-8 bytes, starting on a line boundary.

    The first, partial line of the cut is dropped (when the cut holds no newline: up to the first
    whitespace, and with none, everything), so a secret the cut would split never shows in part.
    Redact ``text`` before cutting it.
    """
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    if max_bytes <= 0:
        return ""
    kept = data[-max_bytes:].decode("utf-8", "ignore")  # "ignore": a split first character
    if data[-max_bytes - 1 : -max_bytes] == b"\n":
        return kept  # the cut fell on a line boundary
    return _drop_partial_head(kept)


def _drop_partial_head(text: str) -> str:
    newline = text.find("\n")
    if newline >= 0:
        return text[newline + 1 :]
    blank = _BLANK.search(text)
    return text[blank.end() :] if blank else ""


class SpawnError(Exception):
    """The command could not be started (not found, not executable, bad cwd)."""

    def __init__(self, command: str, reason: str) -> None:
        self.command = command
        self.reason = reason
        super().__init__(f"cannot start {command!r}: {reason}")


def child_env(
    env: Mapping[str, str] | None = None,
    passthrough: Sequence[str] = (),
    *,
    parent: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Build a child environment from an allow-list instead of inheriting ours.

    Args:
        env: Provider ``env`` values; they win over inherited ones. Values under secret-looking
            names are registered with the redactor.
        passthrough: Extra variable names copied from ``parent`` (provider ``envPassthrough``).
        parent: The environment to copy from; defaults to ``os.environ``.

    Returns:
        The allow-listed variables, the passthrough names and ``env``, minus :data:`ENV_NEVER`.
    """
    parent = os.environ if parent is None else parent
    out = {name: value for name, value in parent.items() if name in ENV_ALLOW or name.startswith(ENV_ALLOW_PREFIXES)}
    for name in passthrough:
        if name in parent:
            out[name] = parent[name]
    out.update(env or {})
    # Only values under secret-looking names: registering paths and flags would redact them
    # (e.g. a value "error") out of every diagnostic.
    register_env_secrets({name: out[name] for name in (*passthrough, *(env or {})) if name in out})
    for name in ENV_NEVER:
        out.pop(name, None)
    return out


async def spawn(
    argv: Sequence[str],
    *,
    cwd: str | None,
    env: Mapping[str, str],
    max_line_bytes: int,
    stderr_tail_bytes: int,
    stdin_pipe: bool = True,
) -> AgentProcess:
    """Start ``argv`` as the leader of its own process group with piped stdout and stderr: in a
    new session when the bridge has a controlling terminal (``compat._child.NEW_SESSION``) or
    has no pidfds (the ``anyio.open_process`` path), else in the bridge's.

    Args:
        argv: Command and arguments; ``argv[0]`` should already be resolved to a path.
        cwd: Working directory, or None for ours.
        env: The complete child environment (see :func:`child_env`).
        max_line_bytes: Bound for one stdout line, in bytes (``Limits.max_agent_line_bytes``).
        stderr_tail_bytes: How many trailing stderr bytes to keep (``Limits.stderr_tail_bytes``).
        stdin_pipe: False gives the child ``/dev/null`` as stdin (exec profiles, field-failures #14).

    Raises:
        SpawnError: The command is missing, not executable, or ``cwd`` does not exist.
    """
    try:
        if _PIDFD:  # a vfork instead of the event loop's fork: see compat._child
            process: anyio.abc.Process = await PidfdProcess.start(argv, stdin_pipe=stdin_pipe, cwd=cwd, env=env)
        else:
            process = await anyio.open_process(
                list(argv),
                stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,  # its own group (anyio has no ``process_group``)
            )
    except OSError as exc:
        if cwd is not None and not os.path.isdir(cwd):
            raise SpawnError(argv[0], f"working directory does not exist: {cwd}") from exc
        raise SpawnError(argv[0], exc.strerror or type(exc).__name__) from exc
    logger.debug("spawned pid %d: %s", process.pid, redact(" ".join(argv)))
    return AgentProcess(process, argv, max_line_bytes, stderr_tail_bytes)


class AgentProcess:
    """A spawned child and its pipes. Create with :func:`spawn`."""

    def __init__(
        self,
        process: anyio.abc.Process,
        argv: Sequence[str],
        max_line_bytes: int,
        stderr_tail_bytes: int,
    ) -> None:
        self.argv = tuple(argv)
        self.pid = process.pid  # also the process-group id: the child leads its own group
        self._process = process
        assert process.stdout is not None and process.stderr is not None
        self._stdout = LineReader(process.stdout, max_line_bytes)
        self._tail = bytearray()
        self._tail_bytes = stderr_tail_bytes
        self._tail_cut = False  # the ring dropped bytes: its first line may be partial
        self.stderr_bytes = 0
        """How many stderr bytes the pump has read so far."""
        self._stderr_eof = anyio.Event()
        # The leader needs no psutil handle: until it is reaped (returncode set) its pid cannot be
        # reused, and every scan checks returncode first.
        self._known: dict[int, psutil.Process] = {}  # descendants seen, by pid (psutil ties each to its start time)
        self._scan_lock = threading.Lock()
        self._terminate_lock = anyio.Lock()
        self._terminated = False

    @property
    def returncode(self) -> int | None:
        """The leader's exit status once it exited (negative: killed by that signal)."""
        return self._process.returncode

    def stderr_tail(self, max_bytes: int | None = None) -> str:
        """The end of stderr, redacted, in at most ``max_bytes`` UTF-8 bytes (default: all kept).

        The whole kept tail is redacted before it is cut, and every cut starts on a line
        boundary (see :func:`cut_tail`): a secret is never shown in part.
        """
        text = self._tail.decode("utf-8", "replace")
        if self._tail_cut:
            text = _drop_partial_head(text)
        text = redact(text)
        return text if max_bytes is None else cut_tail(text, max_bytes)

    async def pump_stderr(
        self,
        *,
        track_descendants: bool = True,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Drain stderr into the bounded tail until EOF; run it in the caller's task group.

        With ``track_descendants`` this also runs :meth:`track_descendants` meanwhile; it returns
        once stderr is closed and the leader exited.
        """
        async with anyio.create_task_group() as tg:
            if track_descendants:
                tg.start_soon(self.track_descendants)
            task_status.started()
            await self._drain_stderr()

    async def _drain_stderr(self) -> None:
        stream = self._process.stderr
        assert stream is not None
        while True:
            try:
                chunk = await stream.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._stderr_eof.set()
                return
            self.stderr_bytes += len(chunk)
            self._tail += chunk
            excess = len(self._tail) - self._tail_bytes
            if excess > 0:
                self._tail_cut = self._tail[excess - 1] != 0x0A  # not cut on a line boundary
                del self._tail[:excess]
            if logger.isEnabledFor(logging.DEBUG):
                text = chunk[:_PREVIEW_CHARS].decode("utf-8", "replace")
                logger.debug("pid %d stderr: %s", self.pid, redact(text))

    async def wait_stderr_eof(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the stderr pump to see EOF."""
        with anyio.move_on_after(timeout):
            await self._stderr_eof.wait()
        return self._stderr_eof.is_set()

    async def receive_line(self) -> bytes:
        """Read one stdout line without its ``\\n`` (and a trailing ``\\r``).

        Raises:
            LineTooLong: The line, or unterminated data, passed ``max_line_bytes``.
            anyio.EndOfStream: stdout is closed and no data is left. An unterminated final line
                is returned first.
        """
        return await self._stdout.receive_line()

    async def read_lines(self, consumer: LineConsumer) -> None:
        """Hand every stdout line to ``consumer`` as it arrives, until end of file; cancel to
        stop (see :meth:`compat._lines.LineReader.read_lines`).

        Raises:
            LineTooLong: A line, or unterminated data, passed ``max_line_bytes``.
        """
        await self._stdout.read_lines(consumer)

    async def send(self, data: bytes) -> None:
        """Write to stdin. Callers serialize writes.

        Raises:
            anyio.BrokenResourceError: The child closed stdin or exited.
        """
        stdin = self._process.stdin
        if stdin is None:
            raise anyio.BrokenResourceError
        try:
            await stdin.send(data)
        except (anyio.ClosedResourceError, OSError) as exc:
            raise anyio.BrokenResourceError from exc

    @property
    def known_descendants(self) -> frozenset[int]:
        """The pids in the descendant snapshot (see :meth:`refresh_descendants`)."""
        return frozenset(self._known)

    async def refresh_descendants(self, max_age: float = 0.0) -> None:
        """Add the leader's current descendants to the snapshot that :meth:`terminate` kills.

        Runs the process-table scan in a worker thread; entries that ended are dropped. Does
        nothing once the leader exited (its children were re-parented out of view). Owners call
        it at turn boundaries; :meth:`track_descendants` calls it about once a second.
        """
        if self.returncode is None:
            if _PROC_CHILDREN:
                # A few reads of small procfs files: cheaper inline than a thread hop, and a
                # worker thread looping in Python holds the GIL for up to 5 ms against the
                # event loop (bench case 4: loop lag p99 9 ms with 100 agents' scans).
                self._scan(max_age)
            else:
                await anyio.to_thread.run_sync(self._scan, max_age)

    def _scan(self, max_age: float) -> None:
        import psutil

        with self._scan_lock:
            known: dict[int, psutil.Process] = {}
            if self.returncode is None:
                for pid in _descendant_pids(self.pid, max_age):
                    with suppress(psutil.Error):
                        proc = self._known.get(pid) or psutil.Process(pid)
                        if _running(proc):
                            known[pid] = proc
            for pid, proc in self._known.items():
                if pid not in known and _running(proc):
                    known[pid] = proc  # escaped: re-parented, yet still ours to end
            self._known = known

    async def track_descendants(self) -> None:
        """Keep the snapshot of the leader's descendants fresh (:meth:`refresh_descendants`) while
        it runs: often at first, then about once a second, each wait jittered (``_SCAN_JITTER``).
        Runs until cancelled or the leader exits; owners run it while the agent works (a turn)
        rather than while it idles.

        The first scan comes after the first delay: owners scan when a use begins (a turn
        before its prompt), and a second scan at once found the same tree (a third of the scans
        of a short turn on a kept agent).
        """
        for delay in itertools.chain(_SCAN_RAMP, itertools.repeat(_SCAN_EVERY)):
            with _cancelled_after(delay * random.uniform(1 - _SCAN_JITTER, 1 + _SCAN_JITTER)):
                await self._process.wait()
            if self.returncode is not None:
                return
            # Past the ramp, a process table read by any agent's scan within the last period
            # will do: one read per period for all agents instead of one each.
            await self.refresh_descendants(max_age=_SCAN_EVERY if delay == _SCAN_EVERY else _RAMP_SHARE)

    async def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds for the leader to exit; return its status or None.

        Returns when the leader exits, even while a descendant still holds its pipes open.
        """
        with anyio.move_on_after(timeout):
            return await self._process.wait()
        return self._process.returncode

    async def terminate(self, grace: float) -> int | None:
        """End the child and everything it started, then release the pipes. Idempotent.

        Sequence: close stdin; SIGTERM the process group and every descendant in the snapshot
        (refreshed first while the leader runs; those that called ``setsid`` escaped the group,
        and after the leader exited only the snapshot still finds them); wait up to ``grace``
        seconds for the leader; SIGKILL the group and every descendant (again); wait (bounded)
        and close our pipe ends. Runs shielded, so a cancelled caller still leaves nothing
        behind (field-failures #15).

        Args:
            grace: Seconds between SIGTERM and SIGKILL.

        Returns:
            The leader's exit status, or None if it could not be reaped within the bounds.
        """
        with anyio.CancelScope(shield=True):
            async with self._terminate_lock:
                if not self._terminated:
                    await self._terminate(grace)
                    self._terminated = True
        return self.returncode

    async def _terminate(self, grace: float) -> None:
        # Snapshot first: once stdin closes the leader may exit, and its children are re-parented
        # out of our reach (only the group signal and the snapshot would still find them).
        await self.refresh_descendants()
        await self._close_stdin()
        self._signal(signal.SIGTERM)
        if await self.wait(grace) is None:
            await self.refresh_descendants()
        self._signal(signal.SIGKILL)  # also what survived SIGTERM after the leader exited
        if await self.wait(_KILL_WAIT) is None:
            logger.warning("pid %d did not exit after SIGKILL", self.pid)
            return
        with anyio.move_on_after(_KILL_WAIT):
            await self._process.aclose()  # closes our pipe ends; the leader is already reaped
        logger.debug("pid %d ended with status %s", self.pid, self.returncode)

    async def _close_stdin(self) -> None:
        if self._process.stdin is not None:
            with anyio.move_on_after(1.0), suppress(OSError, anyio.BrokenResourceError):
                await self._process.stdin.aclose()

    def _signal(self, sig: int) -> None:
        """Send ``sig`` to the group, the leader and every snapshot entry; after SIGTERM also
        SIGCONT, since a stopped process acts on SIGTERM only once continued."""
        import psutil

        for each in (sig, signal.SIGCONT) if sig == signal.SIGTERM else (sig,):
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, each)
            # The leader too: in the bridge's session it may have joined another group
            # (setpgid), which the group signal no longer reaches. Not yet reaped, its pid is
            # still its own. os.kill, not the process object's send_signal: Popen's polls first,
            # which on asyncio's fallback path reaped the child under the child watcher's feet
            # (it then reported exit status 255).
            if self.returncode is None:
                with suppress(OSError):  # gone, or not ours to signal
                    os.kill(self.pid, each)
            for proc in list(self._known.values()):
                with suppress(psutil.Error):
                    proc.send_signal(each)  # psutil checks the pid was not reused


@contextmanager
def _cancelled_after(seconds: float) -> Iterator[anyio.CancelScope]:
    """``anyio.move_on_after(seconds)`` with a plain timer of the event loop instead of a deadline.

    For waits that usually run out. uvloop fires timers up to 1 ms early (libuv's millisecond
    clock; MagicStack/uvloop#739), and anyio re-arms a deadline's timer until ``loop.time()``
    reaches it, so every deadline that ran out spun the loop for up to a millisecond: with 100
    agents' descendant trackers (bench case 4) 15,900 re-arms a second. This scope is cancelled
    by the first firing, early or not.
    """
    with anyio.CancelScope() as scope:
        timer = asyncio.get_running_loop().call_later(seconds, scope.cancel)
        try:
            yield scope
        finally:
            timer.cancel()


_RAMP_SHARE = 0.02  # seconds: ramp scans of agents started together share one table read
_table_lock = threading.Lock()
_table: tuple[float, dict[int, list[int]]] = (float("-inf"), {})


def _children_table(max_age: float) -> dict[int, list[int]]:
    """ppid -> child pids from one process-table read, shared by every agent's scan.

    A read opens every ``/proc/<pid>/stat``; each of 100 agents reading its own once a second
    cost more CPU than relaying their updates (bench case 4 profile: psutil ``ppid_map`` 45%).
    """
    global _table
    with _table_lock:
        taken, table = _table
        now = time.monotonic()
        if now - taken > max_age:
            table = {}
            for pid, ppid in _ppids():
                table.setdefault(ppid, []).append(pid)
            _table = (now, table)
        return table


def _ppids() -> list[tuple[int, int]]:
    """(pid, ppid) of every process. On Linux one small read per ``/proc/<pid>/stat``: psutil's
    ``process_iter`` builds a Process object per entry and costs about 8x more (bench case 4)."""
    if not os.path.isdir("/proc/self/task"):
        import psutil

        return [(p.pid, p.info["ppid"]) for p in psutil.process_iter(["ppid"])]
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as stat:
                    fields = stat.read().rpartition(b")")[2].split(maxsplit=2)  # comm may hold ")"
                out.append((int(name), int(fields[1])))
            except (OSError, IndexError, ValueError):
                continue  # ended meanwhile
    return out


def _children_of(pid: int) -> list[int]:
    """The children of ``pid``, from ``/proc/<pid>/task/<tid>/children`` (Linux ≥ 3.5)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out  # ended meanwhile
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as children:
                out += map(int, children.read().split())
        except (OSError, ValueError):
            continue
    return out


_PROC_CHILDREN = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
"""Whether the kernel lists each thread's children (``CONFIG_PROC_CHILDREN``)."""


def _descendant_pids(pid: int, max_age: float) -> list[int]:
    """Every descendant of ``pid``: walked down from it where the kernel lists children (each
    of 100 agents then reads a few files per scan instead of one file per process on the
    machine), else from one shared read of the process table at most ``max_age`` seconds old."""
    children_of = _children_of if _PROC_CHILDREN else _children_table(max_age).get
    found, frontier = [], [pid]
    while frontier:
        children = children_of(frontier.pop()) or ()
        found += children
        frontier += children
    return found


def _running(proc: psutil.Process) -> bool:
    """Still running as the process we saw (same start time), and not a zombie."""
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
