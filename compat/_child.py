"""A child process started with ``subprocess.Popen`` and watched through a pidfd (Linux ≥ 5.3).

Why not ``anyio.open_process``: under uvloop (the bridge's default loop) it goes through libuv's
``uv_spawn``, which calls ``fork()`` on the event loop; the fork copies the bridge's page tables
meanwhile, so every spawn stalls every session for a time that grows with the bridge's memory
(``/bin/true`` from uvloop: 1.8 ms at an idle interpreter's size, 9.3 ms with 150 MiB resident).
``subprocess.Popen`` uses ``vfork()`` (CPython ≥ 3.10 without ``preexec_fn``), which copies
nothing: 0.15-0.2 ms at either size. The parent still waits until the child reaches ``exec``,
which takes many milliseconds when the CPUs are busy (60 Python children started 5 ms apart:
loop stalls over 3 ms summed to 220-250 ms with ``Popen`` on the loop, 20-45 ms from a worker
thread, which waits without holding the GIL). So ``Popen`` runs in a worker thread, the pipes
join the loop as ordinary pipe transports and the exit is a readable pidfd, reaped with
``Popen.poll``. Where ``os.pidfd_open`` is missing or refused, ``compat._process.spawn`` keeps
using ``anyio.open_process``.

Must not import: ``bridge`` or ``orchestrator``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import subprocess
from collections import deque
from collections.abc import Callable, Mapping, Sequence

import anyio
import anyio.abc
import anyio.to_thread
from anyio.lowlevel import RunVar

_READ_CHUNK = 65536  # bytes per receive, as anyio's process streams
_READ_LIMIT = 2**17
"""Bytes a read pipe buffers unread before its transport pauses, as asyncio's ``StreamReader``
with the default limit that ``anyio.open_process`` uses (lines are bounded separately)."""


SPAWN_THREADS = 256
"""Children that may be starting at once, each holding a worker thread until it reaches ``exec``.

Not anyio's default 40 threads, which other work shares: under a start storm a child waits tens
of milliseconds for a CPU before its ``exec``, so 40 at a time queued the 100th start about
750 ms behind the first (bench case 4, 100 sessions started at once), and those late agents
started streaming while the early ones' updates were already being relayed. A waiting thread
costs no CPU and little memory."""
_SPAWN_LIMITER: RunVar[anyio.CapacityLimiter] = RunVar("compat._child spawn limiter")


def _spawn_limiter() -> anyio.CapacityLimiter:
    """The event loop's limiter for :data:`SPAWN_THREADS` (a ``RunVar``: one per loop)."""
    try:
        return _SPAWN_LIMITER.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(SPAWN_THREADS)
        _SPAWN_LIMITER.set(limiter)
        return limiter


def _has_controlling_terminal() -> bool:
    try:
        os.close(os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY))
    except OSError:
        return False
    return True


NEW_SESSION = _has_controlling_terminal()
"""Whether children start in a new session (``setsid``) rather than only a new process group.

Either way each child leads its own process group, which :mod:`compat._process` signals as a
whole. A session is new only when the bridge has a controlling terminal, so that an agent's
prompt on ``/dev/tty`` (ssh, git, sudo) fails at once instead of stopping in the background
(``SIGTTIN``) until the turn times out. Otherwise a new session would cost the bridge its share
of the CPUs: with autogroup scheduling (Linux's default on desktops, and on this machine) every
session is a scheduling group of its own, so N agents got N shares to the bridge's one. In a
start storm of 100 agents on 2 cores (bench case 4, 4 runs each) the event loop then ran 2-6 ms
in stalls of 200-365 ms; in the agents' process group the first 250 ms of relayed chunks had a
delay p99 of 0.3-0.8 ms instead of 4-258 ms.
"""


def pidfd_works() -> bool:
    """Whether this kernel grants pidfds (the call exists on Python 3.9+, the syscall on 5.3+)."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


def _transport_closes_fd(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop``'s pipe transports close the descriptor themselves.

    uvloop's do (libuv closes it in ``uv_close``) and then also call the file object's
    ``close()`` (uvloop ``handles/handle.pyx``, ``UVHandle._close``); asyncio's only call
    ``close()``. The file object handed over must close the descriptor exactly once: a second
    close could hit a descriptor number reused meanwhile by another session's pipe. A subclass
    of uvloop's loop (instrumentation wraps it so) counts as uvloop: the MRO is checked, without
    importing uvloop where it is not in use.
    """
    return any(cls.__module__.partition(".")[0] == "uvloop" for cls in type(loop).__mro__)


