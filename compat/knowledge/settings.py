"""Validated shapes of the knowledge configuration and of a knowledge turn's extra params.

YAML and wire keys are camelCase, Python names snake_case. Configuration models forbid unknown
keys (a typo is reported by name); the turn params model ignores the many other params a client
sends with ``session.start``.

Sources: the issue "knowledge provider" (config keys ``knowledge:``, ``knowledgeSources:``) and
llmwiki-agent-bridge's retrieval intent (shared/reference/knowledge-sources.md §2.6).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

SourceProtocol = Literal["llmwiki-http", "mcp", "a2a", "local-wiki"]
REMOTE_PROTOCOLS = ("llmwiki-http", "mcp", "a2a")
OrchestrationMode = Literal["evidence-only", "delegated-runtime", "hybrid"]
SearchMode = Literal["lexical", "literal", "vector", "hybrid"]
SOURCE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
RETRIEVAL_SCHEMA = "llmwiki.retrieval.v1"
DEFAULT_DOCS_ROOT = Path(__file__).resolve().parent / "default_docs"
DEFAULT_DOCS_ID = "bridge-docs"


class _Config(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class SourceDescriptor(_Config):
    """One knowledge source: ``{id, label, protocol, url | root, capabilities?, enabled}``.

    ``url`` is required for the remote protocols (for ``mcp`` it is the full MCP endpoint, e.g.
    llmwiki-serve's ``/mcp/stream``); ``root`` (a folder of Markdown) for ``local-wiki``.
    ``capabilities`` are the operator's claim, used only when the source cannot be asked.
    """

    id: str = Field(pattern=SOURCE_ID_PATTERN)
    label: str = Field("", max_length=160)
    protocol: SourceProtocol
    url: str | None = Field(None, max_length=2048)
    root: str | None = Field(None, max_length=4096)
    capabilities: tuple[str, ...] = Field((), max_length=64)
    enabled: bool = True

    @model_validator(mode="after")
    def _location(self) -> SourceDescriptor:
        if self.protocol == "local-wiki" and not self.root:
            raise ValueError("a local-wiki source needs root")
        if self.protocol != "local-wiki" and not self.url:
            raise ValueError(f"a {self.protocol} source needs url")
        return self

    @property
    def name(self) -> str:
        return self.label or self.id


class RuntimeSettings(_Config):
    """``knowledge.runtime``: the OpenAI-compatible model used by delegated and hybrid turns.

    ``base_url`` includes the API prefix (``http://127.0.0.1:8642/v1``); ``api_key_env`` names
    the environment variable holding the key (the key itself never sits in the file).
    """

    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    timeout_seconds: float = Field(60.0, gt=0)

    @property
    def configured(self) -> bool:
        return bool(self.base_url and self.model)


class RequestSourcesPolicy(_Config):
    """``knowledge.requestSources``: whether ``session.start`` may bring its own sources."""

    enabled: bool = False
    protocols: tuple[SourceProtocol, ...] = REMOTE_PROTOCOLS
    allowed_origins: tuple[str, ...] = ()


class KnowledgeSettings(_Config):
    """``knowledge:``. Times are seconds; ``fan_out`` is the number of sources asked at once."""

    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)
    fan_out: int = Field(4, ge=1, le=32)
    source_timeout_seconds: float = Field(10.0, gt=0)
    budget_seconds: float = Field(30.0, gt=0)
    capability_ttl_seconds: float = Field(30.0, ge=0)
    request_sources: RequestSourcesPolicy = Field(default_factory=RequestSourcesPolicy)


def default_sources() -> list[SourceDescriptor]:
    """The embedded default: the bridge's own documentation as a ``local-wiki`` source."""
    return [SourceDescriptor(id=DEFAULT_DOCS_ID, label="xworkmate-bridge docs", protocol="local-wiki",
                             root=str(DEFAULT_DOCS_ROOT))]  # fmt: skip


# ---- retrieval intent (llmwiki.retrieval.v1) -----------------------------------------------------


class SearchOptions(_Config):
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


class RetrievalIntent(_Config):
    """``retrieval`` param: ``{schemaVersion, searchMode, fallback, search}`` (§2.6)."""

    schema_version: Literal["llmwiki.retrieval.v1"]
    search_mode: SearchMode = "lexical"
    fallback: Literal["lexical", "none"] = "lexical"
    search: SearchOptions = Field(default_factory=SearchOptions)


class KnowledgeTurnParams(BaseModel):
    """The knowledge-specific params of ``session.start`` / ``session.message`` (others ignored).

    ``knowledge_sources`` is None when absent (use the configured sources) and ``[]`` when the
    client explicitly asks for no source.
    """

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True,
                              defer_build=True)

    orchestration_mode: OrchestrationMode | None = None
    retrieval: RetrievalIntent | None = None
    knowledge_sources: list[dict[str, Any]] | None = Field(None, max_length=32)


class _MethodParams(BaseModel):
    """Method params: unknown keys are ignored (docs/api.md, "Envelope")."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True,
                              defer_build=True)


class ReadParams(_MethodParams):
    """``knowledge.read {sourceId, path}``; ``path`` is ``/``-rooted (default the root)."""

    source_id: str = Field(pattern=SOURCE_ID_PATTERN)
    path: str = Field("/", max_length=2048)


class SourcesParams(_MethodParams):
    """``knowledge.sources {probe?}``: ``probe`` asks each source (cached briefly)."""

    probe: bool = True
