"""The benchmark runner: ``python -m bench.run [--quick] [--rounds N] [--cases 12345678] [--sweep]``.

Each round starts fresh servers (subprocesses on 127.0.0.1) and measures every case against the
bridge and against its baseline back to back, alternating which goes first (A B, then B A, …;
case 8 pairs its turns one by one and alternates within the round too).
The table and ``bench/results/latest.json`` hold the medians per server, the median of the
per-round ratios (bridge ÷ baseline) and differences (bridge − baseline, case 8's p50 figures)
and each target's verdict. The run stops by itself: rounds
that would not fit in ``--time-limit`` seconds are skipped (and listed as skipped), and a hard
limit cancels whatever is still running, stops the servers and writes what was measured.

Before the rounds, a bridge is asked for its ``acp.capabilities`` result (the baseline serves the
same bytes) and the relay padding is computed from the bridge's own envelope encoder.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench import cases, reported, servers
from bench.baselines import relay_envelope
from bench.cases import CHUNK_BYTES, Context, Plan
from bench.fast_agent import _chunk_line
from bench.report import summarize, table
from bench.serveropts import SERVER_OPTIONS, check_matches_bridge

RESULTS = Path(__file__).resolve().parent / "results"
FULL_LIMIT = 19 * 60  # seconds: `make bench` must finish within 20 minutes
QUICK_LIMIT = 4 * 60
HARD_SLACK = 45  # seconds past the limit before the run is cancelled mid-case


def relay_pad(size: int = CHUNK_BYTES) -> int:
    """Bytes to add to a baseline relay envelope so it is as large as the bridge's delta envelope."""
    from bridge.rpc.codec import encode_notification
    from orchestrator import updates

    session = "stream-ws-0"
    params = {
        "sessionId": session,
        "threadId": session,
        "turnId": f"turn-{time.time_ns()}",
        **updates.delta("x" * size),
        "seq": 12345,
    }
    bridge = len(encode_notification("session.update", params, 12345))
    baseline = len(relay_envelope(_chunk_line("fast-1", "x" * size).rstrip(b"\n"), 12345, b""))
    return max(0, bridge - baseline)


async def start_pair(ctx: Context, config: Path, order: list[str]) -> list[servers.Server]:
    """A fresh bridge and baseline, returned in ``order``."""
    bridge, baseline = await asyncio.gather(
        servers.start_bridge(ctx.workdir, config),
        servers.start_baseline(ctx.workdir, ctx.result_file, ctx.relay_pad),
    )
    await asyncio.sleep(servers.PROBE_SETTLE)
    by_kind = {"bridge": bridge, "baseline": baseline}
    return [by_kind[kind] for kind in order]


async def stop_all(pair: list[servers.Server]) -> None:
    await asyncio.gather(*(servers.stop(s) for s in pair))


async def prepare(ctx: Context, config: Path) -> None:
    bridge = await servers.start_bridge(ctx.workdir, config)
    try:
        ctx.result_file.write_bytes(orjson.dumps(await servers.call(bridge.port, "acp.capabilities")))
    finally:
        await servers.stop(bridge)


async def rounds(ctx: Context, deadline: float, skipped: list[str]) -> None:
    config = servers.bridge_config(ctx.workdir, "main")
    await prepare(ctx, config)
    round_seconds = 0.0
    for round_ in range(ctx.plan.rounds):
        if time.monotonic() + round_seconds + 120 > deadline:  # keep room for the reported cases
            skipped.append(f"rounds {round_ + 1}-{ctx.plan.rounds}: time limit")
            break
        started = time.monotonic()
        order = ["bridge", "baseline"] if round_ % 2 == 0 else ["baseline", "bridge"]
        print(f"round {round_ + 1}/{ctx.plan.rounds} ({' then '.join(order)})", flush=True)
        for numbers, run_cases in (("1234", cases.load_round), ("5", cases.idle_ws_round)):
            if not set(numbers) & set(ctx.plan.cases):
                continue
            pair = await start_pair(ctx, config, order)
            try:
                await run_cases(ctx, pair, round_)
            finally:
                await stop_all(pair)
        if "6" in ctx.plan.cases:
            await cases.cold_round(ctx, order, round_)
        if "8" in ctx.plan.cases:
            await cases.wait_round(ctx, config, order, round_)
        round_seconds = max(round_seconds, time.monotonic() - started)
    for name, case in (("5 idle sessions", reported.idle_sessions), ("7 knowledge", reported.knowledge)):
        if name[0] not in ctx.plan.cases:
            continue
        if time.monotonic() + 60 > deadline:
            skipped.append(f"{name}: time limit")
            continue
        print(f"{name}", flush=True)
        await case(ctx, 0)