DataReceiver = Callable[[bytes], None]
"""Takes the bytes a pipe delivers; ``b""`` means end of file."""


class PipeReceiveStream(anyio.abc.ByteReceiveStream, asyncio.Protocol):
    """A read pipe: bytes are pulled with :meth:`receive`, or pushed to a receiver set with
    :meth:`set_receiver` from the transport's own callback, without a task switch.

    Push is what relays an agent's updates (compat._lines): a reader task woken per chunk cost
    one more pass of the event loop per relayed update, and asyncio's ``StreamReader`` under it a
    buffer copy and a future per read (bench case 4, 100 paced sessions: server CPU 28-31% with
    them, 21-23% pushed together with the direct WebSocket send of ``bridge.ws``).

    While nobody takes them, chunks wait here; past :data:`_READ_LIMIT` bytes the transport stops
    reading, so the child blocks on a full pipe instead of growing our memory.
    """

    def __init__(self) -> None:
        self._transport: asyncio.ReadTransport | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._eof = False
        self._paused = False
        self._arrived = asyncio.Event()  # set when chunks or the end arrive
        self._receiver: DataReceiver | None = None

    # ---- asyncio.Protocol (called by the transport) -------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's pipe transports are no ReadTransport subclass

    def data_received(self, data: bytes) -> None:
        if self._receiver is not None:
            self._receiver(data)
            return
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _READ_LIMIT and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._arrived.set()

    def eof_received(self) -> bool:
        self._end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()

    # ---- consumers ----------------------------------------------------------------------------

    def set_receiver(self, receiver: DataReceiver | None) -> None:
        """Hand every chunk to ``receiver`` as it arrives (what waits here first), and ``b""``
        once at end of file; None goes back to buffering for :meth:`receive`."""
        self._receiver = receiver
        if receiver is None:
            return
        while self._chunks and self._receiver is receiver:
            receiver(self._take())
        if self._eof and not self._chunks and self._receiver is receiver:
            receiver(b"")

    async def receive(self, max_bytes: int = _READ_CHUNK) -> bytes:
        while not self._chunks:
            if self._eof:
                raise anyio.EndOfStream
            self._arrived.clear()
            await self._arrived.wait()
        data = self._take()
        if len(data) > max_bytes:
            self._chunks.appendleft(data[max_bytes:])
            self._buffered += len(data) - max_bytes
            data = data[:max_bytes]
        return data

    async def aclose(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _take(self) -> bytes:
        data = self._chunks.popleft()
        self._buffered -= len(data)
        if self._paused and self._buffered <= _READ_LIMIT // 2 and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return data

    def _end(self) -> None:
        if self._eof:
            return
        self._eof = True
        if self._receiver is not None and not self._chunks:
            self._receiver(b"")
        self._arrived.set()


class _PipeSendStream(anyio.abc.ByteSendStream):
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def send(self, item: bytes) -> None:
        if self._writer.is_closing():
            raise anyio.ClosedResourceError
        self._writer.write(item)
        await self._writer.drain()

    async def aclose(self) -> None:
        self._writer.close()


class PidfdProcess(anyio.abc.Process):
    """``anyio.abc.Process`` over a ``Popen`` child; create it with :meth:`start`.

    The pidfd turns readable once the child exits; the reader callback then reaps it
    (``Popen.poll``), which sets ``returncode`` (negative: the signal that ended it) and wakes
    :meth:`wait`.
    """

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        pidfd: int,
        stdin: _PipeSendStream | None,
        stdout: PipeReceiveStream,
        stderr: PipeReceiveStream,
    ) -> None:
        self._popen = popen
        self._stdin, self._stdout, self._stderr = stdin, stdout, stderr
        self._exited = anyio.Event()
        self._pidfd: int | None = pidfd
        asyncio.get_running_loop().add_reader(pidfd, self._on_exit)
        self._on_exit()  # it may have exited already (a zombie still has its pid)

    @classmethod
    async def start(
        cls, argv: Sequence[str], *, stdin_pipe: bool, cwd: str | None, env: Mapping[str, str]
    ) -> PidfdProcess:
        """Start ``argv`` as the leader of a new process group (in a new session only as
        :data:`NEW_SESSION` says) with piped stdout/stderr (and stdin, or /dev/null).

        Raises:
            OSError: the command or ``cwd`` is missing or not executable (from ``Popen``).
        """
        popen, ours = await anyio.to_thread.run_sync(_popen, argv, stdin_pipe, cwd, env, limiter=_spawn_limiter())
        # The thread is not abandoned on cancellation, so a started child always gets here; a
        # cancellation pending meanwhile raises at the first await below, and the child is reaped.
        loop = asyncio.get_running_loop()
        pidfd = -1
        connected: list[asyncio.BaseTransport] = []
        try:
            pidfd = os.pidfd_open(popen.pid)
            stdout = await _read_pipe(loop, ours.pop("stdout"), connected)
            stderr = await _read_pipe(loop, ours.pop("stderr"), connected)
            stdin = await _write_pipe(loop, ours.pop("stdin"), connected) if stdin_pipe else None
        except BaseException:
            for transport in connected:  # uvloop's stay open after EOF until closed
                transport.close()
            for fd in (*ours.values(), pidfd):  # not yet handed to a transport or the watch
                if fd >= 0:
                    os.close(fd)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, signal.SIGKILL)  # its own group: what it started too
            popen.wait()
            raise
        return cls(popen, pidfd, stdin, stdout, stderr)

    def __del__(self) -> None:
        # Only reached once no loop holds ``_on_exit`` any more: a loop closed while the child
        # still ran (the child itself is reaped by Popen's own bookkeeping).
        if getattr(self, "_pidfd", None) is not None:
            os.close(self._pidfd)  # type: ignore[arg-type]
            self._pidfd = None

    def _on_exit(self) -> None:
        if self._pidfd is None or self._popen.poll() is None:
            return
        asyncio.get_running_loop().remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = None
        self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self._popen.returncode is not None
        return self._popen.returncode

    def terminate(self) -> None:
        self._popen.terminate()

    def kill(self) -> None:
        self._popen.kill()

    def send_signal(self, signal: int) -> None:
        self._popen.send_signal(signal)

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    @property
    def stdin(self) -> anyio.abc.ByteSendStream | None:
        return self._stdin

    @property
    def stdout(self) -> anyio.abc.ByteReceiveStream | None:
        return self._stdout

    @property
    def stderr(self) -> anyio.abc.ByteReceiveStream | None:
        return self._stderr

    async def aclose(self) -> None:
        """Close our pipe ends, then wait for the child (as ``anyio.abc.Process.aclose``)."""
        with anyio.CancelScope(shield=True):
            for stream in (self._stdin, self._stdout, self._stderr):
                if stream is not None:
                    await stream.aclose()
        try:
            await self.wait()
        except BaseException:
            self.kill()
            with anyio.CancelScope(shield=True):
                await self.wait()
            raise


