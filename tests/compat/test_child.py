"""``compat._child``: children started with ``Popen`` in a worker thread, pipes on the event loop,
exit through a pidfd, on both loops the bridge runs on (asyncio's and uvloop's).

* Each pipe descriptor is closed exactly once: uvloop's transports close it themselves, asyncio's
  leave it to the file object (the contract test pins both behaviours, so a change in either loop
  shows here first).
* Nothing leaks: after many children started, read, ended and reaped, the process holds the
  descriptors it held before; a start that fails (missing command or directory) leaks none.
* Exit status, signals and stdin behave as ``anyio.open_process`` children do.
* Each child leads its own process group, in the bridge's session unless the bridge has a
  controlling terminal.
"""

from __future__ import annotations

import asyncio
import gc
import io
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
import uvloop

import compat._process
from compat._child import PidfdProcess, _transport_closes_fd
from compat._process import SpawnError, child_env, spawn


class TracingLoop(uvloop.Loop):  # as instrumentation libraries wrap the loop
    pass


LOOPS = {"asyncio": asyncio.SelectorEventLoop, "uvloop": uvloop.new_event_loop, "uvloop-subclass": TracingLoop}
WAIT = 10.0  # seconds: the bound on every wait below


def run_on(loop_name: str, main: Callable[[], Awaitable[Any]]) -> Any:
    with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
        return runner.run(asyncio.wait_for(main(), WAIT))


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def fds_before() -> set[int]:
    """The descriptors open now, once earlier tests' garbage is collected: compare with
    :func:`open_fds` by difference (what a test left open), since a collection during the test
    may still close one of those (the set is process-wide)."""
    gc.collect()
    return open_fds()


@pytest.mark.parametrize("loop_name", LOOPS)
def test_transport_closes_fd_matches_what_the_loop_does(loop_name: str) -> None:
    async def main() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        read_end, write_end = os.pipe()
        os.close(write_end)
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), io.FileIO(read_end, "rb", closefd=False)
        )
        await reader.read()  # EOF: the transport closes itself
        transport.close()
        await asyncio.sleep(0)  # let the close callbacks run
        try:
            os.fstat(read_end)
            closed = False
        except OSError:
            closed = True
        if not closed:
            os.close(read_end)
        return closed, _transport_closes_fd(loop)

    closed, predicted = run_on(loop_name, main)
    assert closed == predicted
    assert predicted == loop_name.startswith("uvloop")


