"""The benchmark cases. Each ``*_round`` function runs one round of its cases against a bridge and a
baseline (in the round's order) and returns records: ``{case, server, round, metric: value}``.

Case numbers follow the issue: 1 WebSocket request/response, 2 HTTP keep-alive, 3 streaming turn
(WS and SSE), 4 paced concurrent sessions, 5 memory, 6 cold start, 7 knowledge turns, 8 what a
user waits for (a turn's first delta and result, cold and warm, against a direct ACP client).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import servers
from bench.profile import recording, top
from bench.servers import Server, run_client

MiB = 1024 * 1024
CHUNK_BYTES = 64  # text bytes per agent_message_chunk
WAIT_PROMPT = f"chunks=3 bytes={CHUNK_BYTES}"  # case 8: a short answer of a few deltas


@dataclass(frozen=True)
class Plan:
    """How big each case is; ``quick()`` is the smoke-run size."""

    rounds: int = 5
    warmup: float = 0.5  # seconds of load before a measurement window
    duration: float = 2.0  # seconds of measurement window
    ws_grid: tuple[tuple[int, int], ...] = ((1, 1), (1, 8), (10, 1), (10, 8), (100, 1), (100, 8))
    http_conns: tuple[int, ...] = (10, 100)
    stream_chunks: int = 20000
    paced_sessions: int = 100
    paced_chunks: int = 200
    paced_interval_ms: int = 20
    idle_conns: int = 1000
    idle_sessions: int = 1000
    wiki_pages: int = 2000
    knowledge_turns: int = 30
    wait_cold: int = 30  # case 8: measured pairs of turns on new sessions, per round
    wait_warm: int = 100  # and of follow-up turns on one session
    wait_warmup: int = 3  # unmeasured pairs before each
    client_timeout: float = 120.0
    cases: str = "12345678"  # the case numbers to run (``--cases``)

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            rounds=1,
            warmup=0.3,
            duration=0.7,
            ws_grid=((10, 8),),
            http_conns=(10,),
            stream_chunks=3000,
            paced_sessions=10,
            paced_chunks=50,
            idle_conns=100,
            idle_sessions=50,
            wiki_pages=100,
            knowledge_turns=5,
            wait_cold=8,
            wait_warm=20,
            wait_warmup=2,
            client_timeout=60.0,
        )


@dataclass
class Context:
    plan: Plan
    workdir: Path
    result_file: Path  # the bridge's acp.capabilities result, served by the baseline
    relay_pad: int  # bytes that make a relayed envelope as large as the bridge's
    profile: str | None = None  # profile the bridge in the cases whose name starts with this
    profile_dir: Path = Path(".")  # where the collapsed stacks go
    records: list[dict[str, Any]] = field(default_factory=list)
    profiles: dict[str, str] = field(default_factory=dict)  # case -> top functions

    @contextlib.asynccontextmanager
    async def profiled(self, case: str, server: Server) -> AsyncIterator[None]:
        """Record a py-spy profile of the bridge the first time ``case`` runs (``--profile``)."""
        if (
            self.profile is None
            or server.kind != "bridge"
            or not case.startswith(self.profile)
            or case in self.profiles
        ):
            yield
            return
        out = self.profile_dir / f"profile-{re.sub(r'[^a-z0-9]+', '-', case)}.txt"
        async with recording(server.proc.pid, out):
            yield
        self.profiles[case] = top(out) if out.exists() else "no samples"

    def add(self, case: str, server: Server | str, round_: int, **metrics: Any) -> None:
        kind = server if isinstance(server, str) else server.kind
        self.records.append({"case": case, "server": kind, "round": round_, **metrics})


def load_metrics(result: dict[str, Any]) -> dict[str, Any]:
    if "error" in result:
        return {"error": result["error"]}
    count, seconds = result["count"], result["seconds"]
    return {
        "rate": result["rate"],
        "p50_ms": result["latency_ms"]["p50"],
        "p99_ms": result["latency_ms"]["p99"],
        "server_cpu_us": 1e6 * result.get("server_cpu", 0.0) / max(1, count),
        "server_cpu_pct": 100 * result.get("server_cpu", 0.0) / seconds if seconds else None,
        "client_cpu_pct": 100 * result["client_cpu"] / seconds if seconds else None,
        "rss_mib": result.get("server_rss", 0) / MiB,
    }


async def load_round(ctx: Context, pair: list[Server], round_: int) -> None:
    """Cases 1-4 on one fresh pair, each measurement A then B (``pair`` is already in the round's order)."""
    p = ctx.plan
    for conns, inflight in p.ws_grid if "1" in p.cases else ():
        spec = {"conns": conns, "inflight": inflight, "warmup": p.warmup, "duration": p.duration}
        for server in pair:
            case = f"1 ws c{conns} k{inflight}"
            async with ctx.profiled(case, server):
                result = await run_client("rr-ws", server, spec, timeout=p.client_timeout)
            ctx.add(case, server, round_, **load_metrics(result))
    for conns in p.http_conns if "2" in p.cases else ():
        spec = {"conns": conns, "warmup": p.warmup, "duration": p.duration}
        for server in pair:
            case = f"2 http c{conns}"
            async with ctx.profiled(case, server):
                result = await run_client("rr-http", server, spec, timeout=p.client_timeout)
            ctx.add(case, server, round_, **load_metrics(result))
    for mode in ("stream-ws", "stream-sse") if "3" in p.cases else ():
        spec = {"chunks": p.stream_chunks, "size": CHUNK_BYTES, "session": f"{mode}-{round_}"}
        for server in pair:
            async with ctx.profiled(f"3 {mode}", server):
                result = await run_client(mode, server, spec, timeout=p.client_timeout)
            ctx.add(f"3 {mode}", server, round_, **_stream_metrics(result))
    spec = {
        "sessions": p.paced_sessions,
        "chunks": p.paced_chunks,
        "interval": p.paced_interval_ms,
        "size": CHUNK_BYTES,
    }
    for server in pair if "4" in p.cases else ():
        async with ctx.profiled("4 paced", server):
            result = await run_client("paced", server, spec, timeout=p.client_timeout)
        ctx.add("4 paced", server, round_, **_paced_metrics(result, p.paced_sessions * p.paced_chunks))


def _stream_metrics(result: dict[str, Any]) -> dict[str, Any]:
    if "error" in result:
        return {"error": result["error"]}
    metrics = {
        "rate": 0.0 if result.get("dropped") else result["rate"],
        "frames": result["count"],
        "seconds": result["seconds"],
        "dropped": bool(result.get("dropped")),
        "server_cpu_us": 1e6 * result.get("server_cpu", 0.0) / max(1, result["count"]),
        "client_cpu_pct": 100 * result["client_cpu"] / max(1e-9, result["seconds"]),
        "rss_mib": result.get("server_rss", 0) / MiB,
    }
    return metrics


def _paced_metrics(result: dict[str, Any], expected: int) -> dict[str, Any]:
    if "error" in result:
        return {"error": result["error"]}
    return {
        "completed": result["completed"],
        "sessions": result["sessions"],
        "chunks": result["count"],
        "all_complete": result["completed"] == result["sessions"] and result["count"] == expected,
        "p50_ms": result["latency_ms"]["p50"],
        "p99_ms": result["latency_ms"]["p99"],
        "steady_p50_ms": result["steady_ms"]["p50"],
        "steady_p99_ms": result["steady_ms"]["p99"],
        "spawn_p50_ms": result["spawn_ms"]["p50"],
        "spawn_p99_ms": result["spawn_ms"]["p99"],
        "probe_idle_p50_ms": result["probe_idle_ms"]["p50"],
        "probe_load_p50_ms": result["probe_load_ms"]["p50"],
        "probe_load_p99_ms": result["probe_load_ms"]["p99"],
        "server_cpu_pct": 100 * result.get("server_cpu", 0.0) / max(1e-9, result["seconds"]),
        "rss_mib": result.get("server_rss", 0) / MiB,
    }


async def idle_ws_round(ctx: Context, pair: list[Server], round_: int) -> None:
    """Case 5a: RSS growth per idle WebSocket connection, on a fresh pair."""
    for server in pair:
        before = server.rss()
        grown: dict[str, float] = {}

        async def on_mark(
            name: str, server: Server = server, grown: dict[str, float] = grown, before: int = before
        ) -> None:
            if name == "ready":
                await asyncio.sleep(0.5)  # let the server finish setting up the last connections
                grown["rss"] = server.rss() - before

        result = await run_client(
            "idle-ws", server, {"conns": ctx.plan.idle_conns}, timeout=ctx.plan.client_timeout, on_mark=on_mark
        )
        if "rss" not in grown or result.get("count") != ctx.plan.idle_conns:
            ctx.add("5 idle ws", server, round_, error=result.get("error", "not all connections opened"))
            continue
        ctx.add(
            "5 idle ws", server, round_, kib_per_conn=grown["rss"] / 1024 / ctx.plan.idle_conns, rss_mib=before / MiB
        )


async def cold_round(ctx: Context, order: list[str], round_: int) -> None:
    """Case 6: spawn to first answer, for ``serve``, the baseline and ``acp-stdio``."""
    config = servers.bridge_config(ctx.workdir, "cold")
    for kind in order:
        if kind == "bridge":
            server = await servers.start_bridge(ctx.workdir, config)
        else:
            server = await servers.start_baseline(ctx.workdir, ctx.result_file, ctx.relay_pad)
        ctx.add("6 cold start", server, round_, seconds=server.ready_seconds, rss_mib=server.rss() / MiB)
        await servers.stop(server)
    ctx.add("6 cold acp-stdio", "bridge", round_, seconds=await _stdio_first_answer(config))


async def _stdio_first_answer(config: Path) -> float:
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *servers.bridge_argv("acp-stdio", "--config", str(config)),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        cwd=servers.bridge_cwd(),
        env=servers.bridge_env(),
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"acp.capabilities","params":{}}\n')
    try:
        await asyncio.wait_for(proc.stdout.readline(), servers.READY_TIMEOUT)
        return time.perf_counter() - started
    finally:
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), servers.STOP_TIMEOUT)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def wait_round(ctx: Context, config: Path, order: list[str], round_: int) -> None:
    """Case 8: ``session.start`` to the first delta and to the result through a fresh bridge, cold
    and warm, each turn paired with one of a direct ACP client on the same agent (the baseline;
    it needs no server). The client alternates the pairs' order, starting from the round's."""
    p = ctx.plan
    server = await servers.start_bridge(ctx.workdir, config)
    try:
        await asyncio.sleep(servers.PROBE_SETTLE)
        spec = {
            "cold": p.wait_cold,
            "warm": p.wait_warm,
            "warmup": p.wait_warmup,
            "prompt": WAIT_PROMPT,
            "agent": servers.FAST_AGENT_ARGV,
            "cwd": str(ctx.workdir),  # the bridge's first workspace root, where its agents run
            "first": "bridge" if order[0] == "bridge" else "direct",
        }
        async with ctx.profiled("8 wait", server):
            result = await run_client("wait", server, spec, timeout=p.client_timeout)
    finally:
        await servers.stop(server)
    for variant, expected in (("cold", p.wait_cold), ("warm", p.wait_warm)):
        for side, kind in (("bridge", "bridge"), ("direct", "baseline")):
            ctx.add(f"8 wait {variant}", kind, round_, **_wait_metrics(result, variant, side, expected))


def _wait_metrics(result: dict[str, Any], variant: str, side: str, expected: int) -> dict[str, Any]:
    if "error" in result:
        return {"error": result["error"]}
    mine = result[variant][side]
    if mine["statuses"] != {"completed": expected}:
        return {"error": f"{side} turns: {mine['statuses']}"}
    return {
        "first_p50_ms": mine["first_ms"]["p50"],
        "first_p99_ms": mine["first_ms"]["p99"],
        "result_p50_ms": mine["result_ms"]["p50"],
        "result_p99_ms": mine["result_ms"]["p99"],
    }
