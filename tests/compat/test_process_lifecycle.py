"""Process lifecycle and stderr redaction in compat/_process.py, through the ACP adapter and
directly (the path exec profiles take).

* An agent whose leader exits while a (grand)child still holds its stdout ends the turn at once
  with ``AGENT_EXITED``, not at the turn timeout, and leaves no process behind, including a
  grandchild that called ``setsid`` (field-failures #15).
* A secret that a cut of the stderr tail would split never shows in part (``stderrTail``, the
  probe's reason).

Waits are bounded and on events or OS state, never bare sleeps.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import psutil
import pytest

from bridge.rpc.redact import register_secret
from compat._process import _PROC_CHILDREN, AgentProcess, child_env, cut_tail, spawn
from compat.acp import AcpSession
from compat.base import TurnOutcome

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
    adapter = make_agent("grandchild", "grandchild-setsid", "crash", timeouts={"turn_timeout": TURN_TIMEOUT})
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
    adapter = make_agent("grandchild", "grandchild-setsid", timeouts={"turn_timeout": TURN_TIMEOUT})
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

TREE = """
import subprocess, sys
escaped = subprocess.Popen(["sleep", "600"], start_new_session=True)
grouped = subprocess.Popen(["sleep", "600"])
print(escaped.pid, grouped.pid, flush=True)
sys.stdin.readline()
"""


@pytest.fixture
async def tree() -> AsyncIterator[tuple[AgentProcess, list[int]]]:
    """A leader with a grandchild in its group and one that escaped it; both hold stdout."""
    proc = await spawn(
        [sys.executable, "-c", TREE], cwd=None, env=child_env(), max_line_bytes=KIB, stderr_tail_bytes=KIB
    )
    pids: list[int] = []
    try:
        with anyio.fail_after(10):
            pids = [int(p) for p in (await proc.receive_line()).split()]
        yield proc, pids
    finally:
        with anyio.CancelScope(shield=True):
            await proc.terminate(0.5)
        for pid in pids:  # never leave a sleeper behind, even when the test failed
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)


async def test_terminate_after_the_leader_died_kills_the_escaped_descendant(
    tree: tuple[AgentProcess, list[int]],
) -> None:
    proc, pids = tree
    await proc.refresh_descendants()
    assert set(pids) <= proc.known_descendants
    os.kill(proc.pid, signal.SIGKILL)
    assert await proc.wait(5) == -signal.SIGKILL  # the leader's exit, though stdout stays open
    assert all(process_alive(pid) for pid in pids)  # re-parented, one of them out of the group
    assert psutil.Process(pids[0]).ppid() != proc.pid
    with anyio.fail_after(10):
        await proc.terminate(0.5)
    await wait_gone(pids)


async def test_the_stderr_pump_keeps_the_descendant_snapshot_fresh(tree: tuple[AgentProcess, list[int]]) -> None:
    proc, pids = tree
    async with anyio.create_task_group() as tg:
        await tg.start(proc.pump_stderr)
        with anyio.fail_after(5):
            while not set(pids) <= proc.known_descendants:
                await anyio.sleep(0.02)  # polling the pump's background scan; no event exists for it
        os.kill(proc.pid, signal.SIGKILL)
        assert await proc.wait(5) == -signal.SIGKILL
        await proc.terminate(0.5)
        await wait_gone(pids)
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("per_thread_children", [True, False] if _PROC_CHILDREN else [False])
async def test_both_descendant_walks_find_the_escaped_and_the_grouped_grandchild(
    tree: tuple[AgentProcess, list[int]], monkeypatch: pytest.MonkeyPatch, per_thread_children: bool
) -> None:
    """Where the kernel lists each thread's children the walk starts at the leader; elsewhere
    it reads the whole process table (in a worker thread). Both must see the same tree."""
    import compat._process as process

    monkeypatch.setattr(process, "_PROC_CHILDREN", per_thread_children)
    proc, pids = tree
    assert set(pids) <= set(process._descendant_pids(proc.pid, 0.0))
    await proc.refresh_descendants()
    assert set(pids) <= proc.known_descendants


async def test_the_snapshot_drops_descendants_that_ended(tree: tuple[AgentProcess, list[int]]) -> None:
    proc, pids = tree
    await proc.refresh_descendants()
    os.kill(pids[0], signal.SIGKILL)
    await wait_gone([pids[0]])
    await proc.refresh_descendants()
    assert pids[0] not in proc.known_descendants and pids[1] in proc.known_descendants


async def test_a_trackers_waits_run_out_on_a_timer_not_a_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop fires timers up to 1 ms early and anyio re-arms a deadline until the loop's clock
    reaches it, so each of a tracker's waits (one a second per agent) spun the event loop for up
    to a millisecond; the waits are cancelled by a plain loop timer instead."""
    import anyio._backends._asyncio as backend

    import compat._process as process

    monkeypatch.setattr(process, "_SCAN_RAMP", (0.01,) * 5)
    scans: list[float] = []
    deadline_checks = [0]
    real_timeout = backend.CancelScope._timeout

    def counted_timeout(scope: backend.CancelScope) -> None:
        deadline_checks[0] += scope.deadline != math.inf  # also called on entering any scope
        real_timeout(scope)

    async def record(self: AgentProcess, max_age: float = 0.0) -> None:
        scans.append(time.monotonic())

    monkeypatch.setattr(backend.CancelScope, "_timeout", counted_timeout)
    monkeypatch.setattr(AgentProcess, "refresh_descendants", record)
    proc = await spawn(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        cwd=None,
        env=child_env(),
        max_line_bytes=KIB,
        stderr_tail_bytes=KIB,
    )
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(proc.track_descendants)
            while len(scans) < 5:
                await anyio.sleep(0.01)  # polling the tracker's own schedule; no event exists for it
            tg.cancel_scope.cancel()
        assert deadline_checks[0] == 0
    finally:
        with anyio.CancelScope(shield=True):
            await proc.terminate(0.5)


