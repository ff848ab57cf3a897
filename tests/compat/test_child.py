"""``compat.process.child``: children started with ``Popen`` in a worker thread, their pipes read
and written by plain tasks that wait on the descriptors, the exit through a pidfd (or a waiting
thread where pidfds are refused), on both loops the bridge runs on (asyncio's and uvloop's).

* Nothing leaks: after many children started, read, written, ended and reaped, the process holds
  the descriptors it held before; a start that fails (missing command or directory) leaks none.
* Exit status, signals and a ``/dev/null`` stdin behave as a shell's children do.
* What the child wrote before it exited is read in full even while a grandchild keeps stdout
  open; an unterminated final line is delivered.
* Each child leads its own process group, in the bridge's session unless the bridge has a
  controlling terminal.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
import uvloop

import compat.process.child as child_module
import compat.process.spawn as spawn_module
from compat.process.child import AgentProcess
from compat.process.env import child_env
from compat.process.lines import LineTooLong
from compat.process.spawn import SpawnError, spawn


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


async def start(script: str, **options: Any) -> AgentProcess:
    return await spawn(
        [sys.executable, "-c", script],
        cwd=None,
        env=child_env(),
        max_line_bytes=options.pop("max_line_bytes", 1024),
        stderr_tail_bytes=1024,
        **options,
    )


async def lines_of(process: AgentProcess) -> list[bytes]:
    """Pump ``process`` until its stdout ends; every line it wrote."""
    lines: list[bytes] = []
    await process.run(lines.append)
    return lines


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "waiting-thread"])
@pytest.mark.parametrize("loop_name", LOOPS)
def test_many_children_leave_no_descriptor_and_no_process_behind(
    loop_name: str, pidfd: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(child_module, "PIDFD", pidfd)  # the fallback where pidfds are refused
    script = "import sys; line = sys.stdin.readline(); sys.stdout.write('echo:' + line); sys.stderr.write('err\\n')"

    async def one() -> tuple[list[bytes], int | None]:
        process = await start(script)
        process.write(b"hello\n")
        lines = await lines_of(process)
        status = await process.wait(WAIT)
        await process.terminate(grace=1.0)
        assert process.stderr_tail() == "err\n"
        return lines, status

    async def main() -> list[tuple[list[bytes], int | None]]:
        results: list[tuple[list[bytes], int | None]] = []

        async def collect() -> None:
            results.append(await one())

        async with anyio.create_task_group() as tg:
            for _ in range(30):
                tg.start_soon(collect)
        return results

    run_on(loop_name, lambda: anyio.to_thread.run_sync(lambda: None))  # the process's first worker
    before = fds_before()  # thread opens a pipe that stays: not ours to count
    results = run_on(loop_name, main)
    assert results == [([b"echo:hello"], 0)] * 30
    assert open_fds() - before == set()


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_failed_start_is_a_spawn_error_and_leaks_nothing(loop_name: str) -> None:
    async def main() -> list[str]:
        messages = []
        cases: list[tuple[list[str], str | None]] = [
            ([sys.executable, "-c", "pass"], "/nonexistent/dir"),
            (["/nonexistent/agent"], None),
            ([sys.executable, "-m", "model\x00name"], None),  # a client's model after modelFlag
            ([], None),
        ]
        for argv, cwd in cases:
            with pytest.raises(SpawnError) as caught:
                await spawn(argv, cwd=cwd, env=child_env(), max_line_bytes=64, stderr_tail_bytes=64)
            messages.append(str(caught.value))
        return messages

    run_on(loop_name, lambda: anyio.to_thread.run_sync(lambda: None))  # the process's first worker
    before = fds_before()  # thread opens a pipe that stays: not ours to count
    missing_dir, missing_command, nul, empty = run_on(loop_name, main)
    assert "working directory does not exist: /nonexistent/dir" in missing_dir
    assert "/nonexistent/agent" in missing_command
    assert nul.endswith("an argument or environment value contains a NUL byte") and empty.endswith("no command")
    assert open_fds() - before == set()


@pytest.mark.parametrize("loop_name", LOOPS)
def test_exit_status_signal_and_devnull_stdin(loop_name: str) -> None:
    async def main() -> tuple[int | None, int | None, list[bytes]]:
        exits = await start("raise SystemExit(3)")
        status = await exits.wait(WAIT)
        await exits.terminate(1.0)
        sleeper = await start("import time; time.sleep(60)")
        os.kill(sleeper.pid, signal.SIGTERM)
        killed = await sleeper.wait(WAIT)
        await sleeper.terminate(1.0)
        reads = await start("import sys; print(repr(sys.stdin.read()))", stdin_pipe=False)
        out = await lines_of(reads)
        await reads.terminate(1.0)
        return status, killed, out

    status, killed, out = run_on(loop_name, main)
    assert status == 3
    assert killed == -signal.SIGTERM
    assert out == [b"''"]  # /dev/null: an immediate EOF, never a hang


GRANDCHILD_HOLDS_STDOUT = """
import subprocess, sys
subprocess.Popen(["sleep", "600"])  # inherits stdout: no EOF while it runs
sys.stdout.write("".join(f"line {i}\\n" for i in range(2000)) + "last, unterminated")
sys.stdout.flush()
"""


@pytest.mark.parametrize("loop_name", LOOPS)
def test_what_the_child_wrote_before_it_exited_is_read_though_a_grandchild_keeps_stdout(loop_name: str) -> None:
    """The leader's exit ends the reading (EOF never comes): what the pipe holds by then is read
    at once, to the unterminated last line, with no timed wait."""

    async def main() -> list[bytes]:
        process = await start(GRANDCHILD_HOLDS_STDOUT)
        try:
            return await lines_of(process)
        finally:
            await process.terminate(0.5)

    lines = run_on(loop_name, main)
    assert lines == [f"line {i}".encode() for i in range(2000)] + [b"last, unterminated"]


async def test_drain_hands_over_what_the_child_already_wrote() -> None:
    """``drain`` reads what is in the pipe now, without waiting for the reader task."""
    process = await start("import sys, time; print('one'); print('two', flush=True); time.sleep(60)")
    lines: list[bytes] = []
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(process.run, lines.append)
            with anyio.fail_after(WAIT):
                while process.stderr_bytes == 0 and not lines:
                    process.drain()  # no task switch needed: the bytes are read here
                    await anyio.sleep(0.01)  # the child writes from another process
            assert lines == [b"one", b"two"]
            tg.cancel_scope.cancel()
    finally:
        await process.terminate(0.5)


async def test_a_line_over_the_bound_fails_the_reading() -> None:
    process = await start("import sys, time; sys.stdout.write('x' * 5000 + '\\n'); sys.stdout.flush(); time.sleep(60)")
    try:
        with pytest.raises(LineTooLong), anyio.fail_after(WAIT):
            await lines_of(process)
    finally:
        await process.terminate(0.5)


async def test_a_child_that_does_not_read_its_stdin_cannot_grow_the_queue_without_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(child_module, "STDIN_QUEUE_BYTES", 1024 * 1024)
    process = await start("import time; time.sleep(60)")
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(process.run, lambda line: None)
            with pytest.raises(anyio.BrokenResourceError):
                for _ in range(1000):
                    process.write(b"x" * 4096)
            tg.cancel_scope.cancel()
    finally:
        await process.terminate(0.5)


@pytest.mark.parametrize("new_session", [False, True])
def test_a_child_leads_its_own_group_and_a_new_session_only_under_a_terminal(
    new_session: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own process group always (killed as a whole); a session of its own only when the bridge
    has a controlling terminal (``NEW_SESSION``): with autogroup scheduling each session is a CPU
    share of its own, so 100 agents would get 100 shares to the bridge's one."""
    monkeypatch.setattr(spawn_module, "NEW_SESSION", new_session)

    async def main() -> tuple[int, int, int]:
        child = await start("import sys; sys.stdin.read()")
        try:
            return child.pid, os.getpgid(child.pid), os.getsid(child.pid)
        finally:
            await child.terminate(1.0)

    pid, group, session = run_on("uvloop", main)
    assert group == pid
    assert session == (pid if new_session else os.getsid(0))


