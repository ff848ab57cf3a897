"""Small servers the knowledge tests run on 127.0.0.1: a threaded uvicorn helper, a fake
OpenAI-compatible runtime (stream, JSON, error, hang), fake llmwiki sources that are slow, and
llmwiki-serve itself as a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

LLMWIKI_VERSION = "0.2.17"
START_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ThreadedServer:
    """An ASGI app served by uvicorn from a thread on 127.0.0.1:<ephemeral>."""

    def __init__(self, app: Any, lifespan: str = "off") -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan=lifespan,
            loop="asyncio",
            http="h11",
            ws="none",
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "test server did not start"
            time.sleep(0.005)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(5)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(5)
        self.sock.close()


# ---- fake OpenAI-compatible runtime --------------------------------------------------------------


@dataclass
class FakeRuntime:
    """``POST /v1/chat/completions``. ``mode``: ``stream`` (SSE chunks), ``json``, ``error`` (HTTP
    500) or ``hang`` (never answers). Every request body is kept in ``requests``."""

    mode: str = "stream"
    chunks: list[str] = field(
        default_factory=lambda: ["Refunds over 500 USD need ", "finance lead approval ", "[1](#citation-1)."]
    )
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])

    async def _chat(self, request: Request) -> Response:
        self.requests.append(json.loads(await request.body()))
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        if self.mode == "error":
            body = {"error": {"message": "upstream exploded with sk-secretsecretsecret"}}
            return JSONResponse(body, status_code=500)
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if self.mode == "json":
            message = {"role": "assistant", "content": "".join(self.chunks)}
            return JSONResponse(
                {
                    "id": "c1",
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                }
            )

        async def events():
            for chunk in self.chunks:
                choice = {"index": 0, "delta": {"content": chunk}}
                data = {"id": "c1", "object": "chat.completion.chunk", "choices": [choice]}
                yield f"data: {json.dumps(data)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


# ---- fake llmwiki sources (slow, counted) --------------------------------------------------------


@dataclass
class SlowSources:
    """llmwiki-http sources under ``/<name>/``: each answers ``/query`` after ``delays[name]``
    seconds (``None``: never). Counts requests in flight and the most seen at once."""

    delays: dict[str, float | None] = field(default_factory=dict)
    in_flight: int = 0
    max_in_flight: int = 0
    calls: list[str] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{name}/{endpoint:path}", self._handle, methods=["GET", "POST"])])

    async def _handle(self, request: Request) -> Response:
        name, endpoint = request.path_params["name"], request.path_params["endpoint"]
        self.calls.append(f"{request.method} /{name}/{endpoint}")
        if endpoint != "query":
            return JSONResponse({"detail": "not here"}, status_code=404)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            delay = self.delays.get(name, 0.0)
            await asyncio.sleep(3600 if delay is None else delay)
        finally:
            self.in_flight -= 1
        evidence = [
            {
                "page_id": f"{name}-page",
                "title": f"{name} page",
                "path": f"{name}.md",
                "score": 1.0,
                "snippet": f"Evidence from {name}.",
            }
        ]
        graph = {"nodes": [], "edges": []}
        return JSONResponse({"wiki_title": name, "evidence": evidence, "orientation": [], "graph": graph})


# ---- llmwiki-serve ---------------------------------------------------------------------------------


def llmwiki_bin() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = Path(os.environ.get("XWORKMATE_LLMWIKI_DIR") or cache / "xworkmate-bridge" / f"llmwiki-{LLMWIKI_VERSION}")
    return root / "bin" / "llmwiki-serve"


class LlmwikiServe:
    """The real llmwiki-serve over ``wiki`` (io log off, state in ``state_dir``, A2A compat on)."""

    def __init__(self, wiki: Path, workdir: Path) -> None:
        self.wiki, self.workdir = wiki, workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LlmwikiServe:
        env = {**os.environ, "LLMWIKI_SERVE_STATE_DIR": str(self.workdir / "state"), "LLMWIKI_SERVE_IO_LOG": "off"}
        cmd = [
            str(llmwiki_bin()),
            "serve",
            str(self.wiki),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--io-log",
            "off",
            "--enable-a2a-compat",
        ]
        self.proc = subprocess.Popen(
            cmd, cwd=self.workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "llmwiki-serve exited during start-up"
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)  # readiness poll of a subprocess, bounded by START_TIMEOUT
        self.__exit__()
        raise AssertionError("llmwiki-serve did not become ready")

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
