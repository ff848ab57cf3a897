"""Durable sessions across a crash (docs/api.md "Resumable streams and durable sessions"): a bridge
killed with SIGKILL during a turn, restarted on the same state directory, reads its sessions back,
records the interrupted turn as BRIDGE_RESTARTED with its streamed output, ends the agent it left
behind, continues the conversation, and never gives a seq twice."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil
import pytest
import yaml

from tests.test_app_integration import FAKE_AGENT
from tests.test_cli_smoke import free_port

pytestmark = pytest.mark.timeout(90)
READY = 30.0  # seconds a bridge may take to answer /api/ping
BRIDGE = (sys.executable, "-m", "bridge.cli")


def config(tmp_path: Path) -> Path:
    def agent(*modes: str) -> dict[str, Any]:
        args = [str(FAKE_AGENT), *[a for m in modes for a in ("--mode", m)]]
        return {"command": sys.executable, "args": args}

    path = tmp_path / "bridge.yaml"
    data = {
        "workspaceRoots": [str(tmp_path)],
        "providers": {"fake": agent("slow"), "stuck": agent("silent", "ignore-term"), "echo": agent()},
        "timeouts": {"cancelGrace": 1},
    }
    path.write_text(yaml.safe_dump(data))
    return path


class Bridge:
    def __init__(self, tmp_path: Path, cfg: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [
            *BRIDGE,
            "serve",
            "--config",
            str(cfg),
            "--port",
            str(self.port),
            "--state-dir",
            str(tmp_path / "state"),
        ]
        with open(tmp_path / f"bridge-{self.port}.log", "w") as log:  # the child keeps its own copy
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, cwd=tmp_path)
        deadline = time.monotonic() + READY
        while True:  # a bounded wait for the port
            try:
                httpx.get(f"{self.url}/api/ping", timeout=2).raise_for_status()
                return
            except httpx.HTTPError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.1)

    def __enter__(self) -> Bridge:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def sse(self, method: str, params: dict[str, Any], timeout: float = 60) -> Iterator[dict[str, Any]]:
        """The messages of one request's SSE response, as they arrive."""
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        headers = {"Accept": "text/event-stream"}
        with httpx.stream("POST", f"{self.url}/acp/rpc", json=body, headers=headers, timeout=timeout) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    yield orjson.loads(line[6:])

    def call(self, method: str, params: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        return httpx.post(f"{self.url}/acp/rpc", json=body, timeout=timeout).json()

    def agents(self, mode: str) -> list[psutil.Process]:
        return [p for p in psutil.Process(self.proc.pid).children(recursive=True) if mode in " ".join(p.cmdline())]

    def stop(self) -> None:
        """A graceful stop (its agents are ended), then a kill if it does not go in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def turn(session: str, prompt: str, provider: str) -> dict[str, Any]:
    routing = {"routingMode": "explicit", "explicitExecutionTarget": "agent", "explicitProviderId": provider}
    return {"sessionId": session, "taskPrompt": prompt, "routing": routing}


def gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_killed_bridge_restarted_on_its_state_directory_loses_no_session(tmp_path):
    cfg = config(tmp_path)
    first = Bridge(tmp_path, cfg)
    try:

        def start_stuck() -> None:
            with contextlib.suppress(httpx.HTTPError):  # its bridge is killed under it
                first.call("session.start", turn("s2", "wait", "stuck"), 60)

        stuck = threading.Thread(target=start_stuck)
        stuck.daemon = True
        stuck.start()
        seen: list[dict[str, Any]] = []
        headers = {"Accept": "text/event-stream"}
        body = {"jsonrpc": "2.0", "id": 1, "method": "session.start", "params": turn("s1", "go", "fake")}
        with httpx.stream("POST", f"{first.url}/acp/rpc", json=body, headers=headers, timeout=30) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    seen.append(orjson.loads(line[6:])["params"])
                    if seen[-1].get("delta") == "2 ":
                        break
        deadline = time.monotonic() + 20
        while not (left := first.agents("silent")) and time.monotonic() < deadline:
            time.sleep(0.05)  # the stuck agent starts in the bridge's own time
        assert left, "the stuck agent never started"
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
    finally:
        first.stop()
    assert not gone(left[0])  # it ignores the end of its stdin: only the next bridge can end it

    second = Bridge(tmp_path, cfg)
    try:
        deadline = time.monotonic() + 20
        while not gone(left[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(left[0]), "the agent the killed bridge left behind still runs"
        got = second.call("session.get", {"sessionId": "s1"})["result"]
        assert got["state"] == "idle" and got["turns"][0]["status"] == "failed"
        result = second.call("session.result", {"sessionId": "s1", "turnId": seen[0]["turnId"]})["result"]
        assert result["error"]["code"] == "BRIDGE_RESTARTED" and result["output"].startswith("0 ")
        streamed = "".join(u["delta"] for u in seen if u["type"] == "delta")
        assert streamed.startswith(result["output"])  # all but the last uncommitted group, at most
        listed = [s["sessionId"] for s in second.call("session.list", {})["result"]["sessions"]]
        assert sorted(listed) == ["s1", "s2"]
        headers = {"Accept": "text/event-stream"}
        body = {"jsonrpc": "2.0", "id": 2, "method": "session.message", "params": turn("s1", "and now?", "echo")}
        text = httpx.post(f"{second.url}/acp/rpc", json=body, headers=headers, timeout=30).text
        messages = [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
        after = [m["params"] for m in messages[:-1]]
        continued = messages[-1]["result"]
        assert continued["status"] == "completed" and continued["contextRestored"] == "history"
        assert "User: go" in continued["output"] and "and now?" in continued["output"]  # the agent got the history
        assert min(u["seq"] for u in after) > max(u["seq"] for u in seen)  # no seq given twice
    finally:
        second.stop()
        for proc in left:
            if not gone(proc):
                os.kill(proc.pid, signal.SIGKILL)
