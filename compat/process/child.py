"""One local child process once started (``compat.process.spawn``): its pipes pumped, its exit
watched, and its end, which leaves nothing behind.

Shared by every adapter that runs a local command (ACP agents, exec profiles). The rules come from
field-failures.md: stderr is always drained into a bounded tail (#13), stdout lines are bounded and
an unterminated final line is still delivered (#9), the child leads its own process group so a
kill reaches launcher wrappers and grandchildren, including those that left the group (#15,
``compat.process.descendants``), and every wait is bounded.

The end of a child is its leader's exit, not stdout EOF, which never comes while a descendant still
holds the pipe: once the leader exited, what the pipes already hold is read (a drain, no timed
wait) and the pumps end.

How a child is pumped: its pipes are ours and non-blocking; stdout and stderr are read by a task
each (``anyio.wait_readable``, then ``os.read``), stdin is written with ``anyio.wait_writable``,
and the exit is a pidfd (Linux ≥ 5.3) that turns readable, reaped with ``Popen.poll``. Where
pidfds are missing the exit is waited for by ``Popen.wait`` in a worker thread.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import anyio.to_thread

from bridge.rpc.redact import redact
from compat.process.descendants import (
    find_descendants,
    is_ours,
    reap_orphans,
    unregister,
)
from compat.process.env import StderrTail
from compat.process.lines import LineFramer, LineTooLong
from compat.process.threads import exit_waits

if TYPE_CHECKING:
    import psutil

logger = logging.getLogger(__name__)

LineConsumer = Callable[[bytes], None]
"""Takes one stdout line (without its newline); called from the reader, so it must not block."""

READ_CHUNK = 64 * 1024  # bytes per read from a pipe
DRAIN_LIMIT = 4 * 1024 * 1024  # bytes a drain reads at most: a descendant writing forever cannot hold it
STDIN_QUEUE_BYTES = 16 * 1024 * 1024  # queued for a child's stdin before it counts as not reading
EXIT_WAIT = 2.0  # seconds to wait for the leader's exit once its stdout closed
KILL_WAIT = 2.0  # seconds to wait for the leader after SIGKILL (it cannot ignore it)


def _pidfd_works() -> bool:
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


PIDFD = _pidfd_works()
"""Whether this kernel grants pidfds (the call exists on Python 3.9+, the syscall on Linux 5.3+)."""


class AgentProcess:
    """A started child; create it with :func:`spawn`, pump it with :meth:`run`, end it with
    :meth:`terminate`.

    Args:
        popen: the child.
        fds: our non-blocking pipe ends by name (``stdout``, ``stderr``, ``stdin``).
        mark: the child's spawn mark (``compat.process.descendants``).
        max_line_bytes: bound for one stdout line, in bytes.
        stderr_tail_bytes: stderr bytes kept.
    """

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        fds: dict[str, int],
        mark: str,
        *,
        max_line_bytes: int,
        stderr_tail_bytes: int,
    ) -> None:
        self._popen = popen
        self._stdout: int | None = fds["stdout"]
        self._stderr: int | None = fds["stderr"]
        self._stdin: int | None = fds.get("stdin")
        self._mark = mark
        self._lines = LineFramer(max_line_bytes)
        self._tail = StderrTail(stderr_tail_bytes)
        self._pidfd: int | None = None
        if PIDFD:
            with contextlib.suppress(OSError):  # it may be reaped already (then poll() knows)
                self._pidfd = os.pidfd_open(popen.pid)
        self._exit_lock = anyio.Lock()
        self._exited = anyio.Event()
        self._pending_stdin: deque[bytes] = deque()
        self._stdin_bytes = 0
        self._stdin_closing = False
        self._stdin_wake = anyio.Event()
        self._on_line: LineConsumer | None = None
        self._stdout_ended = False
        self._reading: anyio.CancelScope | None = None  # the stdout reader, cut off at the leader's exit
        self._pumping: anyio.Event | None = None  # set once :meth:`run` has ended
        self._terminate_lock = anyio.Lock()
        self._terminated = False

    # ---- facts ------------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The leader's process id (also its process-group id)."""
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """The leader's exit status once it exited (negative: killed by that signal)."""
        return self._popen.returncode

    @property
    def stderr_bytes(self) -> int:
        """Bytes of stderr received so far."""
        return self._tail.total

    def stderr_tail(self, max_bytes: int | None = None) -> str:
        """The end of stderr, redacted, in at most ``max_bytes`` UTF-8 bytes (default: all kept).

        The whole kept tail is redacted before it is cut, and every cut starts on a line
        boundary (``compat.process.env.cut_tail``): a secret is never shown in part.
        """
        return self._tail.text(max_bytes)

    # ---- pumps ------------------------------------------------------------------------------------

    async def run(
        self, on_line: LineConsumer, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Pump the pipes until stdout ends: its lines to ``on_line`` as they arrive, stderr into
        the tail, queued writes to stdin. Run it in a task group of the owner's.

        stdout ends at EOF, or at the leader's exit once what the pipes hold is read. After EOF
        the leader gets :data:`EXIT_WAIT` seconds to exit. Our read ends are closed on return.

        Raises:
            compat.process.lines.LineTooLong: a stdout line passed ``max_line_bytes`` (the owner
                should end the child: it can no longer be understood).
        """
        self._on_line = on_line
        self._pumping = anyio.Event()
        too_long: LineTooLong | None = None
        try:
            async with anyio.create_task_group() as tg:
                assert self._stderr is not None
                tg.start_soon(_pump, self._stderr, self._take_stderr)  # until EOF, or cancelled below
                tg.start_soon(self._write_stdin)
                tg.start_soon(self._watch_exit)
                task_status.started()
                try:
                    await self._read_stdout()
                except LineTooLong as exc:  # raised below, not wrapped in the group's ExceptionGroup
                    too_long = exc
                else:
                    if self.returncode is None:
                        await self.wait(EXIT_WAIT)
                self._drain(self._stderr, self._tail.add)
                tg.cancel_scope.cancel()
        finally:
            self._stdout_ended = True
            self._close_reads()
            self._pumping.set()
        if too_long is not None:
            raise too_long

    async def _read_stdout(self) -> None:
        fd = self._stdout
        assert fd is not None
        if not self._exited.is_set():
            with anyio.CancelScope() as self._reading:
                await _pump(fd, self._deliver)
            self._reading = None
        self._drain(self._stdout, self._deliver)  # the leader exited: take what the pipe still holds
        for line in self._lines.finish():
            self._line(line)

    def _deliver(self, data: bytes) -> None:
        for line in self._lines.feed(data):
            self._line(line)
        if self._lines.error is not None:  # the lines before it were handed over
            raise self._lines.error

    def _line(self, line: bytes) -> None:
        assert self._on_line is not None
        self._on_line(line)

    def drain(self) -> None:
        """Hand over the stdout lines the child has already written, now (no wait): what a
        reader would get before anything written later.

        Raises:
            compat.process.lines.LineTooLong: as :meth:`run`.
        """
        if self._stdout is not None and not self._stdout_ended and self._on_line is not None:
            self._drain(self._stdout, self._deliver)

    @staticmethod
    def _drain(fd: int | None, take: Callable[[bytes], None]) -> None:
        read = 0
        while fd is not None and read < DRAIN_LIMIT and (data := _read(fd)):
            read += len(data)
            take(data)

    def _take_stderr(self, data: bytes) -> None:
        self._tail.add(data)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("pid %d stderr: %s", self.pid, redact(data[:300].decode("utf-8", "replace")))

    async def _watch_exit(self) -> None:
        await self._wait_exit()
        if self._reading is not None:
            self._reading.cancel()  # what the pipes hold is drained by the reader
        self._drain(self._stderr, self._tail.add)

    # ---- stdin --------------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Queue ``data`` for the child's stdin; :meth:`run` writes it, in order.

        Raises:
            anyio.BrokenResourceError: stdin is closed (the child closed it, exited, or
                :meth:`close_stdin` was called), or :data:`STDIN_QUEUE_BYTES` wait unwritten (the
                child is not reading its stdin).
        """
        if self._stdin is None or self._stdin_closing:
            raise anyio.BrokenResourceError
        if self._stdin_bytes + len(data) > STDIN_QUEUE_BYTES:
            logger.warning("pid %d is not reading its stdin; closing it", self.pid)
            self.close_stdin()
            raise anyio.BrokenResourceError
        self._pending_stdin.append(data)
        self._stdin_bytes += len(data)
        self._stdin_wake.set()

    def close_stdin(self) -> None:
        """Close stdin once what is queued is written (a child reading to EOF goes on, #14)."""
        self._stdin_closing = True
        self._stdin_wake.set()
        if self._pumping is not None and self._pumping.is_set():  # the writer is gone: close it now
            self._close_stdin_now()

    async def _write_stdin(self) -> None:
        try:
            while (fd := self._stdin) is not None:
                if not self._pending_stdin:
                    if self._stdin_closing:
                        break
                    self._stdin_wake = anyio.Event()
                    await self._stdin_wake.wait()
                    continue
                chunk = memoryview(self._pending_stdin[0])
                while chunk:
                    try:
                        chunk = chunk[os.write(fd, chunk) :]
                    except BlockingIOError:
                        await anyio.wait_writable(fd)
                self._stdin_bytes -= len(self._pending_stdin.popleft())
        except (OSError, anyio.ClosedResourceError):  # EPIPE: the child closed its stdin or exited
            logger.debug("pid %d closed its stdin", self.pid)
        finally:
            self._close_stdin_now()

    def _close_stdin_now(self) -> None:
        self._stdin_closing = True
        self._pending_stdin.clear()
        self._stdin_bytes = 0
        fd, self._stdin = self._stdin, None
        if fd is not None:
            _close(fd)

    # ---- exit -----------------------------------------------------------------------------------------

    async def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds for the leader to exit; its status, or None.

        Returns when the leader exits, even while a descendant still holds its pipes open.
        """
        with anyio.move_on_after(timeout):
            await self._wait_exit()
        return self.returncode

    async def _wait_exit(self) -> None:
        if self._exited.is_set():
            return
        async with self._exit_lock:  # one waiter on the pidfd at a time; the others see it set
            while self._popen.poll() is None:
                if self._pidfd is not None:
                    await anyio.wait_readable(self._pidfd)
                else:
                    await anyio.to_thread.run_sync(self._popen.wait, abandon_on_cancel=True, limiter=exit_waits())
            self._reaped()

    def _reaped(self) -> None:
        if self._exited.is_set():
            return
        unregister(self.pid)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self._exited.set()

    async def terminate(self, grace: float) -> int | None:
        """End the child and everything it started, then release the pipes. Idempotent.

        Sequence: close stdin; SIGTERM (and SIGCONT, for a stopped child) to the process group,
        the leader and every descendant found (``compat.process.descendants``); wait up to
        ``grace`` seconds for the leader; SIGKILL the group, the leader and every descendant found
        again (the leader's death re-parents its children to the bridge); wait (bounded); reap
        what was adopted. Runs shielded, so a cancelled caller still leaves nothing behind.

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
        victims = await self._descendants()
        self._close_stdin_now()
        self._signal(signal.SIGTERM, victims)
        self._signal(signal.SIGCONT, victims)  # a stopped process acts on SIGTERM only once continued
        await self.wait(grace)
        victims += await self._descendants()
        self._signal(signal.SIGKILL, victims)
        if await self.wait(KILL_WAIT) is None:
            logger.warning("pid %d did not exit after SIGKILL", self.pid)
        await anyio.to_thread.run_sync(_wait_gone, victims)
        await anyio.to_thread.run_sync(reap_orphans)
        if self._pumping is not None:
            with anyio.move_on_after(KILL_WAIT):  # the pumps drain and close our ends
                await self._pumping.wait()
        self._close_reads()
        self._close_stdin_now()
        logger.debug("pid %d ended with status %s", self.pid, self.returncode)

    async def _descendants(self) -> list[psutil.Process]:
        # A read of the process table: in a worker thread, so ending many agents at once never
        # holds the event loop.
        return await anyio.to_thread.run_sync(
            lambda: find_descendants(self.pid, self._mark, leader_alive=self.returncode is None)
        )

    def _signal(self, sig: int, victims: list[psutil.Process]) -> None:
        """Send ``sig`` to the group, the leader (it may have joined another group) and ``victims``."""
        import psutil

        if is_ours(self.pid):  # never a group that reused the id once ours was empty
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)
        if self.returncode is None:  # not yet reaped, so the pid is still the leader's
            with contextlib.suppress(OSError):
                os.kill(self.pid, sig)
        for proc in victims:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)  # psutil checks the pid was not reused

    def _close_reads(self) -> None:
        for name in ("_stdout", "_stderr"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                _close(fd)


def _wait_gone(victims: list[psutil.Process]) -> None:
    """Wait (at most :data:`KILL_WAIT` seconds) for the killed descendants to go; those the bridge
    adopted are reaped on the way (``psutil`` waits for its own children with ``waitpid``)."""
    import psutil

    psutil.wait_procs(victims, timeout=KILL_WAIT)


def _read(fd: int) -> bytes | None:
    """What the pipe holds (at most :data:`READ_CHUNK` bytes); b"" at EOF; None when empty."""
    try:
        return os.read(fd, READ_CHUNK)
    except BlockingIOError:
        return None
    except OSError:  # EIO and the like: treat as the end
        return b""


async def _pump(fd: int, take: Callable[[bytes], None]) -> None:
    """Hand each chunk the pipe ``fd`` yields to ``take``, until end of file."""
    while True:
        await anyio.wait_readable(fd)
        data = _read(fd)
        if data is None:
            continue
        if not data:
            return
        take(data)


def _close(fd: int) -> None:
    anyio.notify_closing(fd)
    with contextlib.suppress(OSError):
        os.close(fd)
