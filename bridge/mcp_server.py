"""The bridge's MCP surface: the knowledge tools served by the official ``mcp`` package.

``create_mcp_app(service)`` returns an ASGI app speaking MCP Streamable HTTP in stateless mode
with JSON responses (no SSE sessions to keep). It is meant to be routed at ``POST /mcp`` behind
the bridge's own bearer-auth and origin checks, so the SDK's DNS-rebinding check is off here.
The app needs its lifespan: either mount it where ASGI ``lifespan`` events reach it, or enter
``app.lifespan()`` in the bridge app's lifespan.

Tools (llmwiki-agent-bridge's MCP surface, shared/reference/knowledge-sources.md §2.11):
``llmwiki_agent_run``, ``llmwiki_list_sources``, ``llmwiki_context``, ``llmwiki_search``,
``llmwiki_read``, ``llmwiki_graph``, ``llmwiki_graph_neighbors``, ``llmwiki_source_bundle`` and
``get_wiki_content``. Bad arguments are JSON-RPC -32602; a failing source is a tool result with
``isError: true`` and ``structuredContent.llmwiki_source_error``.

``mcp`` is heavy: it is imported when ``create_mcp_app`` is called, never at bridge start-up.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import orjson

from bridge import __version__
from bridge.rpc.errors import RpcError
from compat.knowledge.diagnostics import safe_text
from compat.knowledge.errors import KnowledgeNotFound, SourceError
from compat.knowledge.tools import KnowledgeTools, ToolResult
from compat.knowledge.tools_spec import SPECS

log = logging.getLogger(__name__)
SERVER_NAME = "xworkmate-bridge"
Scope = dict[str, Any]


def _result(result: ToolResult) -> Any:
    from mcp_types import CallToolResult, TextContent

    return CallToolResult(
        content=[TextContent(type="text", text=result.text)],
        structured_content=result.structured,
        is_error=result.is_error,
    )


def _source_error(tool: str, exc: SourceError | KnowledgeNotFound) -> ToolResult:
    message = safe_text(f"The knowledge source {exc.message}") if isinstance(exc, SourceError) else exc.message
    payload = {"tool": tool, "message": message}
    if isinstance(exc, KnowledgeNotFound):
        payload.update(code=exc.name, **exc.data)
    return ToolResult(message, {"llmwiki_source_error": payload}, is_error=True)


def build_server(service: Any) -> Any:
    """The low-level MCP ``Server`` with the knowledge tools over ``service``."""
    from mcp.server import Server
    from mcp.shared.exceptions import MCPError
    from mcp_types import ListToolsResult, Tool, ToolAnnotations

    tools = KnowledgeTools(service)
    listing = [
        Tool(
            name=s.name,
            description=s.description,
            input_schema=s.input_schema(),
            annotations=ToolAnnotations(read_only_hint=s.read_only, destructive_hint=False, open_world_hint=False),
        )
        for s in SPECS.values()
    ]

    async def list_tools(ctx: Any, params: Any) -> Any:
        return ListToolsResult(tools=listing)

    async def call_tool(ctx: Any, params: Any) -> Any:
        try:
            return _result(await tools.call(params.name, params.arguments))
        except (SourceError, KnowledgeNotFound) as exc:
            return _result(_source_error(params.name, exc))
        except RpcError as exc:
            raise MCPError(exc.code, exc.message, {"code": exc.name, **exc.data}) from exc

    def input_schema(name: str) -> dict[str, Any] | None:
        spec = SPECS.get(name)
        return spec.input_schema() if spec else None

    return Server(
        SERVER_NAME,
        version=__version__,
        instructions="Knowledge sources of this xworkmate-bridge: "
        "answer with llmwiki_agent_run, or explore with get_wiki_content starting at /.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        get_tool_input_schema=input_schema,
    )


READY_TIMEOUT = 30.0  # seconds a request waits for the MCP surface to finish starting


def _import_mcp() -> None:
    import mcp.server.streamable_http_manager  # noqa: F401
    import mcp_types  # noqa: F401


class McpApp:
    """The ASGI app returned by ``create_mcp_app``; handles ``http`` and ``lifespan`` scopes."""

    def __init__(self, service: Any) -> None:
        self._service = service
        self.server: Any = None
        self._handler: Any = None
        self._ready: anyio.Event | None = None
        self._wanted: anyio.Event | None = None

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """Run the MCP session manager (one task group) while the bridge serves.

        The MCP surface starts on the first request to ``/mcp`` (which waits for it, bounded),
        not with the bridge: importing ``mcp`` takes ~0.3 s of CPU, and even in a background
        thread it held the GIL against the bridge's start (bench case 6: cold start 0.59 s →
        0.33 s with it off the start path, and less again without the thread).
        """
        self._ready, self._wanted = anyio.Event(), anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._run, self._wanted, self._ready)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()

    async def _run(self, wanted: anyio.Event, ready: anyio.Event) -> None:
        await wanted.wait()
        await anyio.to_thread.run_sync(_import_mcp)  # off the event loop: other requests go on
        from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
        from mcp.server.transport_security import TransportSecuritySettings

        self.server = build_server(self._service)
        manager = StreamableHTTPSessionManager(
            app=self.server,
            json_response=True,
            stateless=True,
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        async with manager.run():
            self._handler = StreamableHTTPASGIApp(manager)
            ready.set()
            try:
                await anyio.sleep_forever()
            finally:
                self._handler = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan_events(receive, send)
        elif self._handler is None and not await self._wait_ready():
            await _plain(send, 503, {"error": {"code": -32603, "message": "the MCP surface is not running"}})
        elif (handler := self._handler) is not None:
            await handler(scope, receive, send)
        else:  # it stopped again while this request waited
            await _plain(send, 503, {"error": {"code": -32603, "message": "the MCP surface is not running"}})

    async def _wait_ready(self) -> bool:
        if self._wanted is not None:
            self._wanted.set()
        if self._ready is not None:
            with anyio.move_on_after(READY_TIMEOUT):
                await self._ready.wait()
        return self._handler is not None

    async def _lifespan_events(self, receive: Any, send: Any) -> None:
        async with contextlib.AsyncExitStack() as stack:
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await stack.enter_async_context(self.lifespan())
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await stack.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return


async def _plain(send: Any, status: int, body: dict[str, Any]) -> None:
    data = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})


def create_mcp_app(service: Any) -> McpApp:
    """An ASGI app serving the knowledge tools of ``service`` (a ``KnowledgeService``) over MCP
    Streamable HTTP (stateless, JSON responses)."""
    return McpApp(service)