LEAVES_ITS_GROUP = """
import os, sys, time
os.setpgid(0, os.getpgid(os.getppid()))  # refused to a session leader; allowed within our session
print("moved", flush=True)
time.sleep(600)
"""


async def test_terminate_reaches_a_leader_that_left_its_group() -> None:
    """In the bridge's session an agent may join another group (even the bridge's): the group
    signal no longer reaches it, the signal to the leader itself does."""
    proc = await spawn(
        [sys.executable, "-c", LEAVES_ITS_GROUP], cwd=None, env=child_env(), max_line_bytes=KIB, stderr_tail_bytes=KIB
    )
    try:
        with anyio.fail_after(10):
            line = await proc.receive_line()
        with anyio.fail_after(10):
            status = await proc.terminate(0.5)
        assert status in (-signal.SIGTERM, -signal.SIGKILL), (line, status)
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait(5)


def test_terminate_keeps_the_exit_status_of_a_zombie_leader_on_the_fallback_path(tmp_path: Path) -> None:
    """Without pidfds, on asyncio's loop, a child watcher thread reaps the leader. terminate must
    not reap it first (``Popen.send_signal`` polls): the watcher then reported 255, not the exit
    status. The watcher is held back here as on a loaded host, and the leader is a zombie."""
    script = """
import os, sys, threading, time
from contextlib import suppress
import anyio, psutil
import compat._process as process

process._PIDFD = False
real_waitpid = os.waitpid

def late_waitpid(pid, options):
    if threading.current_thread().name.startswith("asyncio-waitpid-"):
        with suppress(ChildProcessError):
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        time.sleep(0.05)
    return real_waitpid(pid, options)

os.waitpid = late_waitpid

async def main():
    proc = await process.spawn([sys.executable, "-c", "raise SystemExit(3)"], cwd=None,
                               env=process.child_env(), max_line_bytes=1024, stderr_tail_bytes=1024)
    with anyio.fail_after(10):
        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
            await anyio.sleep(0.005)
    print(await proc.terminate(2.0))

anyio.run(main)
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "3", done.stderr


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
    proc = await spawn(
        [sys.executable, "-c", STOPS_ITSELF], cwd=None, env=child_env(), max_line_bytes=KIB, stderr_tail_bytes=KIB
    )
    try:
        with anyio.fail_after(10):
            await proc.receive_line()
            while psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED:
                await anyio.sleep(0.01)  # polling OS state: no event exists for a stop
        started = time.monotonic()
        assert await proc.terminate(grace) == 7
        assert time.monotonic() - started < grace / 2
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait(5)


async def test_agents_started_together_do_not_scan_their_descendants_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each tracker's waits are jittered (``_SCAN_JITTER``): agents whose turns start in the same
    moment would otherwise scan in the same moment, a burst on the event loop that every update
    arriving then waits behind (bench case 4: 100 agents, seven bursts a turn)."""
    import compat._process as process

    monkeypatch.setattr(process, "_SCAN_RAMP", (0.05,) * 6)
    scans: dict[int, list[float]] = {}

    async def record(self: AgentProcess, max_age: float = 0.0) -> None:
        scans.setdefault(self.pid, []).append(time.monotonic())

    monkeypatch.setattr(AgentProcess, "refresh_descendants", record)
    procs = [
        await spawn(
            [sys.executable, "-c", "import sys; sys.stdin.read()"],
            cwd=None,
            env=child_env(),
            max_line_bytes=KIB,
            stderr_tail_bytes=KIB,
        )
        for _ in range(2)
    ]
    try:
        async with anyio.create_task_group() as tg:
            for proc in procs:
                tg.start_soon(proc.track_descendants)
            with anyio.fail_after(10):
                while min(len(scans.get(proc.pid, ())) for proc in procs) < 6:
                    await anyio.sleep(0.05)  # polling the trackers' own schedule; no event exists for it
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            for proc in procs:
                await proc.terminate(0.5)
    first, second = (scans[proc.pid][:6] for proc in procs)
    apart = [abs(a - b) for a, b in zip(first, second, strict=False)]
    assert max(apart) > 0.005, apart  # without jitter both wake at the same deadlines, microseconds apart


# ---- secrets cut by the stderr tail ------------------------------------------------------------


async def test_stderr_tail_never_shows_part_of_a_key_the_client_cut_splits(
    make_agent: AgentFactory,
) -> None:
    key = "Zq9vLm2TxR7wKp4NbY8cHd3F"
    adapter = make_agent("leak-key", env={"FAKE_API_KEY": key})
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
    adapter = make_agent(args=args, env={"FAKE_API_KEY": key})
    result = await adapter.probe_full()
    assert result.status == "error" and "code 1" in result.detail
    assert not shows_part_of(result.detail, key), result.detail[:80]


async def test_the_kept_tail_is_redacted_whole_even_when_the_ring_cut_splits_a_key() -> None:
    key = "Rg5Tn8Kd2Wq7Ys4Lp9Vm3Xc6"
    register_secret(key)
    kept = 100  # the ring keeps 100 bytes: its cut falls 6 characters into the key
    script = f"import sys; sys.stderr.write('boot: key {key}\\n' + 'q' * {kept - len(key) + 5})"
    proc = await spawn(
        [sys.executable, "-c", script], cwd=None, env=child_env(), max_line_bytes=KIB, stderr_tail_bytes=kept
    )
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(proc.pump_stderr)
            assert await proc.wait_stderr_eof(10)
            tg.cancel_scope.cancel()
    finally:
        await proc.terminate(0.5)
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
