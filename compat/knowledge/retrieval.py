"""Retrieval-intent gating: which retrieval each selected source receives (§2.6).

A source receives an explicit search mode only when it advertises ``llmwiki_retrieval_v1`` and
``llmwiki_search_mode_<mode>`` (exact, case-sensitive); query variants only with
``llmwiki_agent_guided_lexical_v1``. Otherwise ``fallback: lexical`` sends the plain lexical
request and records a warning diagnostic, and ``fallback: none`` rejects the whole request with
-32602 ``RETRIEVAL_MODE_UNSUPPORTED`` before any query is sent.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from bridge.rpc.errors import InvalidParams
from compat.knowledge.diagnostics import retrieval_fallback
from compat.knowledge.errors import RetrievalModeUnsupported
from compat.knowledge.settings import SourceDescriptor
from compat.knowledge.sources.base import GUIDED_LEXICAL_V1, MODE_PREFIX, RETRIEVAL_V1, Capabilities, RoutedRetrieval

if TYPE_CHECKING:
    from compat.knowledge.params import RetrievalIntent

DEFAULT_LIMIT = 8


class Route(msgspec.Struct, frozen=True):
    """One source's retrieval after gating; ``missing`` names the capability it lacked."""

    routed: RoutedRetrieval
    missing: str | None = None
    diagnostic: dict[str, Any] | None = None


def check_intent(intent: RetrievalIntent | None) -> None:
    """Reject an intent that no source could honour: query variants with a non-lexical mode.

    Raises:
        RetrievalModeUnsupported: -32602, ``data.field`` ``retrieval.search.queryVariants``.
    """
    if intent is not None and intent.search.query_variants and intent.search_mode != "lexical":
        raise RetrievalModeUnsupported(
            f"retrieval.search.queryVariants is valid only when retrieval.searchMode is lexical "
            f"(got {intent.search_mode}).",
            field="retrieval.search.queryVariants",
            searchMode=intent.search_mode,
        )


def excluded_ids(intent: RetrievalIntent | None, source_id: str, selected: Sequence[str]) -> tuple[str, ...]:
    """``excludePageIds`` for one source: ``<sourceId>:<id>`` goes only to that source, unprefixed
    ids go to every source.

    Raises:
        InvalidParams: -32602 for a prefixed id whose prefix is not a selected source.
    """
    out: list[str] = []
    for raw in intent.search.exclude_page_ids if intent else ():
        prefix, sep, rest = raw.partition(":")
        if not sep:
            out.append(raw)
        elif prefix == source_id:
            out.append(rest)
        elif prefix not in selected:
            raise InvalidParams(
                f"retrieval.search.excludePageIds: {prefix!r} is not a selected source",
                field="retrieval.search.excludePageIds",
            )
    return tuple(out)


def route(
    intent: RetrievalIntent | None, caps: Capabilities, source: SourceDescriptor, excluded: tuple[str, ...] = ()
) -> Route:
    """The retrieval ``source`` receives, given what it advertises."""
    if intent is None:
        return Route(RoutedRetrieval(limit=DEFAULT_LIMIT))
    search, mode = intent.search, intent.search_mode
    full = RoutedRetrieval(
        mode, search.limit or DEFAULT_LIMIT, search.snippet_chars, search.fields, excluded, search.query_variants
    )
    missing, status = None, "matched"
    if not caps.has(RETRIEVAL_V1):
        missing, status = RETRIEVAL_V1, "missing_retrieval_v1"
    elif not caps.has(MODE_PREFIX + mode):
        missing, status = MODE_PREFIX + mode, "missing_search_mode"
    if missing is None:
        if not search.query_variants or caps.has(GUIDED_LEXICAL_V1):
            return Route(full)
        missing, status = GUIDED_LEXICAL_V1, "missing_guided_lexical_v1"
        routed = msgspec.structs.replace(full, query_variants=())
    else:
        routed = RoutedRetrieval(limit=search.limit or DEFAULT_LIMIT)
    if caps.origin == "none":
        status = "unknown"
    observations = {
        "requestedMode": mode,
        "appliedMode": routed.mode or "lexical",
        "fallback": intent.fallback,
        "capabilityMatched": missing == GUIDED_LEXICAL_V1,
        "capabilityStatus": status,
        "capabilityMetadataSource": caps.origin,
        "missingCapability": missing,
    }
    return Route(routed, missing, retrieval_fallback(source, observations))


def enforce(intent: RetrievalIntent | None, sources: Sequence[SourceDescriptor], routes: Sequence[Route]) -> None:
    """Apply ``fallback: none``: every source must take the intent as asked.

    Raises:
        RetrievalModeUnsupported: -32602 naming each source and the capability it lacks.
    """
    if intent is None or intent.fallback != "none":
        return
    lacking = [(s, r.missing) for s, r in zip(sources, routes, strict=False) if r.missing]
    if not lacking:
        return
    names = ", ".join(f"{s.id} ({s.protocol})" for s, _ in lacking)
    what = (
        f"Retrieval queryVariants require selected source(s) to advertise exact {GUIDED_LEXICAL_V1}"
        if all(m == GUIDED_LEXICAL_V1 for _, m in lacking)
        else f"Retrieval searchMode {intent.search_mode} is not supported by selected source(s)"
    )
    raise RetrievalModeUnsupported(
        f"{what}: {names}. Set fallback to lexical or choose sources that advertise the requested retrieval "
        "capability.",
        field="retrieval",
        searchMode=intent.search_mode,
        sources=[{"id": s.id, "protocol": s.protocol, "missingCapability": m} for s, m in lacking],
    )