def _popen(
    argv: Sequence[str], stdin_pipe: bool, cwd: str | None, env: Mapping[str, str]
) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    """``Popen`` with our own pipes; returns the child and our ends (``stdout``, ``stderr``,
    ``stdin``). The pipes are close-on-exec, so no other child inherits them; they are not
    Popen's, whose file objects would close the descriptors again when collected."""
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
    return popen, ours


def _pipe_file(loop: asyncio.AbstractEventLoop, fd: int, mode: str) -> io.FileIO:
    return io.FileIO(fd, mode, closefd=not _transport_closes_fd(loop))


async def _read_pipe(
    loop: asyncio.AbstractEventLoop, fd: int, connected: list[asyncio.BaseTransport]
) -> PipeReceiveStream:
    transport, stream = await loop.connect_read_pipe(PipeReceiveStream, _pipe_file(loop, fd, "rb"))
    connected.append(transport)
    return stream


async def _write_pipe(
    loop: asyncio.AbstractEventLoop, fd: int, connected: list[asyncio.BaseTransport]
) -> _PipeSendStream:
    # StreamReaderProtocol brings the flow control StreamWriter.drain needs; its reader stays
    # empty (asyncio.subprocess pairs its write pipes with a reading protocol the same way).
    protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), loop=loop)
    transport, _ = await loop.connect_write_pipe(lambda: protocol, _pipe_file(loop, fd, "wb"))
    connected.append(transport)
    return _PipeSendStream(asyncio.StreamWriter(transport, protocol, None, loop))
