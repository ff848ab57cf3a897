"""Load-client processes: ``python -m bench.client MODE --port N --spec JSON``.

A client talks to the runner on stdout: ``MARK start`` / ``MARK end`` bracket the measurement
window (the runner samples the server's CPU there), ``MARK ready`` means "hold until stdin
closes", and the last line is ``RESULT {json}``. Modes:

    rr-ws      acp.capabilities over WebSocket: ``conns`` connections, ``inflight`` each
    rr-http    acp.capabilities over POST /acp/rpc, keep-alive, one in flight per connection
    stream-ws  a warm-up turn, then one turn of ``chunks`` chunks; counts frames
    stream-sse the same over POST /acp/rpc with ``Accept: text/event-stream``
    paced      ``sessions`` turns at once, one connection each, stamped chunks: write→receive delay,
               overall and ``steady`` (once every session streams, no start left in the window)
    idle-ws    opens ``conns`` connections and holds them
    turns      ``count`` session.start requests with ``params`` over ``conns`` connections; parses
               each reply (one per turn) for its status and the sources' ``latencyMs``
    wait       case 8: turns through the bridge paired with turns of a direct ACP client
               (``bench.direct_acp``) on the same agent, cold then warm; first delta and result

The clients parse no notification: they count frames, look for the reply by its prefix, and in
``paced`` find the stamp by a byte search.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson

from bench.direct_acp import DirectAgent, Exchange, stop_reason
from bench.wire import HttpClient, WsClient, http_request, upgrade_request, ws_frame

HOST = "127.0.0.1"
REPLY_PREFIX = b'{"jsonrpc":"2.0","id"'
STAMP = b"@@TS"
DONE_EVENT = b'"event":"completed"'
CAPABILITIES = b'{"jsonrpc":"2.0","id":1,"method":"acp.capabilities","params":{}}'
BRIDGE_DELTA = b'"type":"delta"'  # in the params of the bridge's session.update deltas
PROBE_PERIOD = 0.02  # seconds between two latency probes in ``paced``


def mark(name: str) -> None:
    sys.stdout.write(f"MARK {name}\n")
    sys.stdout.flush()


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    """p50/p99/max of ``values`` (seconds) in milliseconds."""
    if not values:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": pick(0.5) * scale, "p99": pick(0.99) * scale, "max": ordered[-1] * scale}


def turn_params(session_id: str, prompt: str, provider: str = "fast", **extra: Any) -> dict[str, Any]:
    """``session.start`` / ``session.message`` params routed explicitly to ``provider``."""
    routing = {"routingMode": "explicit", "explicitExecutionTarget": "agent", "explicitProviderId": provider}
    return {"sessionId": session_id, "taskPrompt": prompt, "routing": routing, **extra}


def turn_request(
    request_id: int, method: str, session_id: str, prompt: str, provider: str = "fast", **extra: Any
) -> bytes:
    params = turn_params(session_id, prompt, provider, **extra)
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})


async def ws_connect(port: int, on_frame: Any) -> WsClient:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(lambda: WsClient(upgrade_request(HOST, port, "/acp"), on_frame), HOST, port)
    await conn.opened
    return conn


async def connect_all(port: int, count: int, on_frame: Any, batch: int = 100) -> list[WsClient]:
    conns: list[WsClient] = []
    for start in range(0, count, batch):
        conns += await asyncio.gather(*(ws_connect(port, on_frame) for _ in range(min(batch, count - start))))
    return conns


class Window:
    """The measurement window: counts, latencies and the client's own CPU time inside it."""

    def __init__(self) -> None:
        self.open = False
        self.count = 0
        self.latencies: list[float] = []
        self._t0 = self._cpu0 = 0.0
        self.seconds = self.cpu = 0.0

    def start(self) -> None:
        mark("start")
        self.open, self._t0, self._cpu0 = True, time.perf_counter(), time.process_time()

    def stop(self) -> None:
        self.open = False
        self.seconds, self.cpu = time.perf_counter() - self._t0, time.process_time() - self._cpu0
        mark("end")

    def result(self, **extra: Any) -> dict[str, Any]:
        rate = self.count / self.seconds if self.seconds else 0.0
        return {
            "count": self.count,
            "seconds": self.seconds,
            "rate": rate,
            "client_cpu": self.cpu,
            "latency_ms": percentiles(self.latencies),
            **extra,
        }


