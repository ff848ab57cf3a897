"""The cases measured on the bridge alone, against absolute targets: 1,000 idle sessions (case 5b)
and knowledge turns over ``local-wiki`` and llmwiki-serve sources (case 7)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench import servers
from bench.cases import Context, MiB
from bench.servers import Server, run_client
from bench.wikigen import QUESTION, generate

LLMWIKI_VERSION = "0.2.17"
REAP_TIMEOUT = 60.0  # seconds for the bridge to end its idle agent processes
WIKIS = 4


def llmwiki_bin() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = Path(os.environ.get("XWORKMATE_LLMWIKI_DIR") or cache / "xworkmate-bridge" / f"llmwiki-{LLMWIKI_VERSION}")
    return root / "bin" / "llmwiki-serve"


async def _reaped(server: Server) -> bool:
    deadline = time.monotonic() + REAP_TIMEOUT
    while server.children() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)  # the bridge's idle reaper runs on its own clock: poll, bounded
    return server.children() == 0


async def idle_sessions(ctx: Context, round_: int) -> None:
    """Case 5b: RSS per idle session (one finished turn, agent reaped), after 20 warm-up sessions."""
    count = ctx.plan.idle_sessions
    config = servers.bridge_config(
        ctx.workdir, "sessions", timeouts={"idleTimeout": 0.5}, limits={"maxSessions": count + 100}
    )
    server = await servers.start_bridge(ctx.workdir, config)
    try:
        spec = {"count": 20, "conns": 10, "prompt": "chunks=1", "params": {}, "provider": "fast", "prefix": "warm"}
        await run_client("turns", server, spec, timeout=ctx.plan.client_timeout)
        await _reaped(server)
        before = server.rss()
        spec = {**spec, "count": count, "conns": 20, "prefix": "idle"}
        result = await run_client("turns", server, spec, timeout=max(ctx.plan.client_timeout, count * 0.2))
        reaped = await _reaped(server)
        grown = server.rss() - before
    finally:
        await servers.stop(server)
    if "error" in result or result["statuses"].get("completed") != count or not reaped:
        ctx.add(
            "5 idle sessions", "bridge", round_, error=result.get("error") or f"{result['statuses']}, reaped={reaped}"
        )
        return
    ctx.add(
        "5 idle sessions",
        "bridge",
        round_,
        kib_per_session=grown / 1024 / count,
        turn_p50_ms=result["latency_ms"]["p50"],
        turns_per_s=result["rate"],
        rss_mib=before / MiB,
    )


def wikis(plan_pages: int) -> list[Path]:
    """The generated wikis, cached outside the work tree between invocations."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xworkmate-bridge" / "bench-wikis"
    return [generate(cache / f"p{plan_pages}" / f"wiki-{i}", i, plan_pages) for i in range(WIKIS)]


async def knowledge(ctx: Context, round_: int) -> None:
    """Case 7: evidence-only knowledge turns over 4 local-wiki sources, then delegated turns on
    the same sources with the fake model server as the runtime, then evidence-only turns over 4
    llmwiki-serve sources. The delegated row carries ``cpu_vs_evidence``: the bridge's CPU per
    delegated turn over its CPU per evidence-only turn, measured in the same run."""
    roots = await asyncio.to_thread(wikis, ctx.plan.wiki_pages)
    local = [
        {"id": f"wiki-{i}", "label": f"Wiki {i}", "protocol": "local-wiki", "root": str(r)} for i, r in enumerate(roots)
    ]
    evidence = await _knowledge_turns(ctx, round_, "7 knowledge local-wiki", local)
    from tests.fakes.fake_llm import FakeLLM  # the tests' fake model server, as the runtime

    with FakeLLM(reply="Approved by the finance lead [1](#citation-1).") as llm:
        runtime = {"baseUrl": llm.base_url + "/v1", "model": "mock-model"}
        delegated = await _knowledge_turns(
            ctx, round_, "7 knowledge delegated", local, mode="delegated-runtime", runtime=runtime, add=False
        )
    if delegated is not None:
        if evidence is not None and evidence["cpu_ms_per_turn"] > 0:
            delegated["cpu_vs_evidence"] = delegated["cpu_ms_per_turn"] / evidence["cpu_ms_per_turn"]
        ctx.add("7 knowledge delegated", "bridge", round_, **delegated)
    if not llmwiki_bin().exists():
        ctx.add("7 knowledge llmwiki", "bridge", round_, error="llmwiki-serve not installed (make llmwiki)")
        return
    async with _llmwiki_sources(ctx.workdir, roots) as urls:
        remote = [
            {"id": f"wiki-{i}", "label": f"Wiki {i}", "protocol": "llmwiki-http", "url": url}
            for i, url in enumerate(urls)
        ]
        await _knowledge_turns(ctx, round_, "7 knowledge llmwiki", remote)


