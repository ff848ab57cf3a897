"""The ``llmwiki-http`` source: an llmwiki-serve compatible HTTP server (§1.3–§1.10).

Endpoints: ``GET /health``, ``GET /source-bundle`` (fallback ``/manifest``), ``POST /query``,
``POST /search``, ``GET /read/{id}`` (id URL-encoded), ``GET /graph``, ``GET
/graph/neighborhood``. Redirects are never followed; every call is bounded by the source timeout
and the response size cap. A withheld page answers 200 ``{"found": false}``: that is "not found".

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from compat.knowledge.errors import SourceError
from compat.knowledge.settings import SourceDescriptor
from compat.knowledge.shapes import as_list
from compat.knowledge.sources.base import (
    PAGE_LIST_LIMIT,
    Capabilities,
    RoutedRetrieval,
    capabilities_from,
    fallback_capabilities,
)
from compat.knowledge.sources.http import http_client, request_json

_BUNDLE_KEYS = (
    "source_id",
    "bundle_id",
    "public_uri",
    "projection",
    "raw_origins",
    "source_refs",
    "capabilities",
    "adapter",
    "implementation",
    "page_count",
    "approved_page_count",
    "title",
)
PAGE_KINDS = ("topic", "hot", "index", "overview")


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SourceError("invalid_json", f"returned a {what} that is not an object")
    return value


class LlmwikiHttpSource:
    """An llmwiki-serve compatible server at ``descriptor.url`` (a base URL)."""

    def __init__(self, descriptor: SourceDescriptor, *, timeout_s: float) -> None:
        self.descriptor = descriptor
        self._base = (descriptor.url or "").rstrip("/")
        self._client = http_client(timeout_s)

    async def _get(self, path: str, **params: Any) -> Any:
        return await request_json(self._client, "GET", self._base + path, params=params or None)

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        return await request_json(self._client, "POST", self._base + path, json=body)

    async def source_bundle(self) -> dict[str, Any] | None:
        """``/source-bundle``, else ``/manifest`` when the bundle lacks every known key."""
        try:
            bundle = await self._get("/source-bundle")
        except SourceError as exc:
            if exc.http_status not in (404, 405):
                raise
            bundle = None
        if isinstance(bundle, dict) and any(k in bundle for k in _BUNDLE_KEYS):
            return bundle
        manifest = await self._get("/manifest")
        return manifest if isinstance(manifest, dict) else None

    async def discover(self) -> Capabilities:
        """Capabilities from the source bundle, else from ``/health``."""
        bundle = await self.source_bundle()
        if bundle is not None and isinstance(bundle.get("capabilities"), list):
            return capabilities_from(bundle["capabilities"], self.descriptor, bundle)
        health = await self._get("/health")
        if isinstance(health, dict) and isinstance(health.get("capabilities"), list):
            return capabilities_from(health["capabilities"], self.descriptor, bundle)
        return fallback_capabilities(self.descriptor, None)

    async def context(self, question: str, routed: RoutedRetrieval) -> dict[str, Any]:
        return _object(await self._post("/query", routed.llmwiki_body(question)), "context pack")

    async def search(self, query: str, routed: RoutedRetrieval) -> list[dict[str, Any]]:
        payload = _object(await self._post("/search", routed.llmwiki_body(query)), "search result")
        results = payload.get("results")
        return [r for r in results if isinstance(r, dict)] if isinstance(results, list) else []

    async def read_page(self, page_id: str, options: dict[str, Any]) -> dict[str, Any] | None:
        params: dict[str, Any] = {"include_drafts": "false"}
        for key in ("query", "max_chars"):
            if options.get(key) is not None:
                params[key] = options[key]
        if options.get("fields"):
            params["fields"] = ",".join(options["fields"])
        if options.get("sections"):
            params["sections"] = list(options["sections"])
        try:
            page = await self._get("/read/" + quote(page_id.strip("/"), safe=""), **params)
        except SourceError as exc:
            if exc.http_status == 404:
                return None
            raise
        if not isinstance(page, dict) or page.get("found") is False:
            return None
        return page

    async def graph(self, limit: int) -> dict[str, Any]:
        return _object(await self._get("/graph", limit=limit, include_drafts="false"), "graph")

    async def neighbors(self, seeds: list[str], depth: int, direction: str, limit: int) -> dict[str, Any]:
        params = {"seed": seeds, "depth": depth, "direction": direction, "limit": limit, "include_drafts": "false"}
        return _object(await self._get("/graph/neighborhood", **params), "graph neighborhood")

    async def pages(self) -> tuple[list[dict[str, Any]], bool]:
        """Page ids from ``/graph`` (up to 2,000 page nodes; the folder cards are capped)."""
        graph = await self.graph(PAGE_LIST_LIMIT)
        return page_list(graph)

    async def aclose(self) -> None:
        await self._client.aclose()


def page_list(graph: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """``[{id, title, summary}]`` from an llmwiki graph's page nodes, and whether it was cut."""
    nodes = as_list(graph.get("nodes"))
    pages = []
    for node in nodes:
        if not isinstance(node, dict) or node.get("kind") not in PAGE_KINDS:
            continue
        node_id = str(node.get("id") or "")
        if node_id.startswith("page:"):
            pages.append({"id": node_id[5:], "title": str(node.get("label") or node_id[5:]), "summary": ""})
    return pages, len(nodes) >= PAGE_LIST_LIMIT
