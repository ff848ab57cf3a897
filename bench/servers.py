"""Server and client subprocesses for the runner: start a bridge or a baseline on a fresh port,
wait until it answers, sample its CPU and memory, stop it; run a load client and follow its marks.

Every wait is bounded; a server that does not stop on SIGTERM is killed with its children.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
BRIDGE_ROOT = os.environ.get("BENCH_BRIDGE_ROOT")
"""Another copy of the repository to benchmark (e.g. a scratch copy with a change): its
``bridge`` package is imported instead of the installed one."""
FAST_AGENT = str(ROOT / "bench" / "fast_agent.py")
FAST_AGENT_ARGV = [PYTHON, "-I", "-S", FAST_AGENT]  # the ``fast`` provider; case 8's direct client runs the same
READY_TIMEOUT = 30.0  # seconds for a server to answer its first request
STOP_TIMEOUT = 15.0  # seconds for a graceful stop before SIGKILL
POLL = 0.002  # seconds between two connection attempts while a server starts
PROBE_SETTLE = 1.0  # seconds for a started bridge to finish probing its providers (it spawns each once)


def bridge_argv(*args: str) -> list[str]:
    """The ``xworkmate-bridge`` command line (from ``BENCH_BRIDGE_ROOT`` when set)."""
    if BRIDGE_ROOT:
        return [PYTHON, "-m", "bridge.cli", *args]
    return [str(Path(PYTHON).with_name("xworkmate-bridge")), *args]


def bridge_env() -> dict[str, str] | None:
    return {**os.environ, "PYTHONPATH": f"{BRIDGE_ROOT}{os.pathsep}{ROOT}"} if BRIDGE_ROOT else None


def bridge_cwd() -> Path:
    """Where bridges run: ``python -m`` puts the working directory first on ``sys.path``."""
    return Path(BRIDGE_ROOT) if BRIDGE_ROOT else ROOT


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


RUNNING_TURNS = 256
"""``limits.maxRunningTurns`` for the benchmark: case 4 runs 100 turns at once, and the default
(32) would measure the queue in front of them rather than the bridge's relay."""


def _limits(extra: dict[str, Any]) -> dict[str, Any]:
    from compat.settings import Limits  # the runner's copy; BENCH_BRIDGE_ROOT copies derive from it

    limits = dict(extra.pop("limits", {}))
    fields = getattr(Limits, "__struct_fields__", None) or getattr(Limits, "model_fields", ())  # msgspec or pydantic
    if "max_running_turns" in fields:
        limits.setdefault("maxRunningTurns", RUNNING_TURNS)
    if "max_live_agents" in fields and _bridge_knows("max_live_agents"):  # case 4's 100 agents at once
        limits.setdefault("maxLiveAgents", RUNNING_TURNS)
    return limits


def _bridge_knows(field: str) -> bool:
    """Whether the bridge under test (``BENCH_BRIDGE_ROOT``, e.g. an older commit for an A/B run)
    has the limit ``field``: an older one refuses a key it does not know."""
    if not BRIDGE_ROOT:
        return True
    try:
        return field in (Path(BRIDGE_ROOT) / "compat" / "settings.py").read_text(encoding="utf-8")
    except OSError:
        return True


def _bridge_has(module: str, text: str) -> bool:
    """Whether the bridge under test's ``module`` mentions ``text`` (an older one refuses keys it
    does not know)."""
    if not BRIDGE_ROOT:
        return True
    try:
        return text in (Path(BRIDGE_ROOT) / module).read_text(encoding="utf-8")
    except OSError:
        return True


def bridge_config(workdir: Path, name: str, **extra: Any) -> Path:
    """Write a bridge config (JSON is YAML) with the ``fast`` provider and return its path."""
    config = {
        "host": "127.0.0.1",
        "workspaceRoots": [str(workdir)],
        "limits": _limits(extra),
        "providers": {"fast": {"command": FAST_AGENT_ARGV[0], "args": FAST_AGENT_ARGV[1:]}},
        **extra,
    }
    if _bridge_has("bridge/config.py", "state_dir"):  # a store of its own, new each run, as a new user's
        config.setdefault("stateDir", str(workdir / f"state-{name}"))
        if os.environ.get("BENCH_NO_STORE"):  # an A/B of the session store's cost
            config["persistSessions"] = False
    path = workdir / f"{name}.yaml"
    path.write_text(json.dumps(config, indent=1))
    return path


@dataclass
class Server:
    kind: str  # "bridge" or "baseline"
    port: int
    proc: asyncio.subprocess.Process
    started: float  # perf_counter at spawn
    ready_seconds: float = 0.0
    ps: psutil.Process = field(init=False)

    def __post_init__(self) -> None:
        self.ps = psutil.Process(self.proc.pid)

    def cpu(self) -> float:
        times = self.ps.cpu_times()
        return times.user + times.system

    def rss(self) -> int:
        return self.ps.memory_info().rss

    def children(self) -> int:
        with contextlib.suppress(psutil.Error):
            return len(self.ps.children(recursive=True))
        return 0


