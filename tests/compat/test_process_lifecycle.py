"""Process lifecycle and stderr redaction in compat/process, through the ACP adapter and directly
(the path exec profiles take).

* An agent whose leader exits while a (grand)child still holds its stdout ends the turn at once
  with ``AGENT_EXITED``, not at the turn timeout, and leaves no process behind, including a
  grandchild that called ``setsid`` (field-failures #15).
* A secret that a cut of the stderr tail would split never shows in part (``stderrTail``, the
  probe's reason).

Waits are bounded and on events or OS state, never bare sleeps.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from bridge.rpc.redact import register_secret
from compat.acp.session import AcpSession
from compat.base import TurnOutcome
from compat.process.child import AgentProcess
from compat.process.env import child_env, cut_tail
from compat.process.spawn import SpawnError, spawn

from .conftest import AgentFactory, RecordingSink, process_alive, turn_request, wait_gone, wait_log

KIB = 1024
ROOT = Path(__file__).resolve().parents[2]
TURN_TIMEOUT = 30.0  # what the turns below must end well under


def fragments(secret: str, size: int = 6) -> set[str]:
    """Every piece of ``secret`` that is ``size`` characters long."""
    return {secret[i : i + size] for i in range(len(secret) - size + 1)}


def shows_part_of(text: str, secret: str) -> bool:
    return any(piece in text for piece in fragments(secret))


async def _run_into(session: AcpSession, sink: RecordingSink, outcomes: list[TurnOutcome], done: anyio.Event) -> None:
    outcomes.append(await session.run_turn(turn_request(), sink))
    done.set()


# ---- the leader exits while a descendant holds stdout (ACP) -----------------------------------


async def test_crash_with_grandchildren_holding_stdout_is_agent_exited_at_once_and_leaves_nothing(
    make_agent: AgentFactory,
) -> None:
    adapter = await make_agent("grandchild", "grandchild-setsid", "crash", timeouts={"turn_timeout": TURN_TIMEOUT})
    session = adapter.open_session("s1")
    outcomes: list[TurnOutcome] = []
    done = anyio.Event()
    with anyio.fail_after(TURN_TIMEOUT / 2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_run_into, session, sink := RecordingSink(), outcomes, done)
            await sink.wait_for(lambda s: s.text == "partial")  # written just before exit(3)
            crashed = time.monotonic()
            await done.wait()
            elapsed = time.monotonic() - crashed
    outcome = outcomes[0]
    assert outcome.status == "failed" and outcome.error is not None
    assert outcome.error.code == "AGENT_EXITED" and outcome.error.data["exitCode"] == 3
    assert elapsed < 3.0  # ~the post-exit drain, not the turn timeout (nor stdout EOF, never)
    tail = outcome.error.data["stderrTail"]
    assert "fatal: model exploded" in tail and "sk-fake0123456789abcdef" not in tail
    assert session.pid is None
    agent = (await wait_log(make_agent.log, lambda e: e.get("event") == "start"))["pid"]
    pids = (await wait_log(make_agent.log, lambda e: e.get("event") == "grandchildren"))["pids"]
    assert len(pids) == 2  # one in the agent's group, one that escaped it with setsid
    await wait_gone([agent, *pids])


async def test_leader_killed_mid_turn_ends_the_turn_and_its_escaped_grandchild(make_agent: AgentFactory) -> None:
    adapter = await make_agent("grandchild", "grandchild-setsid", timeouts={"turn_timeout": TURN_TIMEOUT})
    session = adapter.open_session("s1")
    outcomes: list[TurnOutcome] = []
    done = anyio.Event()
    with anyio.fail_after(TURN_TIMEOUT / 2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_run_into, session, sink := RecordingSink(), outcomes, done)
            await sink.wait_for(lambda s: bool(s.text))
            pids = (await wait_log(make_agent.log, lambda e: e.get("event") == "grandchildren"))["pids"]
            agent = session.pid
            assert agent is not None
            setsid_child = psutil.Process(pids[1])
            assert os.getpgid(setsid_child.pid) != agent  # it really left the agent's group
            os.kill(agent, signal.SIGKILL)  # only the leader: both grandchildren keep stdout open
            killed = time.monotonic()
            await done.wait()
            elapsed = time.monotonic() - killed
    outcome = outcomes[0]
    assert outcome.error is not None and outcome.error.code == "AGENT_EXITED"
    assert outcome.error.data["exitCode"] == -signal.SIGKILL
    assert elapsed < 3.0
    await wait_gone([agent, *pids])


# ---- the same through AgentProcess directly (exec profiles) ------------------------------------


class Pumped:
    """An ``AgentProcess`` with its pumps running in a task group; its stdout lines are kept."""

    def __init__(self, proc: AgentProcess) -> None:
        self.proc = proc
        self.lines: list[bytes] = []
        self._changed = anyio.Event()

    def take(self, line: bytes) -> None:
        self.lines.append(line)
        self._changed.set()

    async def line(self, index: int = 0) -> bytes:
        with anyio.fail_after(10):
            while len(self.lines) <= index:
                self._changed = anyio.Event()
                await self._changed.wait()
        return self.lines[index]


@contextlib.asynccontextmanager
async def pumped(script: str, **spawn_args: Any) -> AsyncIterator[Pumped]:
    """``script`` run with ``python -c``, pumped, and ended (with everything it started) after."""
    proc = await spawn(
        [sys.executable, "-c", script],
        cwd=None,
        env=child_env(),
        max_line_bytes=KIB,
        stderr_tail_bytes=spawn_args.pop("stderr_tail_bytes", KIB),
    )
    child = Pumped(proc)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(proc.run, child.take)
            yield child
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await proc.terminate(0.5)


TREE = """
import subprocess, sys
escaped = subprocess.Popen(["sleep", "600"], start_new_session=True)
grouped = subprocess.Popen(["sleep", "600"])
print(escaped.pid, grouped.pid, flush=True)
sys.stdin.read()
"""

ORPHANED = """
import os, subprocess, sys
middle = os.fork()
if middle == 0:  # the classic daemon: a child that starts a new session, forks, and exits
    os.setsid()
    if os.fork() == 0:
        print(os.getpid(), flush=True)
        os.execvp("sleep", ["sleep", "600"])
    os._exit(0)
