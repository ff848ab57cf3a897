"""Graceful shutdown (docs/api.md "Graceful shutdown"): on SIGTERM a streaming SSE turn is told the
bridge is stopping, gets shutdownGrace, then is cancelled and its response ends with the result and
a clean end of the body; an idle WebSocket is closed with 1012; the agent and its grandchild are
ended; the bridge exits 0 within shutdownGrace + cancelGrace + 2 s. acp-stdio at the end of its
input cancels its running turn and records it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil
import pytest
import yaml
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.sessions.test_restart import BRIDGE, Bridge, gone, turn
from tests.test_app_integration import FAKE_AGENT

pytestmark = pytest.mark.timeout(90)
GRACE, CANCEL_GRACE = 1.0, 1.0


def config(tmp_path: Path, *modes: str) -> Path:
    """A config whose ``fake`` agent runs in ``modes`` (default: slow, with a grandchild)."""
    args = [str(FAKE_AGENT), *(a for mode in modes or ("slow", "grandchild") for a in ("--mode", mode))]
    data = {
        "workspaceRoots": [str(tmp_path)],
        "providers": {"fake": {"command": sys.executable, "args": args}},
        "timeouts": {"cancelGrace": CANCEL_GRACE, "shutdownGrace": GRACE},
    }
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_sigterm_ends_streams_cleanly_closes_websockets_with_1012_and_ends_every_agent(tmp_path):
    bridge = Bridge(tmp_path, config(tmp_path))
    try:
        with connect(f"ws://127.0.0.1:{bridge.port}/acp") as idle:
            stopped_at, agents, events, tail = stream_then_stop(bridge)
            assert bridge.proc.wait(timeout=GRACE + CANCEL_GRACE + 10) == 0
            took = time.monotonic() - stopped_at
            with pytest.raises(ConnectionClosed) as closed:
                idle.recv(timeout=5)
    finally:
        bridge.stop()
    events += [orjson.loads(line[6:]) for line in tail if line.startswith("data: {")]
    assert tail[-1] == "data: [DONE]" or "data: [DONE]" in tail  # a clean end of the body
    updates = [e["params"] for e in events if e.get("method") == "session.update"]
    kinds = ["done" if u["type"] == "done" else u["event"] for u in updates]
    assert "bridge_stopping" in kinds and kinds.index("bridge_stopping") < kinds.index("done")
    result = events[-1]["result"]
    assert result["status"] == "cancelled" and result["output"].startswith("0 1 ")
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
    assert took < GRACE + CANCEL_GRACE + 2 + 1.5  # the bound, with a margin for this machine
    assert all(gone(p) for p in agents)
    log = (tmp_path / f"bridge-{bridge.port}.log").read_text()
    assert "stopping: 1 turn(s) running or queued get 1 s to finish (shutdownGrace)" in log  # said at once


def stream_then_stop(bridge: Bridge) -> tuple[float, list[psutil.Process], list[dict[str, Any]], list[str]]:
    """Stream a turn over SSE; once it streams, SIGTERM the bridge and read the body to its end.
    Returns when the signal went, the agent processes, the events before it, the lines after."""
    headers = {"Accept": "text/event-stream"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "session.start", "params": turn("s1", "go", "fake")}
    events: list[dict[str, Any]] = []
    with httpx.stream("POST", f"{bridge.url}/acp/rpc", json=body, headers=headers, timeout=30) as response:
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data: {"):
                events.append(orjson.loads(line[6:]))
                if events[-1].get("params", {}).get("delta") == "1 ":
                    break
        agents = psutil.Process(bridge.proc.pid).children(recursive=True)
        assert len(agents) >= 2  # the agent and its grandchild
        stopped_at = time.monotonic()
        bridge.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE
        while httpx.get(f"{bridge.url}/api/ping", timeout=2).status_code != 503 and time.monotonic() < deadline:
            time.sleep(0.02)  # until the bridge has begun to stop
        with pytest.raises((InvalidStatus, OSError)):  # a new WebSocket is refused while it stops
            connect(f"ws://127.0.0.1:{bridge.port}/acp", open_timeout=5).close()
        tail = list(lines)  # to the end of the body: it must end cleanly
    return stopped_at, agents, events, tail


def test_acp_stdio_at_the_end_of_its_input_cancels_its_running_turn_and_records_it(tmp_path):
    cfg = config(tmp_path)
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [*BRIDGE, "acp-stdio", "--config", str(cfg), "--state-dir", str(state)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    assert proc.stdin is not None and proc.stdout is not None
    request = {"jsonrpc": "2.0", "id": 1, "method": "session.start", "params": turn("s1", "go", "fake")}
    proc.stdin.write(json.dumps(request).encode() + b"\n")
    proc.stdin.flush()
    for line in proc.stdout:
        if json.loads(line).get("params", {}).get("delta") == "1 ":
            break
    proc.stdin.close()  # the editor is gone
    answers = [json.loads(line) for line in proc.stdout]
    assert proc.wait(timeout=CANCEL_GRACE + 10) == 0
    result = next(a for a in answers if a.get("id") == 1)["result"]
    assert result["status"] == "cancelled"
    get = {"jsonrpc": "2.0", "id": 2, "method": "session.get", "params": {"sessionId": "s1"}}
    again = subprocess.run(
        [*BRIDGE, "acp-stdio", "--config", str(cfg), "--state-dir", str(state)],
        input=json.dumps(get).encode() + b"\n",
        capture_output=True,
        cwd=tmp_path,
        timeout=60,
    )
    snapshot = json.loads(again.stdout.splitlines()[-1])["result"]
    assert snapshot["turns"][0]["status"] == "cancelled"


def test_agents_that_ignore_sigterm_are_ended_together_so_the_bound_holds_for_many(tmp_path):
    """Each idle session's agent gets KILL_GRACE between SIGTERM and SIGKILL; one after another,
    8 such agents took 8 times that. Ended together, the bridge exits within the bound."""
    bridge = Bridge(tmp_path, config(tmp_path, "ignore-term"))
    try:
        for i in range(8):  # each session keeps its agent after its turn
            body = {"jsonrpc": "2.0", "id": i, "method": "session.start", "params": turn(f"s{i}", "hi", "fake")}
            assert httpx.post(f"{bridge.url}/acp/rpc", json=body, timeout=30).json()["result"]["status"] == "completed"
        agents = psutil.Process(bridge.proc.pid).children(recursive=True)
        assert len(agents) >= 8
        stopped_at = time.monotonic()
        bridge.proc.send_signal(signal.SIGTERM)
        assert bridge.proc.wait(timeout=30) == 0
        took = time.monotonic() - stopped_at
    finally:
        bridge.stop()
    assert took < GRACE + CANCEL_GRACE + 2 + 1.5, took  # the bound, with a margin for this machine
    assert all(gone(p) for p in agents)