@pytest.mark.parametrize("with_terminal", [False, True])
def test_new_session_follows_the_controlling_terminal(with_terminal: bool) -> None:
    import subprocess

    script = "import compat.process.spawn as c; print(c.NEW_SESSION)"
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


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_pipe_the_child_closed_is_no_longer_watched(loop_name: str) -> None:
    """A pipe at EOF stays readable for good: still watched, it would wake the event loop on every
    pass (100% CPU for as long as the agent lives, which a closed stderr makes its whole life).
    Measured as this process's CPU while the loop has nothing else to do."""
    script = "import os, sys, time; os.close(2); print('closed', flush=True); time.sleep(60)"

    async def main() -> float:
        process = await start(script)
        try:
            async with anyio.create_task_group() as tg:
                lines: list[bytes] = []
                tg.start_soon(process.run, lines.append)
                with anyio.fail_after(WAIT):
                    while not lines:
                        await anyio.sleep(0.01)
                await anyio.sleep(0.2)  # the stderr reader meets its EOF
                cpu = time.process_time()
                await anyio.sleep(0.5)  # a window for a busy loop to show
                used = time.process_time() - cpu
                assert process.returncode is None
                tg.cancel_scope.cancel()
        finally:
            await process.terminate(0.5)
        return used

    assert run_on(loop_name, main) < 0.2  # seconds of CPU in 0.5 s: no loop spinning on the EOF