os.waitpid(middle, 0)
print("orphaned", flush=True)
sys.stdin.read()
"""


def sleepers_cleanup(pids: list[int]) -> None:
    for pid in pids:  # never leave a sleeper behind, even when the test failed
        if process_alive(pid):
            os.kill(pid, signal.SIGKILL)


async def test_terminate_after_the_leader_died_kills_the_escaped_descendant() -> None:
    """The leader is killed on its own: its children (one left the group with setsid) are
    re-parented to the bridge, a child subreaper, and ending the agent still finds them."""
    async with pumped(TREE) as child:
        pids = [int(p) for p in (await child.line()).split()]
        try:
            proc = child.proc
            os.kill(proc.pid, signal.SIGKILL)
            assert await proc.wait(5) == -signal.SIGKILL  # the leader's exit, though stdout stays open
            assert all(process_alive(pid) for pid in pids)
            assert {psutil.Process(pid).ppid() for pid in pids} == {os.getpid()}  # adopted by the bridge
            with anyio.fail_after(10):
                await proc.terminate(0.5)
            await wait_gone(pids)
        finally:
            sleepers_cleanup(pids)


async def test_an_orphaned_descendant_that_left_the_group_is_ended_with_its_agent() -> None:
    """A daemon the agent started (setsid, fork, exit) is out of the agent's tree and group while
    the agent still runs; it carries the agent's spawn mark, so ending the agent ends it too."""
    async with pumped(ORPHANED) as child:
        await child.line(1)
        daemon = next(int(line) for line in child.lines if line.isdigit())
        proc = child.proc
        try:
            assert psutil.Process(daemon).ppid() == os.getpid() and os.getpgid(daemon) != proc.pid
            assert proc.returncode is None  # the agent still runs
            with anyio.fail_after(10):
                await proc.terminate(0.5)
            await wait_gone([daemon])
        finally:
            sleepers_cleanup([daemon])


async def test_the_bridge_reaps_what_it_adopts_but_never_another_owners_child() -> None:
    """Adopted orphans that exit are reaped (no zombies pile up under a long-lived bridge); a
    child other code in the process started keeps its exit status for its owner."""
    from compat.process.descendants import reap_orphans

    theirs = subprocess.Popen([sys.executable, "-c", "raise SystemExit(5)"])
    async with pumped(TREE) as child:
        pids = [int(p) for p in (await child.line()).split()]
        try:
            os.kill(child.proc.pid, signal.SIGKILL)
            await child.proc.wait(5)
            with anyio.fail_after(10):
                await child.proc.terminate(0.5)
            await wait_gone(pids)
        finally:
            sleepers_cleanup(pids)
    await wait_zombie(theirs.pid)
    reap_orphans()
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).ppid() != os.getpid()  # reaped, not a zombie of ours
    assert theirs.wait(5) == 5  # its owner, not the bridge, reaped it


