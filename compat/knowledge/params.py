"""Validated shapes of a knowledge turn's extra params and of the ``knowledge.*`` methods' params
(pydantic, like the other method params: a failure is -32602 with ``data.errors``).

Imported when a request first needs them, not at start (see compat.settings for why).

Sources: llmwiki-agent-bridge's retrieval intent (shared/reference/knowledge-sources.md §2.6).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from compat.knowledge.settings import SOURCE_ID_PATTERN

OrchestrationMode = Literal["evidence-only", "delegated-runtime", "hybrid"]
SearchMode = Literal["lexical", "literal", "vector", "hybrid"]


class _Params(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True, defer_build=True
    )


class SearchOptions(_Params):
    limit: int | None = Field(None, ge=1, le=50)
    snippet_chars: int | None = Field(None, ge=1, le=20000)
    fields: tuple[str, ...] | None = Field(None, max_length=16)
    exclude_page_ids: tuple[str, ...] = Field((), max_length=50)
    query_variants: tuple[str, ...] = Field((), max_length=2)

    @field_validator("fields", "exclude_page_ids", "query_variants")
    @classmethod
    def _strings(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        cleaned = tuple(v.strip() for v in value)
        if any(not v or len(v) > 1000 for v in cleaned):
            raise ValueError("entries must be non-empty strings of at most 1000 characters")
        return cleaned


class RetrievalIntent(_Params):
    """``retrieval`` param: ``{schemaVersion, searchMode, fallback, search}`` (§2.6)."""

    schema_version: Literal["llmwiki.retrieval.v1"]
    search_mode: SearchMode = "lexical"
    fallback: Literal["lexical", "none"] = "lexical"
    search: SearchOptions = Field(default_factory=lambda: SearchOptions.model_validate({}))


class KnowledgeTurnParams(BaseModel):
    """The knowledge-specific params of ``session.start`` / ``session.message`` (others ignored).

    ``knowledge_sources`` is None when absent (use the configured sources) and ``[]`` when the
    client explicitly asks for no source.
    """

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True, defer_build=True
    )

    orchestration_mode: OrchestrationMode | None = None
    retrieval: RetrievalIntent | None = None
    knowledge_sources: list[dict[str, Any]] | None = Field(None, max_length=32)


class _MethodParams(BaseModel):
    """Method params: unknown keys are ignored (docs/api.md, "Envelope")."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True, defer_build=True
    )


class ReadParams(_MethodParams):
    """``knowledge.read {sourceId, path}``; ``path`` is ``/``-rooted (default the root)."""

    source_id: str = Field(pattern=SOURCE_ID_PATTERN)
    path: str = Field("/", max_length=2048)


class SourcesParams(_MethodParams):
    """``knowledge.sources {probe?}``: ``probe`` asks each source (cached briefly)."""

    probe: bool = True
