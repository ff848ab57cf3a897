"""Evidence packing: source answers → citations, graph, source bundles and prompt summaries.

Rules (llmwiki-agent-bridge, §2.3): a citation is an item of a context pack's ``evidence`` (and
``citations``) array, never an orientation item; its id is ``<sourceId>:<page id>``; citations
are deduplicated by id, first wins, and keep the order of the selected sources. Graph node ids and
edge endpoints are prefixed with the source id, at most ``GRAPH_NODES_PER_SOURCE`` nodes per
source. Source bundles pass an allowlist: no root paths, locators or unknown keys.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec

from compat.knowledge.shapes import as_dict, as_list

GRAPH_NODES_PER_SOURCE = 120
SNIPPET_CHARS = 600
SOURCE_REFS = 40
_SAFE_REF = re.compile(r"^urn:llmwiki:source-ref:[A-Za-z0-9][A-Za-z0-9._~-]{0,127}$")


def readable(text: Any) -> str:
    """Markdown as one readable line: ``[[a|b]]`` → b, ``[[a]]`` → a, heading marks dropped."""
    value = str(text or "")
    if "[[" in value:  # most titles and snippets have no link: skip the two passes
        value = re.sub(r"\[\[([^\]|]+)\|([^\]]+)\]\]", r"\2", value)
        value = re.sub(r"\[\[([^\]]+)\]\]", r"\1", value)
    if "#" in value:
        value = re.sub(r"(^|\s)#{1,6}\s+", r"\1", value)
    return " ".join(value.split())


_UNSAFE_PATH = re.compile(r"[\\?#:]|(?:^|/)\.\.(?:/|$)")  # a backslash, query, fragment, drive or ``..`` part


def safe_path(value: Any) -> str | None:
    """A relative path fit for clients (no absolute, parent, drive or query parts), else None."""
    if not isinstance(value, str) or not value or value.startswith("/") or _UNSAFE_PATH.search(value):
        return None
    return value


def safe_url(value: Any) -> str | None:
    """An http(s)/llmwiki URL without credentials, query or fragment, else None."""
    if not isinstance(value, str):
        return None
    if _SAFE_REF.match(value):
        return value
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https", "llmwiki") or not parts.hostname:
        return None
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _refs(item: dict[str, Any]) -> list[str]:
    refs = item.get("sourceRefs", item.get("source_refs")) or []
    return [str(r) for r in refs if isinstance(r, (str, int))][:SOURCE_REFS] if isinstance(refs, list) else []


def local_id(item: dict[str, Any], index: int) -> str:
    """An evidence item's page id as the source names it (its 1-based ``index`` when it has none)."""
    return str(item.get("page_id") or item.get("pageId") or item.get("id") or item.get("path") or index)