SHORT_DAEMON = """
import os, sys, time
middle = os.fork()
if middle == 0:  # a daemon that leaves the group and exits on its own, before anyone looked
    os.setsid()
    if os.fork() == 0:
        print(os.getpid(), flush=True)
        os._exit(0)
    time.sleep(0.2)
    os._exit(0)
os.waitpid(middle, 0)
print("orphaned", flush=True)
sys.stdin.read()
"""


async def wait_zombie(pid: int) -> None:
    with anyio.fail_after(10):
        while psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            await anyio.sleep(0.01)  # polling OS state: no event exists for another's exit


@pytest.mark.parametrize("trigger", ["sweeps", "periodic"])
async def test_a_daemon_that_exited_before_anyone_saw_it_is_reaped_while_its_agent_runs(trigger: str) -> None:
    """It left the agent's group, and a zombie's environment (its spawn mark) cannot be read: it
    was reaped only when the bridge exited. Now a zombie nobody claimed by the next sweep is."""
    from compat.process.descendants import reap_orphans, reap_orphans_forever

    async with pumped(SHORT_DAEMON) as child:
        await child.line(1)
        daemon = next(int(line) for line in child.lines if line.isdigit())
        assert psutil.Process(daemon).ppid() == os.getpid()  # adopted by the bridge, a subreaper
        await wait_zombie(daemon)
        if trigger == "sweeps":
            reap_orphans(unclaimed_for=0.05)  # first sighting: maybe another owner's, about to reap it
            assert psutil.Process(daemon).status() == psutil.STATUS_ZOMBIE
            with anyio.fail_after(10):
                while not reap_orphans(unclaimed_for=0.05):
                    await anyio.sleep(0.02)  # the time an owner gets to reap its own child
        else:
            async with anyio.create_task_group() as tg:
                tg.start_soon(reap_orphans_forever, 0.05)
                with anyio.fail_after(10):
                    while psutil.pid_exists(daemon):
                        await anyio.sleep(0.02)  # the sweeps run on their own clock
                tg.cancel_scope.cancel()
        assert not psutil.pid_exists(daemon)
        assert child.proc.returncode is None  # the agent still runs: nothing waited for its end


async def test_a_start_does_not_wait_for_the_shared_worker_threads() -> None:
    """Children start on a thread of their own (``compat.process.threads``): with anyio's default
    40 all busy (here: blocked), an agent still starts (bench case 4: 100 sessions at once queued
    the last start ~750 ms behind the first)."""
    import threading

    release = threading.Event()
    busy = int(anyio.to_thread.current_default_thread_limiter().total_tokens)
    async with anyio.create_task_group() as tg:
        try:
            for _ in range(busy):
                tg.start_soon(anyio.to_thread.run_sync, release.wait)
            with anyio.fail_after(10):
                while anyio.to_thread.current_default_thread_limiter().borrowed_tokens < busy:
                    await anyio.sleep(0.01)
                proc = await spawn(
                    [sys.executable, "-c", "pass"],
                    cwd=None,
                    env=child_env(),
                    max_line_bytes=1024,
                    stderr_tail_bytes=1024,
                )
                assert await proc.wait(5) == 0
        finally:
            release.set()  # the blocked threads cannot be cancelled: let them end
    await proc.terminate(0.5)


async def test_the_event_loop_runs_while_a_start_waits_for_its_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """A start waits off the event loop until its child reaches ``exec`` (``compat.process.spawn``):
    here the start is held until a task on the loop lets it go. Run in the loop, the start would
    hold the loop, the task could never run, and the start would fail after 5 s."""
    import threading

    from compat.process import spawn as spawn_module

    release, entered = threading.Event(), threading.Event()
    real_popen = spawn_module._popen

    def held_popen(*args: Any) -> Any:
        entered.set()
        if not release.wait(5):
            raise OSError("the event loop did not run while the start waited")
        return real_popen(*args)

    monkeypatch.setattr(spawn_module, "_popen", held_popen)
    started: list[AgentProcess] = []

    async def start() -> None:
        started.append(
            await spawn(
                [sys.executable, "-c", "pass"], cwd=None, env=child_env(), max_line_bytes=1024, stderr_tail_bytes=1024
            )
        )

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(start)
            await anyio.to_thread.run_sync(entered.wait, 5)  # the start is waiting for its child
            release.set()  # this line runs only if the loop is free meanwhile
    assert await started[0].wait(5) == 0
    await started[0].terminate(0.5)


