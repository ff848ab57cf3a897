"""The soak (issue "Nothing lost"; opt-in, ``make soak``, not in CI): 200 sessions over 100
WebSocket connections against a bridge with the fast fake agent for ``--seconds`` (default 300),
with random disconnects in the middle of turns and resumes with ``session.subscribe``.

It checks, and prints: no JSON-RPC error and no failed turn; every session's updates received
exactly once, in order, with no gap (resumes included); no agent process or file descriptor
leaked (the bridge's children and open files after the run, and nothing left once it stopped);
memory flat after warm-up (RSS sampled every 10 s); the state database's size; and the worst
event-loop lag seen by a ``GET /api/ping`` probe every 0.5 s. Exit status 1 when a check fails.

Run: ``python -m bench.soak [--seconds N] [--sessions N] [--connections N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import websockets

from bench import servers

CHUNKS = "chunks=20 bytes=64 interval=5"  # a turn of 20 updates over about 0.1 s
DROP_CHANCE = 0.3  # of a turn's stream being cut in the middle


class Tally:
    def __init__(self) -> None:
        self.errors: list[str] = []
        self.turns = 0
        self.resumes = 0
        self.seqs: dict[str, list[int]] = {}


async def _read_until(
    ws: Any, request_id: int, session: str, tally: Tally, stop_after: int | None = None, kinds: list[str] | None = None
) -> bool:
    """Frames until the reply to ``request_id``; False when ``stop_after`` updates came first.
    The updates' types go to ``kinds``."""
    seen = 0
    while True:
        message = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if message.get("method") == "session.update":
            params = message["params"]
            tally.seqs.setdefault(params["sessionId"], []).append(params["seq"])
            if kinds is not None:
                kinds.append(params["type"])
            seen += 1
            if stop_after is not None and seen >= stop_after:
                return False
        elif message.get("id") == request_id:
            if "error" in message:
                tally.errors.append(f"{session}: {message['error']}")
            elif message["result"].get("status") not in (None, "completed"):
                tally.errors.append(f"{session}: turn {message['result'].get('status')}")
            return True


async def _worker(url: str, sessions: list[str], deadline: float, tally: Tally, rng: random.Random) -> None:
    started = set()
    request_id = 0
    while time.monotonic() < deadline:
        session = rng.choice(sessions)
        method = "session.message" if session in started else "session.start"
        started.add(session)
        request_id += 1
        routing = {"routingMode": "explicit", "explicitExecutionTarget": "agent", "explicitProviderId": "fast"}
        params = {"sessionId": session, "taskPrompt": CHUNKS, "routing": routing}
        async with websockets.connect(url, max_size=None) as ws:
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}))
            cut = rng.random() < DROP_CHANCE
            finished = await _read_until(ws, request_id, session, tally, rng.randint(1, 15) if cut else None)
        if finished:
            tally.turns += 1
            continue
        tally.resumes += 1  # the stream was cut: resume it on a new connection from the last seq seen
        async with websockets.connect(url, max_size=None) as ws:
            last = max(tally.seqs.get(session, [0]))
            request_id += 1
            resume = {"sessionId": session, "afterSeq": last}
            await ws.send(
                json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "session.subscribe", "params": resume})
            )
            replayed: list[str] = []
            await _read_until(ws, request_id, session, tally, kinds=replayed)
            while "done" not in replayed:  # then live, until the turn's done
                message = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if message.get("method") == "session.update":
                    params = message["params"]
                    tally.seqs.setdefault(session, []).append(params["seq"])
                    replayed.append(params["type"])
        tally.turns += 1


async def _probe(base: str, stop: asyncio.Event, lags: list[float]) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        while not stop.is_set():
            sent = time.perf_counter()
            await client.get(f"{base}/api/ping")
            lags.append(time.perf_counter() - sent)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)


async def soak(seconds: float, sessions: int, connections: int) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="xwb-soak-"))
    config = servers.bridge_config(workdir, "soak")
    server = await servers.start_bridge(workdir, config)
    base = f"http://127.0.0.1:{server.port}"
    tally, lags, rss = Tally(), [], []
    stop = asyncio.Event()
    probe = asyncio.create_task(_probe(base, stop, lags))
    names = [f"soak-{i}" for i in range(sessions)]
    deadline = time.monotonic() + seconds
    rng = random.Random(15)

    async def sample() -> None:
        while not stop.is_set():
            rss.append(server.rss() / 2**20)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 10)

    sampler = asyncio.create_task(sample())
    per = max(1, sessions // connections)
    workers = [
        _worker(
            f"ws://127.0.0.1:{server.port}/acp",
            names[i * per : (i + 1) * per],
            deadline,
            tally,
            random.Random(rng.random()),
        )
        for i in range(connections)
    ]
    try:
        await asyncio.gather(*workers)
    except Exception as exc:  # a hung or failed worker is a finding, reported below
        tally.errors.append(f"worker: {type(exc).__name__}: {exc}")
    stop.set()
    await probe
    await sampler
    fds_end = server.ps.num_fds()
    children_end = len(server.ps.children(recursive=True))
    db = workdir / "state-soak" / "sessions.db"
    db_bytes = sum(p.stat().st_size for p in db.parent.glob("sessions.db*")) if db.exists() else 0
    children = server.ps.children(recursive=True)
    await servers.stop(server)
    left = [p.pid for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    lost = {s: v for s, v in tally.seqs.items() if sorted(v) != list(range(1, max(v) + 1))}
    twice = {s for s, v in tally.seqs.items() if len(v) != len(set(v))}
    warm = rss[len(rss) // 3 :] or rss
    growth = (warm[-1] - warm[0]) if warm else 0.0
    print(
        f"soak: {seconds:.0f} s, {sessions} sessions, {connections} connections: {tally.turns} turns, "
        f"{tally.resumes} resumes, {sum(map(len, tally.seqs.values()))} updates"
    )
    print(f"  errors: {len(tally.errors)} {tally.errors[:3]}")
    print(f"  sessions with a gap: {len(lost)}; with an update twice: {len(twice)}")
    print(f"  RSS MiB: start {rss[0]:.1f}, after warm-up {warm[0]:.1f}, end {rss[-1]:.1f} (growth {growth:+.1f})")
    print(f"  open files at the end: {fds_end}; agent processes at the end: {children_end}; left after stop: {left}")
    print(f"  state database: {db_bytes / 2**20:.1f} MiB")
    print(
        f"  worst /api/ping round trip (event-loop lag): {max(lags) * 1000:.1f} ms, p50 {sorted(lags)[len(lags) // 2] * 1000:.2f} ms"
    )
    failed = tally.errors or lost or twice or left or growth > 64
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--connections", type=int, default=100)
    args = parser.parse_args(argv)
    sys.exit(asyncio.run(soak(args.seconds, args.sessions, args.connections)))


if __name__ == "__main__":
    main()