def citations_from(source_id: str, payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The citations of one context pack, ids prefixed with ``source_id``."""
    items = [i for key in ("evidence", "citations") for i in payload.get(key) or [] if isinstance(i, dict)]
    out = []
    for index, item in enumerate(items, start=1):
        local = local_id(item, index)
        citation: dict[str, Any] = {
            "id": local if local.startswith(f"{source_id}:") else f"{source_id}:{local}",
            "sourceId": source_id,
            "pageId": local.removeprefix(f"{source_id}:"),
            "title": readable(item.get("title")) or "Untitled",
            "snippet": readable(item.get("snippet") or item.get("summary"))[:SNIPPET_CHARS],
            "sourceRefs": _refs(item),
        }
        if isinstance(item.get("score"), (int, float)):
            citation["score"] = round(float(item["score"]), 6)
        if path := safe_path(item.get("path")):
            citation["path"] = path
        if url := safe_url(item.get("url")):
            citation["url"] = url
        out.append(citation)
    return out


def graph_from(source_id: str, payload: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Prefixed ``(nodes, edges)`` of one answer's graph (edges only between kept nodes)."""
    graph = as_dict(payload.get("graph")) or payload
    prefix = source_id + ":"
    nodes: list[dict[str, Any]] = []
    kept: set[str] = set()
    for node in as_list(graph.get("nodes")):
        if len(nodes) == GRAPH_NODES_PER_SOURCE:
            break
        if not isinstance(node, dict) or not node.get("id"):
            continue
        node_id = str(node["id"])
        kept.add(node_id)
        meta = node.get("metadata")
        metadata = {**meta, "sourceId": source_id} if isinstance(meta, dict) else {"sourceId": source_id}
        metadata.pop("source_root", None)
        out = {
            "id": prefix + node_id,
            "label": str(node.get("label") or node.get("title") or node_id),
            "kind": str(node.get("kind") or node.get("role") or "node"),
            "metadata": metadata,
        }
        if path := safe_path(node.get("path")):
            out["path"] = path
        nodes.append(out)
    edges = []
    for edge in as_list(graph.get("edges")):
        if not isinstance(edge, dict):
            continue
        source, target = edge.get("source"), edge.get("target")
        if isinstance(source, str) and isinstance(target, str) and source in kept and target in kept:
            meta = edge.get("metadata")  # one copy of it: a turn's graph has hundreds of edges
            edges.append(
                {
                    "source": prefix + source,
                    "target": prefix + target,
                    "relation": str(edge.get("relation") or "related"),
                    "metadata": {**meta, "sourceId": source_id} if isinstance(meta, dict) else {"sourceId": source_id},
                }
            )
    return nodes, edges


def bundle_from(source_id: str, bundle: dict[str, Any]) -> dict[str, Any]:
    """The allowlisted view of a source bundle (§2.3 ``sourceBundles``)."""
    proj = as_dict(bundle.get("projection"))
    raw = as_dict(bundle.get("raw_origins"))
    refs = [r for r in as_list(bundle.get("source_refs")) if isinstance(r, dict)]
    out: dict[str, Any] = {
        "sourceId": source_id,
        "upstreamSourceId": bundle.get("source_id"),
        "bundleId": bundle.get("bundle_id"),
        "title": bundle.get("title"),
        "adapter": bundle.get("adapter"),
        "implementation": bundle.get("implementation"),
        "capabilities": [c.strip() for c in bundle.get("capabilities") or [] if isinstance(c, str)],
        "projection": {
            "signature": proj.get("signature"),
            "pageCount": proj.get("page_count"),
            "approvedPageCount": proj.get("approved_page_count"),
            "graphNodeCount": proj.get("graph_node_count"),
            "graphEdgeCount": proj.get("graph_edge_count"),
        },
        "rawOrigins": {
            "enabled": raw.get("enabled"),
            "metadataOnly": raw.get("metadata_only"),
            "publicRootLabelCount": len(raw.get("public_root_labels") or []),
        },
        "sourceRefs": [
            {
                "id": r.get("id"),
                "label": r.get("label"),
                "type": r.get("type") or r.get("kind"),
                **({"uri": u} if (u := safe_url(r.get("uri"))) else {}),
            }
            for r in refs[:SOURCE_REFS]
        ],
        "sourceRefCount": len(refs),
    }
    return out


class Evidence(msgspec.Struct):
    """Everything the turn learned from its sources, in selected-source order."""

    citations: list[dict[str, Any]] = msgspec.field(default_factory=list)
    nodes: list[dict[str, Any]] = msgspec.field(default_factory=list)
    edges: list[dict[str, Any]] = msgspec.field(default_factory=list)
    bundles: list[dict[str, Any]] = msgspec.field(default_factory=list)
    sources: list[dict[str, Any]] = msgspec.field(default_factory=list)  # prompt summaries of answering sources
    failures: list[dict[str, Any]] = msgspec.field(default_factory=list)  # prompt notes of failed sources

    def add(self, source: Any, payload: dict[str, Any], bundle_view: dict[str, Any] | None) -> list[dict[str, Any]]:
        """Merge one answering source (``source``: its descriptor; ``bundle_view``: its bundle's
        :func:`bundle_from` view, kept as is); returns its new citations."""
        known = {c["id"] for c in self.citations}
        fresh = []
        for citation in citations_from(source.id, payload):
            if citation["id"] not in known:  # first wins, within a source and across sources
                known.add(citation["id"])
                fresh.append(citation)
        first = len(self.citations) + 1
        self.citations += fresh
        nodes, edges = graph_from(source.id, payload)
        node_ids = {n["id"] for n in self.nodes}
        self.nodes += [n for n in nodes if n["id"] not in node_ids]
        self.edges += edges
        if bundle_view is not None:
            self.bundles.append(bundle_view)
        self.sources.append(_summary(source, payload, list(range(first, first + len(fresh))), nodes, edges))
        return fresh

    def fail(self, source: Any, message: str, remediation: str) -> None:
        self.failures.append(
            {
                "id": source.id,
                "name": source.name,
                "protocol": source.protocol,
                "error": "Source query failed.",
                "message": message,
                "remediation": remediation,
            }
        )


def _summary(
    source: Any, payload: dict[str, Any], indexes: list[int], nodes: list[Any], edges: list[Any]
) -> dict[str, Any]:
    orientation = [
        {
            "id": f"{source.id}:{o.get('page_id') or o.get('id')}",
            "title": readable(o.get("title")),
            "path": safe_path(o.get("path")),
            "snippet": readable(o.get("snippet"))[:320],
            "role": o.get("role"),
            "sourceRefs": _refs(o),
        }
        for o in payload.get("orientation") or []
        if isinstance(o, dict)
    ][:3]
    return {
        "id": source.id,
        "name": source.name,
        "protocol": source.protocol,
        "description": readable(payload.get("description"))[:320],
        "wikiTitle": payload.get("wiki_title"),
        "adapter": payload.get("adapter"),
        "implementation": payload.get("implementation"),
        "pageCount": payload.get("page_count"),
        "approvedPageCount": payload.get("approved_page_count"),
        "orientation": orientation,
        "citationIndexes": indexes,
        "citationCount": len(indexes),
        "limitations": [readable(x)[:320] for x in payload.get("limitations") or []][:8],
        "graph": {"nodeCount": len(nodes), "edgeCount": len(edges)},
    }
