"""Validated shapes of ``llm:`` (model runtimes for one-shot calls) and ``principals:`` (what
each principal may ask for).

YAML keys are camelCase, Python names snake_case; unknown keys are errors. msgspec structs
validated with :func:`compat.settings.convert`, like the rest of the configuration.

Source: the issue "One-shot model calls for clients" (docs/api.md "Model calls", "Principals").

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from compat.settings import FieldInvalid, Seconds, Settings

RuntimeKind = Literal["openai", "anthropic"]
RUNTIME_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
KNOWLEDGE_RUNTIME_ID = "knowledge"
"""The id of the entry the ``knowledge.runtime`` shorthand defines."""
ANY: Literal["*"] = "*"

AllowList = tuple[Annotated[str, msgspec.Meta(min_length=1, max_length=200)], ...] | Literal["*"]
"""A list of names, or ``"*"`` for any."""


class ModelRuntime(Settings, frozen=True):
    """One ``llm.runtimes`` entry.

    Attributes:
        id: how clients and ``llm.fallback`` / ``llm.vision`` name it (the ``provider`` argument).
        kind: ``openai`` (OpenAI-compatible ``/chat/completions``) or ``anthropic`` (the Messages
            API, ``/v1/messages``).
        base_url: the API root, including its prefix (``https://api.openai.com/v1``,
            ``https://api.anthropic.com``).
        model: the model it calls unless a permitted client names another.
        api_key_env: the environment variable holding the API key (the key never sits in the file).
        images: whether the model takes image input (base64 data).
        image_urls: whether the runtime may be handed an image ``url`` to fetch itself (the bridge
            never fetches one).
        json_mode: whether the runtime has a JSON mode (``response_format``); without one, JSON is
            asked for in the prompt. Default: true for ``openai``, false for ``anthropic``.
        max_tokens: the largest ``maxTokens`` it is asked for (a request's is capped to it).
        timeout_seconds: its call timeout when the request names none (else ``llm.timeoutSeconds``).
        default: the runtime calls use when they name none (else the first entry).
    """

    id: Annotated[str, msgspec.Meta(pattern=RUNTIME_ID_PATTERN)]
    base_url: Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]
    model: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    kind: RuntimeKind = "openai"
    api_key_env: str | None = None
    images: bool = False
    image_urls: bool = False
    json_mode: bool | None = None
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 4096
    timeout_seconds: Seconds | None = None
    default: bool = False

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise FieldInvalid("baseUrl", "must be an http(s) URL")

    @property
    def has_json_mode(self) -> bool:
        return self.json_mode if self.json_mode is not None else self.kind == "openai"


class Price(Settings, frozen=True):
    """A ``llm.prices`` entry: what one million tokens of a model cost, in ``currency``."""

    input_per_million: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    output_per_million: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    cached_read_per_million: Annotated[float, msgspec.Meta(ge=0)] | None = None
    currency: Annotated[str, msgspec.Meta(min_length=1, max_length=8)] = "USD"


class LlmSettings(Settings, frozen=True):
    """``llm:``. Times are seconds.

    Attributes:
        runtimes: the model runtimes (one place: ``knowledge.runtime`` refers to one of them).
        fallback: runtime ids tried in order after the chosen one fails with HTTP 5xx, 429 or a
            connection failure.
        vision: the runtime image input goes to when the chosen one takes no images.
        max_attempts: runtimes tried per call at most (the chosen one included).
        timeout_seconds: a call's timeout when neither the request nor its runtime names one.
        max_timeout_seconds: the largest ``timeout`` a request may ask for.
        calls_per_minute: calls one principal may make per minute (then -32006).
        max_concurrent_calls: calls in flight at once, bridge-wide (more wait, within their
            timeout).
        prices: per-model prices, for ``usage.cost`` when a runtime reports none.
    """

    runtimes: tuple[ModelRuntime, ...] = ()
    fallback: tuple[str, ...] = ()
    vision: str | None = None
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=8)] = 3
    timeout_seconds: Seconds = 60.0
    max_timeout_seconds: Seconds = 300.0
    calls_per_minute: Annotated[int, msgspec.Meta(ge=1)] = 120
    max_concurrent_calls: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 16
    prices: dict[str, Price] = {}

    def __post_init__(self) -> None:
        ids = [r.id for r in self.runtimes]
        if twice := next((i for i in ids if ids.count(i) > 1), None):
            raise FieldInvalid("runtimes", f"two runtimes have the id {twice!r}")
        if sum(r.default for r in self.runtimes) > 1:
            raise FieldInvalid("runtimes", "only one runtime may be marked default")
        for index, name in enumerate(self.fallback):
            if name not in ids:
                raise FieldInvalid(f"fallback.{index}", f"no runtime has the id {name!r}")
        if self.vision is not None and self.vision not in ids:
            raise FieldInvalid("vision", f"no runtime has the id {self.vision!r}")

    def runtime(self, runtime_id: str) -> ModelRuntime | None:
        return next((r for r in self.runtimes if r.id == runtime_id), None)

    @property
    def default_runtime(self) -> ModelRuntime | None:
        """The entry marked ``default``, else the first; None when there is none."""
        return next((r for r in self.runtimes if r.default), self.runtimes[0] if self.runtimes else None)


class LlmGrant(Settings, frozen=True):
    """``principals.<name>.llm``: what the principal may ask ``llm.*`` for.

    Fail closed: by default only the default runtime and its model. ``allow_provider_override``
    lets it name another runtime (any, or those in ``allowed_providers``); ``allow_model_override``
    another model (any, or those in ``allowed_models``, matched literally). Each is separate.
    """

    enabled: bool = True
    allow_provider_override: bool = False
    allowed_providers: AllowList = ANY
    allow_model_override: bool = False
    allowed_models: AllowList = ANY


class TurnGrant(Settings, frozen=True):
    """``principals.<name>.turns``: which providers and models its ``session.*`` turns may use.
    Open by default (every provider, any model); a key left out keeps its default."""

    allowed_providers: AllowList = ANY
    allow_model_override: bool = True
    allowed_models: AllowList = ANY


class PrincipalSettings(Settings, frozen=True):
    """One ``principals`` entry (the name of an ``authTokens`` entry, or ``local``)."""

    llm: LlmGrant = msgspec.field(default_factory=LlmGrant)
    turns: TurnGrant = msgspec.field(default_factory=TurnGrant)


def allows(allow_list: AllowList, name: str) -> bool:
    """Whether ``name`` is on ``allow_list`` (``"*"``: everything)."""
    return allow_list == ANY or name in allow_list