async def _knowledge_turns(
    ctx: Context,
    round_: int,
    case: str,
    sources: list[dict[str, Any]],
    *,
    mode: str = "evidence-only",
    runtime: dict[str, Any] | None = None,
    add: bool = True,
) -> dict[str, Any] | None:
    """Run the case's turns; returns its metrics (and records them unless ``add`` is False), or
    None when it failed (the failure is recorded)."""
    extra: dict[str, Any] = {"knowledge": {"runtime": runtime}} if runtime else {}
    config = servers.bridge_config(
        ctx.workdir, "knowledge", knowledgeSources=sources, providers={"knowledge": {"type": "knowledge"}}, **extra
    )
    server = await servers.start_bridge(ctx.workdir, config)
    try:
        spec = {
            "count": ctx.plan.knowledge_turns,
            "conns": 1,
            "warmup": 3,
            "prompt": QUESTION,
            "provider": "knowledge",
            "params": {"orchestrationMode": mode},
            "prefix": "k",
        }
        async with ctx.profiled(case, server):
            result = await run_client("turns", server, spec, timeout=ctx.plan.client_timeout)
    finally:
        await servers.stop(server)
    if "error" in result or result["statuses"].get("completed") != ctx.plan.knowledge_turns:
        ctx.add(case, "bridge", round_, error=result.get("error") or str(result["statuses"]))
        return None
    metrics = {
        "p50_ms": result["latency_ms"]["p50"],
        "p99_ms": result["latency_ms"]["p99"],
        "added_p50_ms": result["added_ms"]["p50"],
        "cpu_ms_per_turn": result.get("server_cpu", 0) * 1000 / ctx.plan.knowledge_turns,
        "rss_mib": result.get("server_rss", 0) / MiB,
    }
    if add:
        ctx.add(case, "bridge", round_, **metrics)
    return metrics


@contextlib.asynccontextmanager
async def _llmwiki_sources(workdir: Path, roots: list[Path]) -> AsyncIterator[list[str]]:
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        for index, root in enumerate(roots):
            port = servers.free_port()
            state = workdir / f"llmwiki-{index}"
            state.mkdir(exist_ok=True)
            env = {**os.environ, "LLMWIKI_SERVE_STATE_DIR": str(state), "LLMWIKI_SERVE_IO_LOG": "off"}
            cmd = [
                str(llmwiki_bin()),
                "serve",
                str(root),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--io-log",
                "off",
            ]
            procs.append(
                subprocess.Popen(
                    cmd,
                    cwd=state,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            await _healthy(url)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


async def _healthy(url: str) -> None:
    host, port = url.rsplit("/", 1)[1].split(":")
    request = f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    deadline = time.monotonic() + servers.READY_TIMEOUT
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(request)
            status = await reader.readline()
            writer.close()
            if b" 200 " in status:
                return
        except OSError:
            pass
        await asyncio.sleep(0.05)  # a third-party server starting: poll, bounded
    raise RuntimeError(f"llmwiki-serve at {url} did not become healthy")