def _spawn_pass() -> Any:
    return spawn([sys.executable, "-c", "pass"], cwd=None, env=child_env(), max_line_bytes=1024, stderr_tail_bytes=1024)


@contextlib.asynccontextmanager
async def held_first_start(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[int]]:
    """A first start held in ``Popen`` (as by a file system that does not answer its ``exec``)
    while the body runs; yields the list of ``Popen`` calls. Then the held start finishes, and
    its child exits 0 and is ended."""
    import threading

    from compat.process import spawn as spawn_module

    release, entered = threading.Event(), threading.Event()
    calls: list[int] = []
    real_popen = spawn_module._popen

    def held_popen(*args: Any) -> Any:
        calls.append(1)
        entered.set()
        release.wait(5)
        return real_popen(*args)

    monkeypatch.setattr(spawn_module, "_popen", held_popen)
    first: list[AgentProcess] = []

    async def start_first() -> None:
        first.append(await _spawn_pass())

    async with anyio.create_task_group() as tg:
        tg.start_soon(start_first)
        await anyio.to_thread.run_sync(entered.wait, 5)  # the first start holds the start thread
        try:
            yield calls
        finally:
            release.set()
    assert await first[0].wait(5) == 0
    await first[0].terminate(0.5)


async def test_starts_run_one_at_a_time_and_a_cancelled_waiter_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starts queue for the start thread one at a time; a caller cancelled while it waits for its
    turn starts no child (nothing to leak), and the one already starting finishes."""
    with anyio.fail_after(10):
        async with held_first_start(monkeypatch) as calls:
            with anyio.move_on_after(0.2) as waiting:  # the second waits behind it, then is cancelled
                await _spawn_pass()
            assert waiting.cancelled_caught
    assert calls == [1]  # the cancelled caller never reached Popen


async def test_starts_behind_a_stuck_start_fail_with_a_reason_instead_of_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A start held in ``exec`` (a hung network mount) cannot be cut off; the ones behind it give
    up after ``START_SLOT_WAIT`` with a SpawnError that says why, and the held one still ends."""
    from compat.process import spawn as spawn_module

    monkeypatch.setattr(spawn_module, "START_SLOT_WAIT", 0.2)
    with anyio.fail_after(10):
        async with held_first_start(monkeypatch) as calls:
            with pytest.raises(SpawnError, match=r"another agent's start has not finished for 0\.2 s"):
                await _spawn_pass()
    assert calls == [1]


async def test_the_walk_at_kill_time_finds_the_escaped_and_the_grouped_grandchild() -> None:
    """While the leader lives its tree is walked at kill time: what left the group is found."""
    from compat.process.descendants import find_descendants

    async with pumped(TREE) as child:
        pids = [int(p) for p in (await child.line()).split()]
        try:
            found = {p.pid for p in find_descendants(child.proc.pid, "no-mark", leader_alive=True)}
            assert set(pids) <= found
        finally:
            sleepers_cleanup(pids)


LEAVES_ITS_GROUP = """
import os, sys, time
os.setpgid(0, os.getpgid(os.getppid()))  # refused to a session leader; allowed within our session
print("moved", flush=True)
time.sleep(600)
"""


async def test_terminate_reaches_a_leader_that_left_its_group() -> None:
    """In the bridge's session an agent may join another group (even the bridge's): the group
    signal no longer reaches it, the signal to the leader itself does."""
    async with pumped(LEAVES_ITS_GROUP) as child:
        line = await child.line()
        with anyio.fail_after(10):
            status = await child.proc.terminate(0.5)
        assert status in (-signal.SIGTERM, -signal.SIGKILL), (line, status)


