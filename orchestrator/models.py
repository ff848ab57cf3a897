"""Validated params of the session methods (docs/api.md "Methods").

Params a method does not know are ignored (the app sends many: ``mode``, ``provider``,
``selectedSkills``, ``metadata``, …); ``params: null`` means absent. A validation failure becomes
-32602 with the field locations (compat.params.invalid_params).

pydantic, imported with the first request that needs a params model (``bridge.methods``), not at
start: it was ~60 ms of the bridge's cold start (bench case 6). Every model defers building its
validator to first use (``defer_build``). The result models are ``orchestrator.results``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel


class _Params(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True, defer_build=True
    )


class AttachmentParam(_Params):
    """An ``attachments`` entry: the file's path on the client's machine ("" when it has none)."""

    name: str = Field("", max_length=1024)
    path: str = Field("", max_length=4096)
    description: str = Field("", max_length=4096)


class InlineAttachmentParam(_Params):
    """An ``inlineAttachments`` entry: the bytes of an attachment, for a bridge that cannot read
    its path (``content``: base64, or a data URL)."""

    name: str = Field("", max_length=1024)
    mime_type: str = Field("", max_length=256)
    content: str
    size_bytes: int | None = Field(None, ge=0)
    sha256: str | None = Field(None, max_length=128)
    source_path: str | None = Field(None, max_length=4096)


class SessionRef(_Params):
    session_id: str = Field(min_length=1, max_length=512)


class SubscribeParams(SessionRef):
    """``session.subscribe``: replay the logged updates after ``afterSeq`` (absent: none, only
    live ones; an SSE ``Last-Event-ID`` header of the same session stands in for it)."""

    after_seq: int | None = Field(None, ge=0, le=2**62)  # seq values fit SQLite's 64-bit integers


class ResultParams(SessionRef):
    """``session.result``: one turn's result; without ``turnId``, the session's latest turn's."""

    turn_id: str | None = Field(None, min_length=1, max_length=200)


class ListParams(_Params):
    """``session.list``: a page of the caller's sessions, newest first."""

    cursor: str | None = Field(None, max_length=1024)
    limit: int = Field(50, ge=1, le=200)


class _Preference(_Params):
    """The top-level provider preference the app sends when the user picked no provider in
    ``routing`` (older app builds sent it as ``gatewayProvider`` / ``gatewayProviderId``)."""

    provider: Any = None
    gateway_provider: Any = None
    gateway_provider_id: Any = None

    @property
    def preferred_provider(self) -> str:
        """The first of ``provider``, ``gatewayProvider``, ``gatewayProviderId`` that is a
        non-blank string ("" when none is); other types are ignored, as unknown params are."""
        for value in (self.provider, self.gateway_provider, self.gateway_provider_id):
            if isinstance(value, str) and value.strip():
                return value.strip()
        return ""


class TurnParams(_Preference):
    """``session.start`` / ``session.message``."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=True, defer_build=True
    )

    session_id: str = Field(min_length=1, max_length=512)
    thread_id: str | None = Field(None, max_length=512)
    task_prompt: str = Field(min_length=1)
    working_directory: str | None = Field(None, max_length=4096)
    routing: dict[str, Any] | None = None
    model: str | None = Field(None, max_length=200)
    attachments: list[AttachmentParam] = Field(default_factory=list, max_length=64)
    inline_attachments: list[InlineAttachmentParam] = Field(default_factory=list, max_length=64)
    return_artifacts: bool = False

    @field_validator("task_prompt")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("taskPrompt must not be blank")
        return value

    @field_validator("thread_id", "working_directory", "model", mode="before")
    @classmethod
    def _blank_is_absent(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    def extra_params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ResolveParams(_Preference):
    task_prompt: str = ""
    working_directory: str | None = None
    routing: dict[str, Any] | None = None
    model: str | None = None


class PermissionParams(_Params):
    session_id: str = Field(min_length=1)
    request_id: str = Field(min_length=1)
    option_id: str = Field(min_length=1)


class SystemLogsParams(_Params):
    """``system.logs``: how many of the latest lines (the app sends ``{}``)."""

    limit: int = Field(200, ge=1, le=500)


class GatewayParams(_Params):
    runtime_id: str = ""
    gateway_provider_id: str = ""
    method: str = ""
    params: dict[str, Any] | None = None
    timeout_ms: float | None = None
