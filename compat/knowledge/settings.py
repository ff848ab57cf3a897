"""Validated shapes of the knowledge configuration (``knowledge:``, ``knowledgeSources:``).

YAML keys are camelCase, Python names snake_case; unknown keys are errors (a typo is reported by
name). These are msgspec structs validated with :func:`compat.settings.convert` (why not
pydantic: see compat.settings). A knowledge turn's params are in compat.knowledge.params.

Sources: the issue "knowledge provider" (config keys ``knowledge:``, ``knowledgeSources:``) and
llmwiki-agent-bridge's retrieval intent (shared/reference/knowledge-sources.md §2.6).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import msgspec

from compat.settings import FieldInvalid, Seconds, Settings

SourceProtocol = Literal["llmwiki-http", "mcp", "a2a", "local-wiki"]
REMOTE_PROTOCOLS = ("llmwiki-http", "mcp", "a2a")
SOURCE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
RETRIEVAL_SCHEMA = "llmwiki.retrieval.v1"
DEFAULT_DOCS_ROOT = Path(__file__).resolve().parent / "default_docs"
DEFAULT_DOCS_ID = "bridge-docs"


class SourceDescriptor(Settings, frozen=True):
    """One knowledge source: ``{id, label, protocol, url | root, capabilities?, enabled}``.

    ``url`` is required for the remote protocols (for ``mcp`` it is the full MCP endpoint, e.g.
    llmwiki-serve's ``/mcp/stream``); ``root`` (a folder of Markdown) for ``local-wiki``.
    ``capabilities`` are the operator's claim, used only when the source cannot be asked.
    """

    id: Annotated[str, msgspec.Meta(pattern=SOURCE_ID_PATTERN)]
    protocol: SourceProtocol
    label: Annotated[str, msgspec.Meta(max_length=160)] = ""
    url: Annotated[str, msgspec.Meta(max_length=2048)] | None = None
    root: Annotated[str, msgspec.Meta(max_length=4096)] | None = None
    capabilities: Annotated[tuple[str, ...], msgspec.Meta(max_length=64)] = ()
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.protocol == "local-wiki" and not self.root:
            raise FieldInvalid("root", "a local-wiki source needs root")
        if self.protocol != "local-wiki" and not self.url:
            raise FieldInvalid("url", f"a {self.protocol} source needs url")

    @property
    def name(self) -> str:
        return self.label or self.id


class RuntimeSettings(Settings, frozen=True):
    """``knowledge.runtime``: the OpenAI-compatible model used by delegated and hybrid turns.

    ``id`` names an ``llm.runtimes`` entry (an ``openai`` one), whose other fields the
    configuration copies here (bridge.config). The older shorthand, ``base_url`` (with the API
    prefix, ``http://127.0.0.1:8642/v1``), ``model`` and ``api_key_env`` (the environment variable
    holding the key; the key itself never sits in the file), defines the entry ``knowledge``.
    """

    id: str | None = None
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    timeout_seconds: Seconds = 60.0

    @property
    def configured(self) -> bool:
        return bool(self.base_url and self.model)


class RequestSourcesPolicy(Settings, frozen=True):
    """``knowledge.requestSources``: whether ``session.start`` may bring its own sources."""

    enabled: bool = False
    protocols: tuple[SourceProtocol, ...] = REMOTE_PROTOCOLS  # type: ignore[assignment]
    allowed_origins: tuple[str, ...] = ()


class KnowledgeSettings(Settings, frozen=True):
    """``knowledge:``. Times are seconds; ``fan_out`` is the number of sources asked at once.

    ``enabled: false`` turns the knowledge provider off: the embedded ``knowledge`` provider is
    not added (with or without a ``providers:`` key) and ``type: knowledge`` entries are listed
    but disabled (bridge.wiring.provider_configs).
    """

    enabled: bool = True
    runtime: RuntimeSettings = msgspec.field(default_factory=RuntimeSettings)
    fan_out: Annotated[int, msgspec.Meta(ge=1, le=32)] = 4
    source_timeout_seconds: Seconds = 10.0
    budget_seconds: Seconds = 30.0
    capability_ttl_seconds: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    request_sources: RequestSourcesPolicy = msgspec.field(default_factory=RequestSourcesPolicy)


def default_sources() -> list[SourceDescriptor]:
    """The embedded default: the bridge's own documentation as a ``local-wiki`` source."""
    return [
        SourceDescriptor(
            id=DEFAULT_DOCS_ID, label="xworkmate-bridge docs", protocol="local-wiki", root=str(DEFAULT_DOCS_ROOT)
        )
    ]