def _send_next(window: Window, payload: bytes) -> Callable[[Any, bytearray, int, int], None]:
    """The reply handler of a request/response load: record the latency, send the next request."""

    def on_reply(conn: Any, buf: bytearray, start: int, end: int) -> None:
        now = time.perf_counter()
        sent = conn.sent.popleft()  # replies may overtake each other; FIFO is close enough
        if window.open:
            window.count += 1
            window.latencies.append(now - sent)
        conn.sent.append(now)
        conn.send(payload)

    return on_reply


async def _measure(window: Window, clients: list[Any], warmup: float, duration: float) -> dict[str, Any]:
    """Let the load run ``warmup`` seconds, measure ``duration`` seconds, then hang up."""
    await asyncio.sleep(warmup)
    window.start()
    await asyncio.sleep(duration)
    window.stop()
    for conn in clients:
        conn.transport.close()
    return window.result()


async def rr_ws(port: int, conns: int, inflight: int, warmup: float, duration: float) -> dict[str, Any]:
    window, frame = Window(), ws_frame(CAPABILITIES)
    clients = await connect_all(port, conns, _send_next(window, frame))
    for conn in clients:
        now = time.perf_counter()
        conn.sent.extend([now] * inflight)
        conn.send(frame * inflight)
    return await _measure(window, clients, warmup, duration)


async def rr_http(port: int, conns: int, warmup: float, duration: float) -> dict[str, Any]:
    window, request = Window(), http_request(HOST, port, "/acp/rpc", CAPABILITIES)
    loop, on_response = asyncio.get_running_loop(), _send_next(window, request)
    clients = [(await loop.create_connection(lambda: HttpClient(on_response), HOST, port))[1] for _ in range(conns)]
    for conn in clients:
        conn.sent.append(time.perf_counter())
        conn.send(request)
    return await _measure(window, clients, warmup, duration)


async def stream_ws(port: int, chunks: int, size: int, session: str = "stream-ws") -> dict[str, Any]:
    window = Window()
    done: asyncio.Future[None] | None = None
    received = [0]

    def on_frame(conn: WsClient, buf: bytearray, start: int, end: int) -> None:
        received[0] += end - start
        if window.open:
            window.count += 1
        if buf.startswith(REPLY_PREFIX, start) and done is not None and not done.done():
            done.set_result(None)

    conn = await ws_connect(port, on_frame)
    for request_id, method, count in ((1, "session.start", 1), (2, "session.message", chunks)):
        done = asyncio.get_running_loop().create_future()
        prompt = f"chunks={count} bytes={size}"
        if request_id == 2:
            received[0] = 0
            window.start()
        conn.send(ws_frame(turn_request(request_id, method, session, prompt)))
        await asyncio.wait([done, conn.closed], return_when=asyncio.FIRST_COMPLETED)
        if not done.done():
            break
    window.stop()
    conn.transport.close()  # type: ignore[union-attr]
    return window.result(bytes_per_frame=received[0] / max(1, window.count), dropped=not done.done())


async def _sse_turn(port: int, body: bytes) -> tuple[int, bool]:
    """Send one turn with ``Accept: text/event-stream``; returns (envelopes, ended with [DONE])."""
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(http_request(HOST, port, "/acp/rpc", body, accept="text/event-stream"))
    tail, events, finished = b"", 0, False
    while not finished:
        data = await reader.read(262144)
        if not data:
            break
        joined = tail + data
        events += joined.count(b"data: ") - tail.count(b"data: ")
        finished = b"data: [DONE]" in joined
        tail = joined[-16:]
    writer.close()
    return events - finished, finished  # [DONE] is not an envelope


async def stream_sse(port: int, chunks: int, size: int, session: str = "stream-sse") -> dict[str, Any]:
    window = Window()
    await _sse_turn(port, turn_request(1, "session.start", session, f"chunks=1 bytes={size}"))
    window.start()
    window.count, finished = await _sse_turn(
        port, turn_request(2, "session.message", session, f"chunks={chunks} bytes={size}")
    )
    window.stop()
    return window.result(dropped=not finished)