@pytest.mark.parametrize("pidfd", [True, False], ids=["popen-pidfd", "anyio-fallback"])
@pytest.mark.parametrize("loop_name", LOOPS)
def test_many_children_leave_no_descriptor_and_no_process_behind(
    loop_name: str, pidfd: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compat._process, "_PIDFD", pidfd)  # the fallback where pidfds are refused
    script = "import sys; line = sys.stdin.readline(); sys.stdout.write('echo:' + line); sys.stderr.write('err\\n')"

    async def one() -> tuple[bytes, int]:
        process = await spawn(
            [sys.executable, "-c", script], cwd=None, env=child_env(), max_line_bytes=1024, stderr_tail_bytes=1024
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(process.pump_stderr)
            await process.send(b"hello\n")
            line = await process.receive_line()
            status = await process.wait(WAIT)
            await process.terminate(grace=1.0)
        assert process.stderr_tail() == "err\n"
        assert status is not None
        return line, status

    async def main() -> list[tuple[bytes, int]]:
        results: list[tuple[bytes, int]] = []

        async def collect() -> None:
            results.append(await one())

        async with anyio.create_task_group() as tg:
            for _ in range(30):
                tg.start_soon(collect)
        return results

    run_on(loop_name, lambda: anyio.to_thread.run_sync(lambda: None))  # the process's first worker
    before = fds_before()  # thread opens a pipe that stays: not ours to count
    results = run_on(loop_name, main)
    assert results == [(b"echo:hello", 0)] * 30
    assert open_fds() - before == set()


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_failed_start_is_a_spawn_error_and_leaks_nothing(loop_name: str) -> None:
    async def main() -> list[str]:
        messages = []
        for argv, cwd in (([sys.executable, "-c", "pass"], "/nonexistent/dir"), (["/nonexistent/agent"], None)):
            with pytest.raises(SpawnError) as caught:
                await spawn(argv, cwd=cwd, env=child_env(), max_line_bytes=64, stderr_tail_bytes=64)
            messages.append(str(caught.value))
        return messages

    before = fds_before()
    missing_dir, missing_command = run_on(loop_name, main)
    assert "working directory does not exist: /nonexistent/dir" in missing_dir
    assert "/nonexistent/agent" in missing_command
    assert open_fds() - before == set()


@pytest.mark.parametrize("loop_name", LOOPS)
def test_exit_status_signal_and_devnull_stdin(loop_name: str) -> None:
    async def main() -> tuple[int, int, bytes]:
        env = child_env()
        exits = await PidfdProcess.start(
            [sys.executable, "-c", "raise SystemExit(3)"], stdin_pipe=True, cwd=None, env=env
        )
        status = await exits.wait()
        await exits.aclose()
        sleeper = await PidfdProcess.start(
            [sys.executable, "-c", "import time; time.sleep(60)"], stdin_pipe=True, cwd=None, env=env
        )
        sleeper.send_signal(signal.SIGTERM)
        killed = await sleeper.wait()
        await sleeper.aclose()
        reads = await PidfdProcess.start(
            [sys.executable, "-c", "import sys; print(repr(sys.stdin.read()))"], stdin_pipe=False, cwd=None, env=env
        )
        assert reads.stdin is None and reads.stdout is not None
        out = await reads.stdout.receive()
        await reads.aclose()
        return status, killed, out

    status, killed, out = run_on(loop_name, main)
    assert status == 3
    assert killed == -signal.SIGTERM
    assert out.strip() == b"''"  # /dev/null: an immediate EOF, never a hang


@pytest.mark.parametrize("failing_step", [1, 2, 3])
@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_start_interrupted_while_connecting_its_pipes_closes_them_and_kills_the_child(
    loop_name: str, failing_step: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancellation at the n-th pipe connection (a timeout or ``session.cancel`` from another
    task) closes the pipes connected so far and ends the child's process group."""
    import compat._child as child

    steps = {"count": 0, "armed": 0}
    real_read, real_write = child._read_pipe, child._write_pipe

    def interrupt_at_step(real: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def connect(*args: Any) -> Any:
            stream = await real(*args)
            steps["count"] += steps["armed"]
            if steps["armed"] and steps["count"] == failing_step:
                raise asyncio.CancelledError
            return stream

        return connect

    monkeypatch.setattr(child, "_read_pipe", interrupt_at_step(real_read))
    monkeypatch.setattr(child, "_write_pipe", interrupt_at_step(real_write))

    async def main() -> tuple[int, set[int]]:
        pids: list[int] = []
        real_popen = child._popen
        warm = await PidfdProcess.start([sys.executable, "-c", "pass"], stdin_pipe=True, cwd=None, env=child_env())
        await warm.aclose()  # the loop's one-time descriptors (its wake-up fd; uvloop's /dev/null)
        before = open_fds()
        steps["armed"] = 1

        def recording_popen(*args: Any) -> Any:
            popen, ours = real_popen(*args)
            pids.append(popen.pid)
            return popen, ours

        monkeypatch.setattr(child, "_popen", recording_popen)
        with pytest.raises(asyncio.CancelledError):
            await PidfdProcess.start(
                [sys.executable, "-c", "import time; time.sleep(60)"], stdin_pipe=True, cwd=None, env=child_env()
            )
        await asyncio.sleep(0)  # let closed transports finish closing
        return pids[0], open_fds() - before  # checked before the loop closes what is left

    pid, left_open = run_on(loop_name, main)
    assert left_open == set()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped already, not a zombie of ours


async def test_a_start_does_not_wait_for_the_shared_worker_threads() -> None:
    """Children start on threads of their own (``SPAWN_THREADS``): with anyio's default 40 all
    busy (here: blocked), an agent still starts (bench case 4: 100 sessions at once queued the
    last start ~750 ms behind the first)."""
    import threading

    release = threading.Event()
    busy = anyio.to_thread.current_default_thread_limiter().total_tokens
    async with anyio.create_task_group() as tg:
        try:
            for _ in range(int(busy)):
                tg.start_soon(anyio.to_thread.run_sync, release.wait)
            with anyio.fail_after(WAIT):
                while anyio.to_thread.current_default_thread_limiter().borrowed_tokens < busy:
                    await anyio.sleep(0.01)
                child = await PidfdProcess.start(
                    [sys.executable, "-c", "pass"], stdin_pipe=False, cwd=None, env=child_env()
                )
                assert await child.wait() == 0
                await child.aclose()
        finally:
            release.set()  # the blocked threads cannot be cancelled: let them end


@pytest.mark.parametrize("new_session", [False, True])
def test_a_child_leads_its_own_group_and_a_new_session_only_under_a_terminal(
    new_session: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own process group always (killed as a whole); a session of its own only when the bridge
    has a controlling terminal (``NEW_SESSION``): with autogroup scheduling each session is a CPU
    share of its own, so 100 agents had 100 shares to the bridge's one (bench case 4)."""
    import compat._child

    monkeypatch.setattr(compat._child, "NEW_SESSION", new_session)

    async def main() -> tuple[int, int, int]:
        child = await PidfdProcess.start(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin_pipe=True, cwd=None, env=child_env()
        )
        try:
            return child.pid, os.getpgid(child.pid), os.getsid(child.pid)
        finally:
            await child.aclose()

    pid, group, session = run_on("uvloop", main)
    assert group == pid
    assert session == (pid if new_session else os.getsid(0))


@pytest.mark.parametrize("with_terminal", [False, True])
def test_new_session_follows_the_controlling_terminal(with_terminal: bool) -> None:
    import subprocess

    script = "import compat._child as c; print(c.NEW_SESSION)"
    if with_terminal:
        script = f"import fcntl, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); {script}"
    leader, follower = os.openpty() if with_terminal else (-1, -1)
    try:
        done = subprocess.run(
            [sys.executable, "-c", script],
            stdin=follower if with_terminal else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            start_new_session=True,
            timeout=30,
        )
    finally:
        for fd in (leader, follower):
            if fd >= 0:
                os.close(fd)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(with_terminal)
