"""``get_wiki_content``: the progressive-disclosure read as a Markdown page for agents.

The path is ``/<sourceId>/<node path>``; ``/`` lists the sources. The text is the node's
front-matter (path, title, summary, its own front-matter), its content, then
``## Children Wikis:`` and an ``<available_wikis>`` list of each child's path, title and summary
(the shape Agents-Flex's WikiTool uses, §3). An unknown path answers "Wiki not found".

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape

import yaml

from compat.knowledge.errors import KnowledgeNotFound
from compat.knowledge.tree import normalize


def _children_xml(children: list[dict[str, Any]]) -> str:
    items = "".join(
        f"<wiki><path>{escape(c['path'])}</path><title>{escape(str(c.get('title') or ''))}</title>"
        f"<summary>{escape(str(c.get('summary') or ''))}</summary></wiki>\n"
        for c in children
    )
    return f"<available_wikis>\n{items}</available_wikis>"


def render(node: dict[str, Any]) -> str:
    meta = {"path": node["path"], "title": node.get("title", ""), "summary": node.get("summary", "")}
    meta.update({k: v for k, v in (node.get("frontMatter") or {}).items() if k not in meta})
    head = yaml.safe_dump(meta, allow_unicode=True, sort_keys=False).strip()
    parts = [f"---\n{head}\n---", node.get("content") or ""]
    if node.get("children"):
        parts.append("## Children Wikis:\n" + _children_xml(node["children"]))
    return "\n\n".join(p for p in parts if p).strip() + "\n"


async def wiki_node(service: Any, path: str) -> dict[str, Any]:
    """``{get_wiki_content: node, _markdown: text}`` for ``path`` (``/<sourceId>/…``)."""
    full = normalize(path)
    source_id, _, rest = full.strip("/").partition("/")
    if not source_id:
        listing = (await service.list_sources(probe=False))["sources"]
        node = {
            "path": "/",
            "kind": "root",
            "title": "Knowledge sources",
            "content": "",
            "summary": "Every knowledge source this bridge can read.",
            "children": [
                {"path": f"/{s['id']}", "title": s["label"], "summary": f"{s['protocol']} knowledge source"}
                for s in listing
                if s["enabled"]
            ],
        }
    else:
        try:
            node = await service.read(source_id, "/" + rest)
        except KnowledgeNotFound as exc:
            parent = exc.data.get("nearestParent")
            hint = f" Nearest parent: /{source_id}{parent if parent != '/' else ''}." if parent else ""
            return {
                "get_wiki_content": {"found": False, "path": full, **exc.data},
                "_markdown": f"Wiki not found: {full}.{hint}",
            }
        node = {
            **node,
            "path": f"/{source_id}{node['path'] if node['path'] != '/' else ''}",
            "children": [{**c, "path": f"/{source_id}{c['path']}"} for c in node["children"]],
        }
    return {"get_wiki_content": node, "_markdown": render(node)}
