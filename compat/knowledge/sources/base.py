"""The one Protocol every knowledge source implements, and the values sources exchange.

A source answers in llmwiki-serve's shapes (shared/reference/knowledge-sources.md §1): a context
pack ``{wiki_title, orientation, evidence, limitations, graph{nodes, edges}, …}`` for
``context``, ``[{page_id, title, path, score, snippet, …}]`` for ``search``, a page
``{id, title, path, text, summary, frontmatter, links, …}`` for ``read_page`` and
``{nodes, edges}`` for the graph calls. The engine and the service only ever see these shapes.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import msgspec

from compat.knowledge.errors import SourceError
from compat.knowledge.evidence import bundle_from
from compat.knowledge.settings import SourceDescriptor

MAX_RESPONSE_BYTES = 8 * 1024 * 1024
RETRIEVAL_V1 = "llmwiki_retrieval_v1"
GUIDED_LEXICAL_V1 = "llmwiki_agent_guided_lexical_v1"
MODE_PREFIX = "llmwiki_search_mode_"
KNOWN_CAPABILITIES = frozenset(
    {RETRIEVAL_V1, GUIDED_LEXICAL_V1} | {MODE_PREFIX + m for m in ("lexical", "literal", "vector", "hybrid")}
)
PAGE_LIST_LIMIT = 2000


class Capabilities(msgspec.Struct, frozen=True):
    """What a source advertises. ``origin``: ``fresh`` (asked now), ``descriptor``, ``none``."""

    values: frozenset[str] = frozenset()
    origin: Literal["fresh", "descriptor", "none"] = "none"
    bundle: dict[str, Any] | None = None  # the source bundle read during discovery, if any
    error: SourceError | None = None  # why fresh discovery failed
    bundle_view: dict[str, Any] | None = None
    """The bundle's allowlisted view for artifacts (``compat.knowledge.evidence.bundle_from``),
    made once per discovery, not per turn: a bundle lists every source ref (2,000 in bench case
    7, 1.1 ms of a turn over 4 sources to sift). Read-only: every turn until the next discovery
    shares it."""

    def has(self, capability: str) -> bool:
        """Exact, case-sensitive membership."""
        return capability in self.values


class RoutedRetrieval(msgspec.Struct, frozen=True):
    """The retrieval a source receives after gating. ``mode`` None = plain lexical request."""

    mode: str | None = None
    limit: int = 8
    snippet_chars: int | None = None
    fields: tuple[str, ...] | None = None
    exclude_page_ids: tuple[str, ...] = ()
    query_variants: tuple[str, ...] = ()
    fallback_diagnostic: dict[str, Any] | None = None

    def llmwiki_body(self, query: str) -> dict[str, Any]:
        """The llmwiki-serve ``/query``/``/search`` body (snake_case, §1.7)."""
        body: dict[str, Any] = {"query": query, "limit": self.limit}
        if self.mode is None:
            return body
        body["mode"] = self.mode
        optional = {
            "snippet_chars": self.snippet_chars,
            "fields": list(self.fields) if self.fields else None,
            "exclude_page_ids": list(self.exclude_page_ids) or None,
            "query_variants": list(self.query_variants) or None,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        return body

    def intent(self) -> dict[str, Any] | None:
        """The camelCase ``llmwiki.retrieval.v1`` intent (for A2A agents), or None when plain."""
        if self.mode is None:
            return None
        search: dict[str, Any] = {"limit": self.limit}
        if self.snippet_chars:
            search["snippetChars"] = self.snippet_chars
        if self.fields:
            search["fields"] = list(self.fields)
        if self.exclude_page_ids:
            search["excludePageIds"] = list(self.exclude_page_ids)
        if self.query_variants:
            search["queryVariants"] = list(self.query_variants)
        return {
            "schemaVersion": "llmwiki.retrieval.v1",
            "searchMode": self.mode,
            "fallback": "lexical",
            "search": search,
        }


class KnowledgeSource(Protocol):
    """A knowledge source. Every call is bounded by the source's timeout and raises
    ``SourceError`` (``SourceUnsupported`` for an operation the protocol lacks)."""

    descriptor: SourceDescriptor

    async def discover(self) -> Capabilities:
        """Ask the source what it advertises (uncached; the service caches)."""
        ...

    async def context(self, question: str, routed: RoutedRetrieval) -> dict[str, Any]:
        """A context pack for ``question``."""
        ...

    async def search(self, query: str, routed: RoutedRetrieval) -> list[dict[str, Any]]: ...

    async def read_page(self, page_id: str, options: dict[str, Any]) -> dict[str, Any] | None:
        """A page, or None when unknown or withheld. ``options``: ``query, sections, max_chars, fields``."""
        ...

    async def graph(self, limit: int) -> dict[str, Any]: ...

    async def neighbors(self, seeds: list[str], depth: int, direction: str, limit: int) -> dict[str, Any]: ...

    async def source_bundle(self) -> dict[str, Any] | None: ...

    async def pages(self) -> tuple[list[dict[str, Any]], bool]:
        """Every page ``{id, title, summary}`` (summary may be empty) and whether the list was cut."""
        ...

    async def aclose(self) -> None: ...


def capabilities_from(strings: Any, descriptor: SourceDescriptor, bundle: dict[str, Any] | None) -> Capabilities:
    """Fresh capabilities from a list of strings read from the source, with the bundle's view:
    every source makes its fresh capabilities here."""
    values = frozenset(s.strip() for s in strings if isinstance(s, str)) if isinstance(strings, list) else frozenset()
    view = bundle_from(descriptor.id, bundle) if isinstance(bundle, dict) else None
    return Capabilities(values, "fresh", bundle, bundle_view=view)


def fallback_capabilities(descriptor: SourceDescriptor, error: SourceError | None) -> Capabilities:
    """When the source cannot be asked: the descriptor's claim, if any."""
    if descriptor.capabilities:
        return Capabilities(frozenset(descriptor.capabilities), "descriptor", None, error)
    return Capabilities(frozenset(), "none", None, error)
