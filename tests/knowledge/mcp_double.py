"""A stateful Streamable HTTP MCP server double (protocol 2025-06-18, JSON responses) that counts
what it is asked, expires sessions on demand and refuses the optional GET stream.

Spec: MCP 2025-06-18 "Transports" §Session Management (an unknown or expired ``Mcp-Session-Id``
is answered 404; the client must then send a new ``initialize``) and §Listening for Messages from
the Server (a server without a GET stream answers 405). The 404 body is the one the ``mcp`` SDK's
own session manager sends.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

PROTOCOL = "2025-06-18"
TOOLS = ["llmwiki_context", "llmwiki_search", "llmwiki_source_bundle"]
SESSION_NOT_FOUND = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Session not found"}}


@dataclass
class ExpiringMcp:
    """``/mcp``. ``expire_calls``: how many of the next ``tools/call`` requests drop their session and
    answer 404. ``get_status``: the answer to GET. ``hold_for_get``: hold ``notifications/initialized``
    until that session's GET arrives (at most ``get_wait_s`` seconds), so a client that opens the GET
    stream is seen doing so before it sends its next request. ``counts``: requests by JSON-RPC
    method, plus ``GET`` and ``DELETE``; ``calls``: the arguments of each answered ``tools/call``."""

    expire_calls: int = 0
    get_status: int = 405
    hold_for_get: bool = False
    get_wait_s: float = 0.5
    counts: Counter[str] = field(default_factory=Counter)
    calls: list[dict[str, Any]] = field(default_factory=list)
    sessions: dict[str, asyncio.Event] = field(default_factory=dict)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/mcp", self._handle, methods=["GET", "POST", "DELETE"])])

    async def _handle(self, request: Request) -> Response:
        session = request.headers.get("mcp-session-id")
        if request.method != "POST":
            self.counts[request.method] += 1
            if session not in self.sessions:
                return JSONResponse(SESSION_NOT_FOUND, status_code=404)
            if request.method == "DELETE":
                del self.sessions[session]
                return Response(status_code=200)
            self.sessions[session].set()
            return Response(status_code=self.get_status)
        body = await request.json()
        method = body.get("method", "")
        self.counts[method] += 1
        if method == "initialize":
            return self._initialize(body)
        if method == "server/discover":
            return _error(body, -32601, "Method not found")
        if session not in self.sessions:
            return JSONResponse(SESSION_NOT_FOUND, status_code=404 if session else 400)
        if "id" not in body:
            if method == "notifications/initialized" and self.hold_for_get:
                try:
                    await asyncio.wait_for(self.sessions[session].wait(), self.get_wait_s)
                except TimeoutError:
                    pass
            return Response(status_code=202)
        if method == "tools/list":
            tools = [{"name": name, "inputSchema": {"type": "object"}} for name in TOOLS]
            return _result(body, {"tools": tools})
        if method == "tools/call":
            return self._call(body, session)
        return _error(body, -32601, "Method not found")

    def _initialize(self, body: dict[str, Any]) -> Response:
        session = uuid.uuid4().hex
        self.sessions[session] = asyncio.Event()
        result = {
            "protocolVersion": PROTOCOL,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "double", "version": "1"},
        }
        return _result(body, result, headers={"mcp-session-id": session})

    def _call(self, body: dict[str, Any], session: str) -> Response:
        if self.expire_calls > 0:
            self.expire_calls -= 1
            del self.sessions[session]
            return JSONResponse(SESSION_NOT_FOUND, status_code=404)
        params = body.get("params") or {}
        self.calls.append(params.get("arguments") or {})
        payload = {"tool": params.get("name"), "arguments": params.get("arguments") or {}}
        return _result(body, {"content": [], "structuredContent": payload, "isError": False})


def _result(body: dict[str, Any], result: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"jsonrpc": "2.0", "id": body.get("id"), "result": result}, headers=headers)


def _error(body: dict[str, Any], code: int, message: str) -> Response:
    return JSONResponse({"jsonrpc": "2.0", "id": body.get("id"), "error": {"code": code, "message": message}})
