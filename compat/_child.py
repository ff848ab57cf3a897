"""A child process started with ``subprocess.Popen`` and watched through a pidfd (Linux ≥ 5.3).

Why not ``anyio.open_process``: starting a child through asyncio's or uvloop's subprocess
machinery runs the whole start on the event loop, ~4 ms per spawn on an idle machine and far
more when 100 sessions start at once (bench case 4: stalls of up to 650 ms, sampled inside
``subprocess._execute_child``). Here ``subprocess.Popen`` runs in a worker thread, the pipes join
the loop as ordinary pipe transports and the exit is a readable pidfd. The fork itself still
holds the GIL, so the loop is not entirely free meanwhile: 100 spawns at once blocked it for
286 ms in total this way against 491 ms through asyncio (loop-gap measurement, uvloop).
Where ``os.pidfd_open`` is missing, ``compat._process.spawn`` keeps using ``anyio.open_process``.

Must not import: ``bridge`` or ``orchestrator``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

PIDFD_SUPPORTED = hasattr(os, "pidfd_open")
_READ_CHUNK = 65536  # bytes per receive, as anyio's process streams


def pidfd_works() -> bool:
    """Whether this kernel grants pidfds (the call exists on Python 3.9+, the syscall on 5.3+)."""
    if not PIDFD_SUPPORTED:
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


class _PipeReceiveStream(anyio.abc.ByteReceiveStream):
    def __init__(self, reader: asyncio.StreamReader, transport: asyncio.ReadTransport) -> None:
        self._reader, self._transport = reader, transport

    async def receive(self, max_bytes: int = _READ_CHUNK) -> bytes:
        data = await self._reader.read(max_bytes)
        if not data:
            raise anyio.EndOfStream
        return data

    async def aclose(self) -> None:
        self._transport.close()


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
    """``anyio.abc.Process`` over a ``Popen`` child; use :meth:`start`.

    The pidfd is readable once the child exits; the reader callback then reaps it
    (``Popen.poll``), sets ``returncode`` (negative: the signal that ended it) and wakes ``wait``.
    """

    def __init__(
        self, popen: subprocess.Popen[bytes], pidfd: int, stdin: _PipeSendStream | None,
        stdout: _PipeReceiveStream, stderr: _PipeReceiveStream,
    ) -> None:  # fmt: skip
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
        """Start ``argv`` in a new session with piped stdout/stderr (and stdin, or /dev/null).

        Raises:
            OSError: the command or ``cwd`` is missing or not executable (from ``Popen``).
        """
        popen = await anyio.to_thread.run_sync(functools.partial(
            subprocess.Popen, list(argv), stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=dict(env), start_new_session=True,
        ))  # fmt: skip
        # The thread is not abandoned on cancellation, so a started child always gets here; a
        # cancellation pending meanwhile raises at the first await below and the child is reaped.
        try:
            pidfd = os.pidfd_open(popen.pid)
            loop = asyncio.get_running_loop()
            assert popen.stdout is not None and popen.stderr is not None
            stdout = await _read_pipe(loop, popen.stdout)
            stderr = await _read_pipe(loop, popen.stderr)
            stdin = await _write_pipe(loop, popen.stdin) if popen.stdin is not None else None
        except BaseException:
            popen.kill()
            popen.wait()
            raise
        return cls(popen, pidfd, stdin, stdout, stderr)

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


async def _read_pipe(loop: asyncio.AbstractEventLoop, pipe: Any) -> _PipeReceiveStream:
    reader = asyncio.StreamReader(limit=2**20, loop=loop)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe)
    return _PipeReceiveStream(reader, transport)


async def _write_pipe(loop: asyncio.AbstractEventLoop, pipe: Any) -> _PipeSendStream:
    # StreamReaderProtocol brings the flow control StreamWriter.drain needs; its reader stays
    # empty (asyncio.subprocess pairs its write pipes with a reading protocol the same way).
    protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), loop=loop)
    transport, _ = await loop.connect_write_pipe(lambda: protocol, pipe)
    return _PipeSendStream(asyncio.StreamWriter(transport, protocol, None, loop))