async def _probe(port: int, rtts: list[float], stop: asyncio.Event) -> None:
    """GET /api/ping every ``PROBE_PERIOD`` seconds on one keep-alive connection: the server's
    event-loop lag as a client sees it."""
    reader, writer = await asyncio.open_connection(HOST, port)
    request = f"GET /api/ping HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode()
    while not stop.is_set():
        sent = time.perf_counter()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        rtts.append(time.perf_counter() - sent)
        await asyncio.sleep(PROBE_PERIOD)
    writer.close()


async def paced(port: int, sessions: int, chunks: int, interval: int, size: int) -> dict[str, Any]:
    window, loop = Window(), asyncio.get_running_loop()
    delays: list[float] = []
    steady: list[float] = []  # delays once every session has streamed its first chunk
    spawn: list[float] = []
    completed = [0]
    started_at: dict[WsClient, float] = {}
    finished: dict[WsClient, asyncio.Future[None]] = {}

    def on_frame(conn: WsClient, buf: bytearray, start: int, end: int) -> None:
        now = time.monotonic_ns()
        if buf.startswith(REPLY_PREFIX, start):  # the reply repeats every stamp in its output
            completed[0] += buf.find(b'"status":"completed"', start, end) >= 0
            finished[conn].set_result(None)
            return
        at = buf.find(STAMP, start, end)
        if at >= 0 and buf.find(DONE_EVENT, start, end) < 0:  # so does the bridge's "done" update
            stamp_end = buf.find(b"@@", at + 4, end)
            delay = (now - int(buf[at + 4 : stamp_end])) / 1e9
            delays.append(delay)
            if not started_at:
                steady.append(delay)
            if conn in started_at:
                spawn.append(time.perf_counter() - started_at.pop(conn))

    idle_rtts: list[float] = []
    stop_probe = asyncio.Event()
    probe = asyncio.create_task(_probe(port, idle_rtts, stop_probe))
    await asyncio.sleep(0.5)
    stop_probe.set()
    await probe
    conns = await connect_all(port, sessions, on_frame)
    load_rtts: list[float] = []
    stop_probe = asyncio.Event()
    probe = asyncio.create_task(_probe(port, load_rtts, stop_probe))
    window.start()
    prompt = f"chunks={chunks} bytes={size} interval={interval} stamp=1"
    for index, conn in enumerate(conns):
        finished[conn] = loop.create_future()
        started_at[conn] = time.perf_counter()
        conn.send(ws_frame(turn_request(1, "session.start", f"paced-{index}", prompt)))
    await asyncio.gather(*(asyncio.wait([finished[c], c.closed], return_when=asyncio.FIRST_COMPLETED) for c in conns))
    window.stop()
    stop_probe.set()
    await probe
    for conn in conns:
        conn.transport.close()  # type: ignore[union-attr]
    window.count, window.latencies = len(delays), delays
    return window.result(
        sessions=sessions,
        completed=completed[0],
        spawn_ms=percentiles(spawn),
        steady_ms=percentiles(steady),
        probe_idle_ms=percentiles(idle_rtts),
        probe_load_ms=percentiles(load_rtts),
    )


async def idle_ws(port: int, conns: int) -> dict[str, Any]:
    clients = await connect_all(port, conns, lambda *args: None)
    mark("ready")
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for conn in clients:
        conn.transport.close()  # type: ignore[union-attr]
    return {"count": len(clients)}


