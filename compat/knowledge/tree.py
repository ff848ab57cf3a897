"""Progressive disclosure: a knowledge source seen as a tree of folders and pages.

Paths are ``/``-rooted and a page's path is its page id (``/ops/billing/refund-policy``). A
folder's content is its ``index`` or ``README`` page (that page is not listed again among the
children). The tree is derived from the source's page list, so it works the same for a
``local-wiki`` folder and for an llmwiki-serve server (whose ``/graph`` lists page ids).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import posixpath
from typing import Any

import msgspec

from bridge.rpc.errors import InvalidParams

INDEX_NAMES = ("index", "README", "readme")


def normalize(path: str) -> str:
    """``path`` as ``/a/b`` (``/`` for the root).

    Raises:
        InvalidParams: -32602 for ``.``/``..`` segments or a path that is not ``/``-rooted.
    """
    if not path.startswith("/"):
        raise InvalidParams("path must start with /", field="path")
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise InvalidParams("path must not contain . or .. segments", field="path")
    return "/" + "/".join(parts)


class Tree(msgspec.Struct):
    """Folders and pages of one source (ids without the leading ``/``)."""

    pages: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)  # id -> {id, title, summary}
    folders: set[str] = msgspec.field(default_factory=lambda: {""})

    @classmethod
    def of(cls, pages: list[dict[str, Any]]) -> Tree:
        tree = cls()
        for page in pages:
            tree.pages[page["id"]] = page
            folder = posixpath.dirname(page["id"])
            while folder and folder not in tree.folders:
                tree.folders.add(folder)
                folder = posixpath.dirname(folder)
        return tree

    def exists(self, node_id: str) -> bool:
        return node_id in self.folders or node_id in self.pages

    def nearest_parent(self, node_id: str) -> str:
        """The closest existing ancestor path of ``node_id``."""
        parent = posixpath.dirname(node_id)
        while parent and not self.exists(parent):
            parent = posixpath.dirname(parent)
        return "/" + parent

    def index_page(self, folder: str) -> str | None:
        """The page that is ``folder``'s content (``<folder>/index`` or ``<folder>/README``)."""
        for name in INDEX_NAMES:
            candidate = posixpath.join(folder, name) if folder else name
            if candidate in self.pages:
                return candidate
        return None

    def children(self, folder: str) -> list[dict[str, Any]]:
        """Direct children of ``folder``: sub-folders first, then pages, each by path."""
        if folder not in self.folders:
            return []
        own_index = self.index_page(folder)
        subfolders = sorted(f for f in self.folders if f and posixpath.dirname(f) == folder)
        pages = sorted(p for p in self.pages if posixpath.dirname(p) == folder and p != own_index)
        out = []
        for sub in subfolders:
            index = self.index_page(sub)
            count = sum(1 for p in self.pages if p.startswith(sub + "/"))
            info = self.pages.get(index or "", {})
            out.append(
                {
                    "path": "/" + sub,
                    "kind": "folder",
                    "title": info.get("title") or posixpath.basename(sub),
                    "summary": info.get("summary") or f"{count} page(s)",
                }
            )
        for page in pages:
            info = self.pages[page]
            out.append(
                {
                    "path": "/" + page,
                    "kind": "page",
                    "title": info.get("title") or posixpath.basename(page),
                    "summary": info.get("summary") or "",
                }
            )
        return out