async def _spawn(kind: str, argv: list[str], port: int, log: Path) -> Server:
    started = time.perf_counter()
    env, cwd = (bridge_env(), bridge_cwd()) if kind == "bridge" else (None, ROOT)
    with open(log, "ab") as err:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=err, stderr=err, cwd=cwd, env=env
        )
    return Server(kind, port, proc, started)


async def start_bridge(workdir: Path, config: Path, *, settings: dict[str, str] | None = None) -> Server:
    """``xworkmate-bridge serve`` (or, with ``settings``, ``bench.variant`` under other uvicorn settings)."""
    port = free_port()
    argv = bridge_argv("serve", "--config", str(config), "--port", str(port))
    if settings:
        argv = [
            PYTHON,
            "-m",
            "bench.variant",
            "--config",
            str(config),
            "--port",
            str(port),
            *[f"--{k}={v}" for k, v in settings.items()],
        ]
    server = await _spawn("bridge", argv, port, workdir / "bridge.log")
    await wait_ready(server)
    return server


async def start_baseline(
    workdir: Path, result_file: Path, relay_pad: int, *, settings: dict[str, str] | None = None
) -> Server:
    port = free_port()
    argv = [
        PYTHON,
        "-m",
        "bench.baselines",
        "--port",
        str(port),
        "--result-file",
        str(result_file),
        "--relay-pad",
        str(relay_pad),
        *[f"--{k}={v}" for k, v in (settings or {}).items()],
    ]
    server = await _spawn("baseline", argv, port, workdir / "baseline.log")
    await wait_ready(server)
    return server


async def wait_ready(server: Server) -> None:
    """Poll ``GET /api/ping`` until it answers 200; sets ``ready_seconds`` (since the spawn)."""
    request = f"GET /api/ping HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nConnection: close\r\n\r\n".encode()
    deadline = time.perf_counter() + READY_TIMEOUT
    while time.perf_counter() < deadline:
        if server.proc.returncode is not None:
            raise RuntimeError(f"{server.kind} exited with {server.proc.returncode} while starting")
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        except OSError:
            await asyncio.sleep(POLL)  # the port is not bound yet: a readiness poll, bounded above
            continue
        writer.write(request)
        status = await reader.readline()
        writer.close()
        if b" 200 " in status:
            server.ready_seconds = time.perf_counter() - server.started
            return
    raise RuntimeError(f"{server.kind} did not answer within {READY_TIMEOUT} s")


async def stop(server: Server) -> None:
    """SIGTERM, then SIGKILL for the server and whatever it left running."""
    with contextlib.suppress(psutil.Error):
        children = server.ps.children(recursive=True)
    if server.proc.returncode is None:
        server.proc.terminate()
        try:
            await asyncio.wait_for(server.proc.wait(), STOP_TIMEOUT)
        except TimeoutError:
            server.proc.kill()
            await server.proc.wait()
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()


async def call(port: int, method: str, params: dict[str, Any] | None = None) -> Any:
    """One request over ``POST /acp/rpc``; returns the ``result``."""
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}})
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST /acp/rpc HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    data = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    return orjson.loads(data.split(b"\r\n\r\n", 1)[1])["result"]


OnMark = Callable[[str], Awaitable[None]]


async def run_client(
    mode: str, server: Server, spec: dict[str, Any], *, timeout: float, on_mark: OnMark | None = None
) -> dict[str, Any]:
    """Run ``bench.client MODE`` against ``server``; adds ``server_cpu`` (seconds between the
    client's start and end marks) and ``server_rss`` (bytes, at the end) to its result.

    A client that overruns ``timeout`` seconds is killed and reported as ``{"error": "timeout"}``.
    """
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "bench.client",
        mode,
        "--port",
        str(server.port),
        "--spec",
        json.dumps(spec),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stdin is not None
    cpu: dict[str, float] = {}
    result: dict[str, Any] = {"error": "no result"}

    async def follow() -> None:
        nonlocal result
        async for raw in proc.stdout:  # type: ignore[union-attr]
            line = raw.decode().strip()
            if line.startswith("MARK "):
                name = line[5:]
                cpu[name] = server.cpu()
                if on_mark is not None:
                    await on_mark(name)
                if name == "ready":
                    proc.stdin.close()  # type: ignore[union-attr]
            elif line.startswith("RESULT "):
                result = orjson.loads(line[7:])

    try:
        await asyncio.wait_for(follow(), timeout)
        await asyncio.wait_for(proc.wait(), 10)
    except TimeoutError:
        result = {"error": "timeout", **({"partial": result} if "error" not in result else {})}
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if "start" in cpu and "end" in cpu:
        result["server_cpu"] = cpu["end"] - cpu["start"]
    with contextlib.suppress(psutil.Error):
        result["server_rss"] = server.rss()
    return result
