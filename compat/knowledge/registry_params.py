"""Params of ``knowledge.sources.add|update|remove|select`` (pydantic, like the other method
params: a failure is -32602 with ``data.errors``). A source itself is validated by the registry
as a ``SourceDescriptor`` (``compat.knowledge.registry``), the same shape as ``knowledgeSources:``.

Imported when a request first needs them, not at start (see compat.settings for why).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from compat.knowledge.settings import SOURCE_ID_PATTERN


class _MethodParams(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True, defer_build=True
    )


class SourceAddParams(_MethodParams):
    """``{source: {id, label?, protocol, url | root, capabilities?, enabled?}, probe?: true}``;
    ``probe`` asks the new source what it can do and returns it as ``source.status``."""

    source: dict[str, Any]
    probe: bool = True


class SourceUpdateParams(_MethodParams):
    """``{sourceId, source: {fields to change}, probe?: true}``; the id cannot change."""

    source_id: str = Field(pattern=SOURCE_ID_PATTERN)
    source: dict[str, Any] = Field(default_factory=dict)
    probe: bool = True


class SourceRemoveParams(_MethodParams):
    source_id: str = Field(pattern=SOURCE_ID_PATTERN)


class RuntimeParams(BaseModel):
    """``{baseUrl, model, apiKey?, timeoutSeconds?}``. ``apiKey`` absent keeps the stored key
    while the base URL's origin stays the same; ``""`` removes it."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True, defer_build=True
    )

    base_url: str = Field(min_length=1, max_length=2048)
    model: str = Field(min_length=1, max_length=200)
    api_key: str | None = Field(None, max_length=4096)
    timeout_seconds: float | None = Field(None, gt=0, le=3600)


class SourceSelectParams(_MethodParams):
    """``{sourceIds?, runtime?}``: the registered sources turns use (the others are disabled),
    and the runtime connection (``null`` removes it). ``{}`` changes nothing and returns the
    registry."""

    source_ids: list[str] | None = Field(None, max_length=64)
    runtime: RuntimeParams | None = None

    @property
    def runtime_given(self) -> bool:
        return "runtime" in self.model_fields_set