@pytest.mark.parametrize("pidfd", [True, False])
async def test_terminate_keeps_the_exit_status_of_a_leader_that_already_exited(
    monkeypatch: pytest.MonkeyPatch, pidfd: bool
) -> None:
    """A leader that exited on its own (a zombie until reaped) reports its own status, with pidfds
    and on the fallback where a worker thread waits for it."""
    import compat.process.child as child_module

    monkeypatch.setattr(child_module, "PIDFD", pidfd)
    proc = await spawn(
        [sys.executable, "-c", "raise SystemExit(3)"],
        cwd=None,
        env=child_env(),
        max_line_bytes=KIB,
        stderr_tail_bytes=KIB,
    )
    with anyio.fail_after(10):
        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
            await anyio.sleep(0.005)  # polling OS state: no event exists for it
    assert await proc.terminate(2.0) == 3


STOPS_ITSELF = """
import os, signal, sys
signal.signal(signal.SIGTERM, lambda *_: os._exit(7))
print("stopping", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
sys.stdin.read()
"""


async def test_a_stopped_agent_still_gets_a_clean_shutdown() -> None:
    """SIGTERM is followed by SIGCONT: a stopped process acts on SIGTERM only once continued, so
    without it terminate waited the whole grace and then had to SIGKILL."""
    grace = 10.0
    async with pumped(STOPS_ITSELF) as child:
        proc = child.proc
        await child.line()
        with anyio.fail_after(10):
            while psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED:
                await anyio.sleep(0.01)  # polling OS state: no event exists for a stop
        started = time.monotonic()
        assert await proc.terminate(grace) == 7
        assert time.monotonic() - started < grace / 2


# ---- secrets cut by the stderr tail ------------------------------------------------------------


async def test_stderr_tail_never_shows_part_of_a_key_the_client_cut_splits(
    make_agent: AgentFactory,
) -> None:
    key = "Zq9vLm2TxR7wKp4NbY8cHd3F"
    adapter = await make_agent("leak-key", env={"FAKE_API_KEY": key})
    outcome = await adapter.open_session("s1").run_turn(turn_request(), RecordingSink())
    assert outcome.error is not None and outcome.error.code == "AGENT_EXITED"
    tail = outcome.error.data["stderrTail"]
    assert not shows_part_of(tail, key), tail[:40]
    assert tail and set(tail) == {"p"}  # the padding line, cut on its boundary
    assert len(tail.encode()) <= adapter.limits.client_stderr_tail_bytes


@pytest.mark.parametrize("cut", [4 * KIB, 500])
async def test_probe_reason_never_shows_part_of_a_key(make_agent: AgentFactory, cut: int) -> None:
    key = f"Pk7Hq2Wx9Lm4Rt6Vb8Nc{cut}Zd"
    args = [*make_agent.config("leak-key-start").args, "--leak-cut", str(cut)]
    adapter = await make_agent(args=args, env={"FAKE_API_KEY": key})
    result = await adapter.probe_full()
    assert result.status == "error" and "code 1" in result.detail
    assert not shows_part_of(result.detail, key), result.detail[:80]


async def test_the_kept_tail_is_redacted_whole_even_when_the_ring_cut_splits_a_key() -> None:
    key = "Rg5Tn8Kd2Wq7Ys4Lp9Vm3Xc6"
    register_secret(key)
    kept = 100  # the ring keeps 100 bytes: its cut falls 6 characters into the key
    script = f"import sys; sys.stderr.write('boot: key {key}\\n' + 'q' * {kept - len(key) + 5})"
    async with pumped(script, stderr_tail_bytes=kept) as child:
        await child.proc.wait(10)
        proc = child.proc
    padding = "q" * (kept - len(key) + 5)
    assert proc.stderr_tail() == proc.stderr_tail(kept) == padding  # the split line is dropped
    assert proc.stderr_tail(50) == ""  # a cut with no line boundary in it shows nothing


def test_cut_tail_starts_on_a_line_boundary() -> None:
    assert cut_tail("short", 10) == "short"
    assert cut_tail("line one\nline two\n", 9) == "line two\n"  # the cut fell on a boundary
    assert cut_tail("abc secret-part\nrest", 10) == "rest"  # the partial line is dropped
    assert cut_tail("xx key-fragment tail end", 14) == "tail end"  # no newline: up to a blank
    assert cut_tail("x" * 100, 10) == ""  # nothing to cut on: nothing shown
    assert cut_tail("é" * 10 + "\nok", 5) == "ok"  # UTF-8 bytes, never half a character
    assert cut_tail("[REDACTED]\n" + "p" * 20, 24) == "p" * 20
