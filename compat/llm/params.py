"""Validated params of ``llm.complete`` and ``llm.completeStructured`` (pydantic, like the other
method params: a failure is -32602 with ``data.errors``; unknown params are errors, so a typo such
as ``maxToken`` is named instead of ignored).

Imported when a request first needs them, not at start (see compat.settings for why).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

MAX_TEXT = 4 * 1024 * 1024
"""Characters of one text at most (the request's size is bounded by ``maxMessageBytes`` too)."""
_BASE64 = re.compile(r"^[A-Za-z0-9+/\r\n]*={0,2}\s*$")
_MIME = re.compile(r"^image/[A-Za-z0-9.+-]{1,64}$")


class _Params(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True, defer_build=True
    )


class TextPart(_Params):
    type: Literal["text"]
    text: str = Field(max_length=MAX_TEXT)


class ImageUrl(_Params):
    """An http(s) URL, or a ``data:image/<type>;base64,`` URL with base64 data (no ``file:``,
    internal schemes or other media types reach a runtime)."""

    url: str = Field(min_length=1, max_length=MAX_TEXT)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if value.startswith(("https://", "http://")):
            return value
        head, comma, data = value.partition(",")
        mime = head.removeprefix("data:").removesuffix(";base64")
        if (
            head.startswith("data:")
            and head.endswith(";base64")
            and comma
            and _MIME.match(mime)
            and _BASE64.match(data)
        ):
            return value
        raise ValueError("url must be an http(s) URL or a data:image/…;base64, URL")


class ImageUrlPart(_Params):
    """An OpenAI ``image_url`` content part: a ``data:image/…;base64,`` URL or a remote one."""

    type: Literal["image_url"]
    image_url: ImageUrl = Field(alias="image_url")


class ChatMessage(_Params):
    """One message in the OpenAI chat shape."""

    role: Literal["system", "user", "assistant"]
    content: str | list[Annotated[TextPart | ImageUrlPart, Field(discriminator="type")]] = Field(max_length=MAX_TEXT)


class _Call(_Params):
    """The arguments both methods take. ``timeout`` is seconds."""

    provider: str | None = Field(None, min_length=1, max_length=200)
    model: str | None = Field(None, min_length=1, max_length=200)
    temperature: float | None = Field(None, ge=0, le=2)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    timeout: float | None = Field(None, gt=0, le=86_400)
    purpose: str | None = Field(None, max_length=200)


class CompleteParams(_Call):
    """``llm.complete {messages, provider?, model?, temperature?, maxTokens?, timeout?, purpose?}``."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=512)

    @model_validator(mode="after")
    def _not_empty(self) -> CompleteParams:
        if not any(m.role == "user" and _has_content(m.content) for m in self.messages):
            raise ValueError("messages has no user message with content")
        return self


def _has_content(content: Any) -> bool:
    if isinstance(content, str):
        return bool(content.strip())
    return any(isinstance(p, ImageUrlPart) or p.text.strip() for p in content)


class TextBlock(_Params):
    type: Literal["text"]
    text: str = Field(max_length=MAX_TEXT)


class ImageBlock(_Params):
    """``{type: "image", data (base64) | url, mimeType}``; the bridge never fetches ``url``."""

    type: Literal["image"]
    data: str | None = Field(None, min_length=1, max_length=MAX_TEXT)
    url: str | None = Field(None, min_length=1, max_length=8192)
    mime_type: str = Field("image/png")

    @field_validator("mime_type")
    @classmethod
    def _mime(cls, value: str) -> str:
        if not _MIME.match(value):
            raise ValueError("mimeType must be an image type such as image/png")
        return value

    @field_validator("data")
    @classmethod
    def _base64(cls, value: str | None) -> str | None:
        if value is not None and not _BASE64.match(value):
            raise ValueError("data must be base64")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("https://", "http://")):
            raise ValueError("url must be an http(s) URL")
        return value

    @model_validator(mode="after")
    def _one(self) -> ImageBlock:
        if (self.data is None) == (self.url is None):
            raise ValueError("an image block has either data or url")
        return self


class StructuredParams(_Call):
    """``llm.completeStructured {instructions, input, jsonSchema?, jsonMode?, schemaName?,
    systemPrompt?, …}``."""

    instructions: str = Field(min_length=1, max_length=MAX_TEXT)
    input: list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]] = Field(max_length=256)
    json_schema: dict[str, Any] | None = None
    json_mode: bool = False
    schema_name: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    system_prompt: str | None = Field(None, max_length=MAX_TEXT)

    @model_validator(mode="after")
    def _not_empty(self) -> StructuredParams:
        if not self.instructions.strip():
            raise ValueError("instructions is empty")
        if not any(isinstance(b, ImageBlock) or b.text.strip() for b in self.input):
            raise ValueError("input is empty: give at least one text or image block")
        return self
