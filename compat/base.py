"""The one Protocol every provider adapter implements, and the events a turn produces.

An adapter (one per provider family: ACP agents, exec profiles, knowledge sources, the OpenClaw
gateway) turns a provider into *provider sessions*. The orchestrator owns one provider session per
bridge session and runs one turn at a time on it. A turn reports progress by calling its
``TurnSink`` with the event structs below; the orchestrator maps them to the contract's
``session.update`` notifications (docs/api.md, "Update stream"), accumulates the output text,
and enforces output limits. Adapters never build wire envelopes.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

import msgspec

from compat.settings import Limits, ProviderConfig, Timeouts

TurnStatus = Literal["completed", "failed", "cancelled", "timeout"]
ProbeStatus = Literal["ok", "not_found", "auth_required", "error"]


# ---- events a turn emits (in order) -------------------------------------------------------------


class TextDelta(msgspec.Struct, frozen=True):
    """Agent text. The concatenated deltas of a turn are its ``output``."""

    text: str


class ThoughtDelta(msgspec.Struct, frozen=True):
    """Agent reasoning text (not part of ``output``)."""

    text: str


class ToolCallEvent(msgspec.Struct, frozen=True):
    """A tool call's merged current state: ``toolCallId, title, kind, status, locations, content``.

    ``is_update`` is False for the first event of a tool call (``tool_call``) and True afterwards
    (``tool_call_update``).
    """

    tool_call: dict[str, Any]
    is_update: bool = False


class PlanEvent(msgspec.Struct, frozen=True):
    entries: list[dict[str, Any]]


class UsageEvent(msgspec.Struct, frozen=True):
    """``{inputTokens?, outputTokens?, totalTokens?, thoughtTokens?, cachedReadTokens?,
    cachedWriteTokens?, contextUsed?, contextSize?, cost?: {amount, currency}}``."""

    usage: dict[str, Any]


class PermissionEvent(msgspec.Struct, frozen=True):
    """The agent asks the client to choose; answered via ``TurnSink.ask_permission``'s future."""

    request_id: str
    tool_call: dict[str, Any]
    options: list[dict[str, Any]]


class StatusEvent(msgspec.Struct, frozen=True):
    """Anything else worth showing: ``event`` is the raw kind (e.g. an unmapped ACP update kind)."""

    event: str
    message: str = ""
    data: dict[str, Any] | None = None


TurnEvent = TextDelta | ThoughtDelta | ToolCallEvent | PlanEvent | UsageEvent | PermissionEvent | StatusEvent


class TurnSink(Protocol):
    """Where a running turn reports. Calls never block on clients (bounded queues downstream)."""

    def emit(self, event: TurnEvent) -> None: ...

    async def ask_permission(self, tool_call: dict[str, Any], options: list[dict[str, Any]]) -> str | None:
        """Forward a permission request to the client (policy ``ask``).

        Returns:
            The chosen ``optionId``, or None when the request timed out, was cancelled, or the
            turn ended; the adapter then answers the agent ``cancelled`` / rejects.
        """
        ...


# ---- turn input and outcome ---------------------------------------------------------------------


class Attachment(msgspec.Struct, frozen=True):
    name: str
    path: str  # absolute, resolved, inside a workspace root
    description: str = ""


class TurnRequest(msgspec.Struct, frozen=True):
    """One turn's input, already validated by the orchestrator."""

    session_id: str
    thread_id: str
    turn_id: str
    prompt: str
    working_directory: str
    model: str | None = None
    attachments: tuple[Attachment, ...] = ()
    principal: str = "local"  # the authenticated token's name
    extra: dict[str, Any] = msgspec.field(default_factory=dict)  # provider-family params (later issues)


class TurnError(msgspec.Struct, frozen=True):
    """A turn failure. ``code`` comes from the one table in docs/api.md (``AGENT_EXITED`` …)."""

    code: str
    message: str
    data: dict[str, Any] | None = None


class TurnOutcome(msgspec.Struct, frozen=True):
    status: TurnStatus
    stop_reason: str | None = None
    error: TurnError | None = None
    usage: dict[str, Any] | None = None
    upstream_session_id: str | None = None
    resolved_model: str | None = None
    context_reset: bool = False
    output_override: str | None = None  # for providers whose final answer differs from deltas
    extra: dict[str, Any] = msgspec.field(default_factory=dict)  # merged into the result (artifacts, …)


# ---- the adapter Protocol -----------------------------------------------------------------------


class ProbeResult(msgspec.Struct, frozen=True):
    status: ProbeStatus
    detail: str = ""

    @property
    def available(self) -> bool:
        return self.status == "ok"


class ProviderInfo(msgspec.Struct, frozen=True):
    provider_id: str
    label: str
    category: str  # "acp" | "profile" | "knowledge" | …
    targets: tuple[str, ...] = ("agent",)


class ProviderSession(Protocol):
    """One bridge session's state at a provider (e.g. one agent process and its ACP session)."""

    async def run_turn(self, request: TurnRequest, sink: TurnSink) -> TurnOutcome:
        """Run one turn to its end. Never raises for provider failures: they are outcomes."""
        ...

    async def cancel(self) -> None:
        """Ask the running turn to stop; ``run_turn`` returns ``cancelled`` within ``cancelGrace``
        plus the kill time."""
        ...

    async def aclose(self) -> None:
        """End the provider session and its processes. Bounded in time; idempotent."""
        ...


class ProviderAdapter(Protocol):
    info: ProviderInfo

    def probe_cheap(self) -> ProbeResult:
        """A fast check (the command resolves to an executable). No I/O beyond ``stat``."""
        ...

    async def probe_full(self) -> ProbeResult:
        """A real check (e.g. ACP ``initialize``), bounded by ``initializeTimeout``."""
        ...

    def open_session(self, session_id: str) -> ProviderSession:
        """A new provider session for bridge session ``session_id``; starts lazily on first turn."""
        ...

    async def aclose(self) -> None: ...


AdapterFactory = Callable[[str, ProviderConfig, Limits, Timeouts], ProviderAdapter]