async def turns(
    port: int,
    count: int,
    conns: int,
    prompt: str,
    params: dict[str, Any],
    provider: str,
    prefix: str = "turn",
    warmup: int = 0,
) -> dict[str, Any]:
    """``count`` turns after ``warmup`` unmeasured ones, ``conns`` at a time, each a new session."""
    window, loop = Window(), asyncio.get_running_loop()
    waiting: dict[WsClient, asyncio.Future[bytes]] = {}

    def on_frame(conn: WsClient, buf: bytearray, start: int, end: int) -> None:
        if buf.startswith(REPLY_PREFIX, start):
            waiting.pop(conn).set_result(bytes(buf[start:end]))

    statuses: dict[str, int] = {}
    added: list[float] = []
    clients = await connect_all(port, conns, on_frame)
    queue = list(range(warmup + count))

    async def worker(conn: WsClient) -> None:
        while queue:
            index = queue.pop(0)
            if index == warmup:
                window.start()
            waiting[conn] = loop.create_future()
            sent = time.perf_counter()
            conn.send(ws_frame(turn_request(index, "session.start", f"{prefix}-{index}", prompt, provider, **params)))
            raw = await waiting[conn]
            seconds = time.perf_counter() - sent  # before parsing: a knowledge reply is ~400 KB of JSON
            reply = orjson.loads(raw)
            result = reply.get("result") or {}
            status = result.get("status", "error")
            if index < warmup:
                continue
            statuses[status] = statuses.get(status, 0) + 1
            window.count += 1
            window.latencies.append(seconds)
            steps = [s for a in result.get("artifacts", []) for s in a.get("steps", [])]
            sources = [s.get("latencyMs", 0) for s in steps if s.get("sourceId")]
            model = sum(s.get("latencyMs", 0) for s in steps if s.get("id") == "runtime-chat-completions")
            if sources:  # the bridge's own time: the turn, less its sources' and its model call's
                added.append(seconds - (max(sources) + model) / 1000)

    await asyncio.gather(*(worker(conn) for conn in clients))
    window.stop()
    for conn in clients:
        conn.transport.close()  # type: ignore[union-attr]
    return window.result(statuses=statuses, added_ms=percentiles(added))


class BridgeConnection:
    """One WebSocket connection to the bridge running one request at a time, ids counting up."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._exchange: Exchange | None = None
        self._conn: WsClient | None = None

    async def connect(self, port: int) -> None:
        self._conn = await ws_connect(port, self._on_frame)

    def _on_frame(self, conn: WsClient, buf: bytearray, start: int, end: int) -> None:
        if self._exchange is not None:
            self._exchange.received(buf, start, end)

    async def request(self, method: str, params: dict[str, Any]) -> Exchange:
        """Send one request and wait for its response (timed from just before the send)."""
        assert self._conn is not None
        frame = ws_frame(orjson.dumps({"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params}))
        exchange = Exchange(time.perf_counter(), BRIDGE_DELTA)
        self._exchange = exchange
        self._conn.send(frame)
        await asyncio.wait([exchange.reply, self._conn.closed], return_when=asyncio.FIRST_COMPLETED)
        self._exchange = None
        if not exchange.reply.done():
            raise ConnectionError(f"the bridge closed the connection during {method}")
        return exchange

    async def turn(self, method: str, session_id: str, prompt: str) -> Exchange:
        """One turn on the ``fast`` provider; the exchange's ``first`` is its first delta."""
        return await self.request(method, turn_params(session_id, prompt))

    def close(self) -> None:
        if self._conn is not None and self._conn.transport is not None:
            self._conn.transport.close()


def _status(exchange: Exchange) -> str:
    """A bridge turn's ``status`` from its reply."""
    reply = orjson.loads(exchange.reply.result())
    return (reply.get("result") or {}).get("status", "error")


class Samples:
    """One side's turns of one variant: first-delta and result latencies, statuses."""

    def __init__(self) -> None:
        self.first: list[float] = []
        self.result: list[float] = []
        self.statuses: dict[str, int] = {}

    def add(self, exchange: Exchange, status: str) -> None:
        """Count the turn's status; a completed turn that streamed no delta counts as ``no delta``."""
        if status == "completed" and exchange.first is None:
            status = "no delta"
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status == "completed":
            self.first.append(exchange.first_seconds())  # type: ignore[arg-type]
            self.result.append(exchange.result_seconds())  # type: ignore[arg-type]

    def summary(self) -> dict[str, Any]:
        return {
            "count": len(self.result),
            "statuses": self.statuses,
            "first_ms": percentiles(self.first),
            "result_ms": percentiles(self.result),
        }


