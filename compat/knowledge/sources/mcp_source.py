"""The ``mcp`` source: llmwiki tools called with the official ``mcp`` client over Streamable HTTP.

``descriptor.url`` is the full MCP endpoint (llmwiki-serve's is ``/mcp/stream``); nothing is
appended to it. Each operation opens one client session, calls one tool and closes, all inside the
source timeout. A server that ends the session during the call (HTTP 404 to a request carrying
``Mcp-Session-Id``) gets one new session, so one new ``initialize``, and one retry of the call (MCP
2025-06-18 Transports §Session Management); a server that refuses the optional GET stream (405) is
not asked for it again by this source (``_mcp_http``). A tool result is read from
``structuredContent[<tool>]``, then ``structuredContent``, then the first text block parsed as JSON
(§2.2). A URL that answers no MCP (e.g. the server's base URL) becomes one ``mcp_unavailable``
error, not a transport trace.

``mcp`` and httpx2 are imported on first use.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio

from compat.knowledge.errors import SourceError
from compat.knowledge.settings import SourceDescriptor
from compat.knowledge.sources._mcp_http import GetStream, SessionWatch
from compat.knowledge.sources.base import (
    PAGE_LIST_LIMIT,
    Capabilities,
    RoutedRetrieval,
    capabilities_from,
    fallback_capabilities,
)
from compat.knowledge.sources.llmwiki_http import page_list

log = logging.getLogger(__name__)
_CONNECT_ERRORS = ("ConnectError", "ConnectTimeout", "ConnectionRefusedError", "OSError")
NO_MCP = "did not answer MCP at its url; set url to the MCP endpoint itself (llmwiki-serve: /mcp/stream)"


class _SessionExpired(Exception):
    """The server answered 404 to a request of the session (its ``Mcp-Session-Id`` is gone)."""


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _classify(exc: BaseException) -> SourceError:
    names = {type(leaf).__name__ for leaf in _leaves(exc)}
    if names & set(_CONNECT_ERRORS):
        return SourceError("connect", "could not be reached")
    return SourceError("mcp_unavailable", NO_MCP)


def tool_payload(result: Any, tool: str) -> Any:
    """The payload of a ``CallToolResult`` (structured content first, then JSON text)."""
    structured = getattr(result, "structured_content", None)
    if isinstance(structured, dict) and tool in structured:
        return structured[tool]
    if structured is not None:
        return structured
    for block in getattr(result, "content", None) or []:
        text = getattr(block, "text", None)
        if isinstance(text, str):
            try:
                return json.loads(text)
            except ValueError:
                break
    raise SourceError("invalid_json", "returned a tool result without JSON")


class McpSource:
    """An MCP server exposing llmwiki-serve's tools."""

    def __init__(self, descriptor: SourceDescriptor, *, timeout_s: float) -> None:
        self.descriptor = descriptor
        self._timeout = timeout_s
        self._get_stream = GetStream()

    async def _call(self, tool: str, arguments: dict[str, Any]) -> Any:
        """Call ``tool`` in a new MCP session, and once more in another if the server ended the first.

        One retry (MCP 2025-06-18 Transports §Session Management): a server that ends every new
        session at once is failing, not expiring sessions.

        Raises:
            SourceError: ``session_expired`` when the second session ends too, ``timeout``,
                ``connect``, ``mcp_unavailable``, ``upstream_error`` or ``invalid_json``.
        """
        try:
            with anyio.fail_after(self._timeout):
                try:
                    result = await self._call_in_session(tool, arguments)
                except _SessionExpired:
                    log.debug("MCP source %s ended its session; initializing a new one", self.descriptor.id)
                    result = await self._call_in_session(tool, arguments)
        except _SessionExpired as exc:
            raise SourceError("session_expired", "ended a new MCP session during the call") from exc
        except TimeoutError as exc:
            raise SourceError("timeout", "did not answer in time") from exc
        except SourceError:
            raise
        except Exception as exc:  # transport and protocol failures arrive as exception groups
            log.debug("MCP source %s failed: %s", self.descriptor.id, type(exc).__name__)
            raise _classify(exc) from exc
        if getattr(result, "is_error", False):
            raise SourceError("upstream_error", f"reported an error from {tool}")
        return tool_payload(result, tool)

    async def _call_in_session(self, tool: str, arguments: dict[str, Any]) -> Any:
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        watch = SessionWatch(self._get_stream)
        try:
            async with watch.http_client(self._timeout) as http:
                transport = streamable_http_client(self.descriptor.url or "", http_client=http)
                async with Client(transport, read_timeout_seconds=self._timeout) as client:
                    return await client.call_tool(tool, arguments)
        except Exception as exc:  # the SDK reports the 404 as an MCPError, possibly in a group
            if watch.expired:
                raise _SessionExpired from exc
            raise

    async def _object(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        payload = await self._call(tool, arguments)
        if not isinstance(payload, dict):
            raise SourceError("invalid_json", f"returned a {tool} result that is not an object")
        return payload

    async def source_bundle(self) -> dict[str, Any] | None:
        return await self._object("llmwiki_source_bundle", {})

    async def discover(self) -> Capabilities:
        bundle = await self.source_bundle()
        if bundle is not None and isinstance(bundle.get("capabilities"), list):
            return capabilities_from(bundle["capabilities"], self.descriptor, bundle)
        return fallback_capabilities(self.descriptor, None)

    async def context(self, question: str, routed: RoutedRetrieval) -> dict[str, Any]:
        return await self._object("llmwiki_context", routed.llmwiki_body(question))

    async def search(self, query: str, routed: RoutedRetrieval) -> list[dict[str, Any]]:
        results = (await self._object("llmwiki_search", routed.llmwiki_body(query))).get("results")
        return [r for r in results if isinstance(r, dict)] if isinstance(results, list) else []

    async def read_page(self, page_id: str, options: dict[str, Any]) -> dict[str, Any] | None:
        args = {"page_id": page_id.strip("/"), **{k: v for k, v in options.items() if v is not None}}
        if "fields" in args:
            args["fields"] = list(args["fields"])
        page = await self._object("llmwiki_read", args)
        return None if page.get("found") is False else page

    async def graph(self, limit: int) -> dict[str, Any]:
        return await self._object("llmwiki_graph", {"limit": limit})

    async def neighbors(self, seeds: list[str], depth: int, direction: str, limit: int) -> dict[str, Any]:
        args = {"seeds": seeds, "depth": depth, "direction": direction, "limit": limit}
        return await self._object("llmwiki_graph_neighbors", args)

    async def pages(self) -> tuple[list[dict[str, Any]], bool]:
        return page_list(await self.graph(PAGE_LIST_LIMIT))

    async def aclose(self) -> None:
        return None