SWEEP = (
    {"loop": "uvloop", "http": "httptools"},
    {"loop": "asyncio", "http": "httptools"},
    {"loop": "uvloop", "http": "h11"},
    {"loop": "asyncio", "http": "h11"},
    {"loop": "uvloop", "http": "httptools", "ws": "websockets"},
)
"""Server settings compared by ``--sweep`` (absolute figures, bridge and baseline alike)."""


async def sweep(ctx: Context, deadline: float, skipped: list[str]) -> None:
    """Cases 1 (10 connections, 8 in flight) and 2 (10 connections) under each of ``SWEEP``."""
    config = servers.bridge_config(ctx.workdir, "main")
    await prepare(ctx, config)
    p = ctx.plan
    for round_ in range(p.rounds):
        for settings in SWEEP:
            if time.monotonic() + 30 > deadline:
                skipped.append(f"sweep round {round_ + 1} {settings}: time limit")
                return
            label = " ".join(f"{k}={v}" for k, v in settings.items())
            pair = [
                await servers.start_bridge(ctx.workdir, config, settings=settings),
                await servers.start_baseline(ctx.workdir, ctx.result_file, ctx.relay_pad, settings=settings),
            ]
            try:
                for server in pair:
                    spec = {"conns": 10, "inflight": 8, "warmup": p.warmup, "duration": p.duration}
                    result = await servers.run_client("rr-ws", server, spec, timeout=p.client_timeout)
                    ctx.add(f"S ws c10 k8 {label}", server, round_, **cases.load_metrics(result))
                    spec = {"conns": 10, "warmup": p.warmup, "duration": p.duration}
                    result = await servers.run_client("rr-http", server, spec, timeout=p.client_timeout)
                    ctx.add(f"S http c10 {label}", server, round_, **cases.load_metrics(result))
            finally:
                await stop_all(pair)


def meta(args: argparse.Namespace, plan: Plan, seconds: float, skipped: list[str]) -> dict[str, Any]:
    import psutil

    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": seconds,
        "quick": args.quick,
        "plan": plan.__dict__,
        "server_options": SERVER_OPTIONS,
        "skipped": skipped,
        "bridge_root": servers.BRIDGE_ROOT or str(servers.ROOT),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_avg_at_end": os.getloadavg(),
            "memory_gib": psutil.virtual_memory().total / 2**30,
        },
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="xworkmate-bridge benchmark: bridge vs baseline, A/B rounds")
    parser.add_argument("--quick", action="store_true", help="one small round of every case (smoke run)")
    parser.add_argument("--rounds", type=int, help="rounds of the A/B cases (default 5; --quick: 1)")
    parser.add_argument("--time-limit", type=float, help="seconds (default 1140; --quick: 240)")
    parser.add_argument("--cases", help='case numbers to run, e.g. "134" (default: all, 1-8)')
    parser.add_argument("--sweep", action="store_true", help="compare uvicorn settings (loop, HTTP parser, ws) instead")
    parser.add_argument("--profile", metavar="CASE_PREFIX", help='py-spy the bridge in these cases, e.g. "1 ws c10"')
    parser.add_argument("--output", type=Path, default=RESULTS / "latest.json")
    return parser.parse_args(argv)


async def main_async(args: argparse.Namespace) -> int:
    drift = check_matches_bridge()
    if drift:
        print("bench/serveropts.py no longer matches bridge/server.py:\n  " + "\n  ".join(drift), file=sys.stderr)
        return 2
    plan = Plan.quick() if args.quick else Plan()
    if args.rounds:
        plan = Plan(**{**plan.__dict__, "rounds": args.rounds})
    if args.cases:
        plan = Plan(**{**plan.__dict__, "cases": args.cases})
    limit = args.time_limit or (QUICK_LIMIT if args.quick else FULL_LIMIT)
    workdir = Path(tempfile.mkdtemp(prefix="xwb-bench-"))
    ctx = Context(
        plan, workdir, workdir / "capabilities.json", relay_pad(), profile=args.profile, profile_dir=args.output.parent
    )
    started = time.monotonic()
    skipped: list[str] = []
    try:
        work = sweep if args.sweep else rounds
        await asyncio.wait_for(work(ctx, started + limit, skipped), limit + HARD_SLACK)
    except TimeoutError:
        skipped.append("the rest: hard time limit reached")
    summary = summarize(ctx.records)
    document = {
        "meta": meta(args, plan, time.monotonic() - started, skipped),
        "summary": summary,
        "profiles": ctx.profiles,
        "records": ctx.records,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    print(table(summary))
    for case, text in ctx.profiles.items():
        print(f"\nprofile of the bridge in {case!r}:\n{text}")
    print(f"\n{len(ctx.records)} measurements in {time.monotonic() - started:.0f} s; skipped: {skipped or 'none'}")
    print(f"results: {args.output}")
    shutil.rmtree(workdir, ignore_errors=True)
    failed = [t for c in summary.values() for t in c["targets"] if t["ok"] is False]
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    sys.exit(run(main_async(args)))


if __name__ == "__main__":
    main()