async def wait(
    port: int, cold: int, warm: int, warmup: int, prompt: str, agent: list[str], cwd: str, first: str = "bridge"
) -> dict[str, Any]:
    """Case 8: what a user waits for, through the bridge and from a direct ACP client.

    Cold: ``cold`` turns, each on a new session (``session.start``, which spawns an agent; the
    direct client spawns one, ``initialize``, ``session/new``, then prompts). Warm: ``warm``
    follow-up turns on one session (``session.message``; another ``session/prompt``). Each bridge
    turn is paired with a direct one, the pair's order alternating from ``first``; ``warmup``
    unmeasured pairs lead each variant. A cold session is closed (the bridge's ``session.close``,
    the direct agent's stdin) after its turn, outside the timed part, so no agent outlives its turn
    and the bridge never holds more than two sessions.

    Args:
        port: the bridge's port.
        cold: measured cold pairs.
        warm: measured warm pairs.
        warmup: unmeasured pairs before each variant.
        prompt: the fast agent's workload, e.g. ``chunks=3 bytes=64``.
        agent: the agent's command line, as the bridge's ``fast`` provider runs it.
        cwd: the agent's working directory (the bridge's first workspace root).
        first: ``bridge`` or ``direct``, the side that goes first in the first pair.

    Returns:
        ``{"cold"|"warm": {"bridge"|"direct": {count, statuses, first_ms, result_ms}}}``, latencies
        in milliseconds from the timer's start (before ``session.start``, or before the spawn).
    """
    bridge = BridgeConnection()
    await bridge.connect(port)
    samples = {variant: {"bridge": Samples(), "direct": Samples()} for variant in ("cold", "warm")}

    async def bridge_cold(index: int) -> tuple[Exchange, str]:
        session = f"wait-cold-{index}"
        exchange = await bridge.turn("session.start", session, prompt)
        await bridge.request("session.close", {"sessionId": session})
        return exchange, _status(exchange)

    async def direct_cold(index: int) -> tuple[Exchange, str]:
        started = time.perf_counter()
        direct = await DirectAgent.spawn(agent, cwd)
        try:
            await direct.open_session(cwd)
            exchange = await direct.prompt(prompt, started)
        finally:
            await direct.close()
        return exchange, stop_reason(exchange)

    warm_agent: DirectAgent | None = None

    async def bridge_warm(index: int) -> tuple[Exchange, str]:
        exchange = await bridge.turn("session.message", "wait-warm", prompt)
        return exchange, _status(exchange)

    async def direct_warm(index: int) -> tuple[Exchange, str]:
        assert warm_agent is not None
        exchange = await warm_agent.prompt(prompt)
        return exchange, stop_reason(exchange)

    async def pairs(variant: str, count: int, sides: dict[str, Any]) -> None:
        order = [first, "direct" if first == "bridge" else "bridge"]
        for index in range(warmup + count):
            for side in order if index % 2 == 0 else order[::-1]:
                exchange, status = await sides[side](index)
                if index >= warmup:
                    samples[variant][side].add(exchange, status)

    try:
        await pairs("cold", cold, {"bridge": bridge_cold, "direct": direct_cold})
        await bridge.turn("session.start", "wait-warm", prompt)  # the session the warm turns follow up
        warm_agent = await DirectAgent.spawn(agent, cwd)
        await warm_agent.open_session(cwd)
        await pairs("warm", warm, {"bridge": bridge_warm, "direct": direct_warm})
        await bridge.request("session.close", {"sessionId": "wait-warm"})
    finally:
        if warm_agent is not None:
            await warm_agent.close()
        bridge.close()
    return {variant: {side: s.summary() for side, s in sides.items()} for variant, sides in samples.items()}


MODES = {
    "rr-ws": rr_ws,
    "rr-http": rr_http,
    "stream-ws": stream_ws,
    "stream-sse": stream_sse,
    "paced": paced,
    "idle-ws": idle_ws,
    "turns": turns,
    "wait": wait,
}


def main() -> None:
    parser = argparse.ArgumentParser(description="a bench load client")
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--spec", default="{}", help="the mode's keyword arguments as JSON")
    args = parser.parse_args()
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    result = run(MODES[args.mode](args.port, **orjson.loads(args.spec)))
    sys.stdout.write("RESULT " + orjson.dumps(result).decode() + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
