"""The link graph of a local wiki, in llmwiki-serve's node/edge shapes (§1.7, §1.10).

Nodes: ``page:<id>`` (kind = the page's role), ``tag:<name>`` and ``placeholder:<target>`` for a
link to no page. Edges: ``links_to`` and ``tagged``. Wikilinks resolve like Obsidian: an exact
id, then relative to the linking page's folder, then a unique file stem. Cycles are harmless: the
neighbourhood walk keeps a visited set and every walk is bounded by depth and node count.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import posixpath
from collections import deque
from collections.abc import Iterable
from typing import Any

import msgspec

from compat.knowledge.sources._wiki_index import SUFFIXES, Page


class WikiGraph(msgspec.Struct):
    """Nodes and edges in output order, and the indexes of each node's outgoing and incoming
    edges, so that a walk or a subgraph reads only the edges of the nodes it meets: scanning
    every edge per call cost 7 ms a turn per 2,000-page wiki (bench case 7)."""

    nodes: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)  # insertion order = output order
    edges: list[dict[str, Any]] = msgspec.field(default_factory=list)
    leaving: dict[str, list[int]] = msgspec.field(default_factory=dict)  # node id → its outgoing edges
    arriving: dict[str, list[int]] = msgspec.field(default_factory=dict)  # node id → its incoming edges

    def add_node(self, node: dict[str, Any]) -> None:
        self.nodes.setdefault(node["id"], node)

    def add_edge(self, source: str, target: str, relation: str, **metadata: Any) -> None:
        self.leaving.setdefault(source, []).append(len(self.edges))
        self.arriving.setdefault(target, []).append(len(self.edges))
        self.edges.append({"source": source, "target": target, "relation": relation, "metadata": metadata})

    def outgoing(self, node_id: str) -> list[dict[str, Any]]:
        """The edges leaving ``node_id``, in edge order."""
        return [self.edges[i] for i in self.leaving.get(node_id, ())]

    def neighbours(self, node_id: str, direction: str) -> list[str]:
        """The nodes one edge from ``node_id`` (``direction``: ``out``, ``in`` or ``both``), in
        edge order."""
        ways = list(self.leaving.get(node_id, ())) if direction in ("out", "both") else []
        if direction in ("in", "both"):
            ways = sorted(ways + self.arriving.get(node_id, []))
        edges = (self.edges[i] for i in ways)
        return [e["target"] if e["source"] == node_id else e["source"] for e in edges]


def resolve_link(target: str, from_id: str, ids: set[str], stems: dict[str, list[str]]) -> str | None:
    """The page id ``target`` (written in page ``from_id``) points at, or None."""
    clean = target.strip().lstrip("/")
    for suffix in SUFFIXES:
        if clean.lower().endswith(suffix):
            clean = clean[: -len(suffix)]
    if clean.startswith("./"):
        clean = clean[2:]
    if clean in ids:
        return clean
    relative = posixpath.normpath(posixpath.join(posixpath.dirname(from_id), clean))
    if relative in ids:
        return relative
    matches = stems.get(posixpath.basename(clean), [])
    return matches[0] if len(matches) == 1 else None


def page_node(page: Page) -> dict[str, Any]:
    metadata = {"review_state": str(page.front_matter.get("review_state") or "unknown"), "tags": list(page.tags)}
    return {"id": f"page:{page.id}", "label": page.title, "kind": page.role, "path": page.path, "metadata": metadata}


def build_graph(pages: list[Page]) -> WikiGraph:
    """The whole graph: page nodes first (by path), then tags and placeholders as met."""
    ids = {p.id for p in pages}
    stems: dict[str, list[str]] = {}
    for p in pages:
        stems.setdefault(posixpath.basename(p.id), []).append(p.id)
    graph = WikiGraph()
    for page in pages:
        graph.add_node(page_node(page))
    for page in pages:
        for target in page.links:
            resolved = resolve_link(target, page.id, ids, stems)
            if resolved is None:
                node_id = f"placeholder:{target.strip()}"
                graph.add_node(
                    {
                        "id": node_id,
                        "label": target.strip(),
                        "kind": "placeholder",
                        "path": page.path,
                        "metadata": {"unresolved": True},
                    }
                )
                graph.add_edge(f"page:{page.id}", node_id, "links_to", unresolved=True)
            elif resolved != page.id:
                graph.add_edge(f"page:{page.id}", f"page:{resolved}", "links_to")
        for tag in page.tags:
            graph.add_node({"id": f"tag:{tag}", "label": tag, "kind": "tag", "path": page.path, "metadata": {}})
            graph.add_edge(f"page:{page.id}", f"tag:{tag}", "tagged")
    return graph


def subgraph(graph: WikiGraph, keep: Iterable[str]) -> dict[str, Any]:
    """``{nodes, edges}`` restricted to ``keep`` (in ``keep``'s order)."""
    wanted = [k for k in dict.fromkeys(keep) if k in graph.nodes]
    chosen = set(wanted)
    inside = sorted(i for k in wanted for i in graph.leaving.get(k, ()) if graph.edges[i]["target"] in chosen)
    return {"nodes": [graph.nodes[k] for k in wanted], "edges": [graph.edges[i] for i in inside]}


def neighborhood(graph: WikiGraph, seeds: list[str], depth: int, direction: str, limit: int) -> dict[str, Any]:
    """Breadth-first walk from ``seeds`` (page ids or node ids), at most ``depth`` hops and
    ``limit`` nodes; ``direction`` is ``out``, ``in`` or ``both``."""
    starts, unmatched = [], []
    for seed in seeds:
        node_id = seed if seed in graph.nodes else f"page:{seed}"
        (starts if node_id in graph.nodes else unmatched).append(node_id if node_id in graph.nodes else seed)
    seen = dict.fromkeys(starts[:limit])
    queue = deque((s, 0) for s in seen)
    while queue and len(seen) < limit:
        node_id, hops = queue.popleft()
        if hops >= depth:
            continue
        for nxt in graph.neighbours(node_id, direction):
            if nxt not in seen and len(seen) < limit:
                seen[nxt] = None
                queue.append((nxt, hops + 1))
    out = subgraph(graph, seen)
    return {"seeds": starts, "unmatched": unmatched, "depth": depth, "direction": direction, **out}
