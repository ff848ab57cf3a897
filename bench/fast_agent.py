#!/usr/bin/env python3
"""A fast fake ACP agent for the benchmarks: stdlib only, started with ``python -I -S`` so it
costs about 10 ms to spawn.

It answers ``initialize`` and ``session/new`` at once. ``session/prompt`` takes its workload from
the prompt text, ``key=value`` words:

    chunks=N     agent_message_chunk updates to write (default 1)
    bytes=S      text bytes per chunk (default 64)
    interval=MS  milliseconds between chunks; 0 (default) writes as fast as it can
    stamp=1      start each chunk's text with ``@@TS<time.monotonic_ns()>@@`` taken just before
                 the write (the clock is system-wide, so a client on the same host can subtract)

then answers the prompt with ``end_turn``. Unpaced, unstamped chunks are pre-encoded and written
``BATCH`` lines per ``write`` call: the agent must never be the bottleneck of a relay benchmark.
"""

from __future__ import annotations

import json
import sys
import time

BATCH = 256  # lines per write when unpaced
STAMP = "@@TS{}@@"


def _line(message: dict) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def _chunk_line(session_id: str, text: str) -> bytes:
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
    return _line({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session_id, "update": update}})


def _workload(params: dict) -> dict[str, int]:
    words = " ".join(b.get("text", "") for b in params.get("prompt", []) if b.get("type") == "text").split()
    spec = {"chunks": 1, "bytes": 64, "interval": 0, "stamp": 0}
    for word in words:
        key, _, value = word.partition("=")
        if key in spec and value.isdigit():
            spec[key] = int(value)
    return spec


def _stream(out, session_id: str, spec: dict[str, int]) -> None:
    count, size, interval = spec["chunks"], spec["bytes"], spec["interval"] / 1000
    if not spec["stamp"] and not interval:
        line = _chunk_line(session_id, "x" * size)
        for start in range(0, count, BATCH):
            out.write(line * min(BATCH, count - start))
            out.flush()
        return
    head, _, tail = _chunk_line(session_id, "\0").partition(b"\\u0000")
    pad = "x" * max(0, size - len(STAMP.format(time.monotonic_ns())))
    next_at = time.monotonic()
    for _ in range(count):
        if interval:
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        stamp = STAMP.format(time.monotonic_ns()) if spec["stamp"] else ""
        out.write(head + (stamp + pad).encode() + tail)
        out.flush()


def main() -> None:
    out = sys.stdout.buffer
    sessions = 0
    for raw in sys.stdin.buffer:
        if not raw.strip():
            continue
        msg = json.loads(raw)
        method, msg_id, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method == "initialize":
            result = {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": False},
                "agentInfo": {"name": "bench-fast-agent", "version": "1"},
                "authMethods": [],
            }
        elif method == "session/new":
            sessions += 1
            result = {"sessionId": f"fast-{sessions}"}
        elif method == "session/prompt":
            _stream(out, params.get("sessionId", ""), _workload(params))
            result = {"stopReason": "end_turn"}
        elif method == "session/cancel" or msg_id is None:
            continue
        else:
            out.write(_line({"jsonrpc": "2.0", "id": msg_id, "error": {"code": -32601, "message": "Method not found"}}))
            out.flush()
            continue
        out.write(_line({"jsonrpc": "2.0", "id": msg_id, "result": result}))
        out.flush()


if __name__ == "__main__":
    try:
        main()
    except (BrokenPipeError, KeyboardInterrupt):
        pass
