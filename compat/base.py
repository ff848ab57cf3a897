"""The one Protocol every provider adapter implements, and the events a turn produces.

An adapter (one per provider family: ACP agents, exec profiles, knowledge sources, the OpenClaw
gateway) turns a provider into *provider sessions*. The orchestrator owns one provider session per
bridge session and runs one turn at a time on it, in one task under one cancel scope. A turn
reports progress by calling its ``TurnSink`` with the event structs below; the orchestrator maps
them to the contract's ``session.update`` notifications (docs/api.md, "Update stream"),
accumulates the output text, and enforces output limits. Adapters never build wire envelopes.

How a turn ends is the orchestrator's (``orchestrator.machine``): it bounds the turn with
``turnTimeout``, asks for a graceful stop with ``ProviderSession.request_cancel``, and cuts the
turn off by cancelling its scope when the provider has no graceful stop or ``cancelGrace`` ran out;
a provider cleans up what it started for the turn when it is cut off.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

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
    """Anything else worth showing: ``event`` is the raw kind (e.g. an unknown ACP update kind)."""

    event: str
    message: str = ""
    data: dict[str, Any] | None = None


class SessionStateEvent(msgspec.Struct, frozen=True):
    """The provider session's own state changed (ACP ``available_commands_update``,
    ``current_mode_update``, ``config_option_update``, ``session_info_update``): ``kind`` and the
    update's fields. The orchestrator keeps the latest of each kind as the session's state, whenever
    it arrives; during a turn it is also streamed as a ``status`` update."""

    kind: str
    data: dict[str, Any] | None = None


class WaitingEvent(msgspec.Struct, frozen=True):
    """The provider waits for something before it can start (``reason``: ``capacity``, a free
    agent slot); an empty ``reason`` ends the wait. The orchestrator reports it in ``waiting``
    status updates."""

    reason: str


TurnEvent = (
    TextDelta
    | ThoughtDelta
    | ToolCallEvent
    | PlanEvent
    | UsageEvent
    | PermissionEvent
    | StatusEvent
    | SessionStateEvent
    | WaitingEvent
)


class TurnSink(Protocol):
    """Where a turn reports. Calls never block on clients (bounded queues downstream).

    A sink outlives its turn: what a provider reports after the turn's result (an agent's chunk
    written behind its answer) still reaches it, and is forwarded as part of that turn.
    """

    def begin(self) -> None:
        """The provider began the turn's work (ACP: the prompt was sent; a profile: its process
        runs). Before it, a cancel cuts the turn off at once."""
        ...

    def emit(self, event: TurnEvent) -> None: ...

    async def ask_permission(self, tool_call: dict[str, Any], options: list[dict[str, Any]]) -> str | None:
        """Forward a permission request to the client (policy ``ask``).

        Returns:
            The chosen ``optionId``, or None when the request timed out, was cancelled, or the
            turn stopped running; the adapter then answers the agent ``cancelled`` / rejects.
        """
        ...


# ---- turn input and outcome ---------------------------------------------------------------------


class Attachment(msgspec.Struct, frozen=True):
    name: str
    path: str  # absolute, resolved, inside a workspace root
    description: str = ""


class ClientLink(Protocol):
    """The ACP client behind a turn, in editor mode (docs/api.md "Editor mode"): what it lets the
    provider agent use, and the way to ask it."""

    @property
    def capabilities(self) -> dict[str, Any]:
        """ACP ``clientCapabilities`` to advertise to the agent: ``{fs: {readTextFile,
        writeTextFile}, terminal}``."""
        ...

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        """Relay an agent's ``fs/*`` or ``terminal/*`` request to the client (its ``sessionId``
        becomes the client's); the client's result comes back unchanged.

        Raises:
            compat.peer.ResponseError: the client's error, or -32603 when it is gone.
        """
        ...


CLIENT_METHODS: dict[str, tuple[str, ...]] = {
    "fs/read_text_file": ("fs", "readTextFile"),
    "fs/write_text_file": ("fs", "writeTextFile"),
    "terminal/create": ("terminal",),
    "terminal/output": ("terminal",),
    "terminal/release": ("terminal",),
    "terminal/wait_for_exit": ("terminal",),
    "terminal/kill": ("terminal",),
}
"""The ACP client methods a provider agent may call through a :class:`ClientLink`, and the
capability (a path in ``clientCapabilities``) each needs."""


def offers(capabilities: dict[str, Any], method: str) -> bool:
    """Whether ``capabilities`` (ACP ``clientCapabilities``) include what ``method`` needs."""
    value: Any = capabilities
    for key in CLIENT_METHODS.get(method, ("-",)):
        value = value.get(key) if isinstance(value, dict) else None
    return value is True


class TurnRequest(msgspec.Struct, frozen=True):
    """One turn's input, already validated by the orchestrator.

    ``content``, ``mcp_servers``, ``client`` and ``config_options`` come from an ACP editor
    (editor mode): its prompt as ACP content blocks (``prompt`` is the same as text), its
    ``mcpServers``, the link that relays the agent's ``fs/*`` and ``terminal/*`` requests to it,
    and the values it chose for the agent's own config options (mode, thought level; the model
    is ``model``).
    """

    session_id: str
    thread_id: str
    turn_id: str
    prompt: str
    working_directory: str
    model: str | None = None
    attachments: tuple[Attachment, ...] = ()
    principal: str = "local"  # the authenticated token's name
    extra: dict[str, Any] = msgspec.field(default_factory=dict)  # provider-family params (later issues)
    content: tuple[dict[str, Any], ...] = ()
    mcp_servers: tuple[dict[str, Any], ...] = ()
    client: ClientLink | None = None
    config_options: dict[str, str] = msgspec.field(default_factory=dict)  # the agent's, by id: value
    fallback_prompt: str | None = None
    """The prompt with the stored conversation before it, for a provider asked to resume its own
    session (``Resumable.resume``) that could not: it sends this instead (and says so)."""

    def text_prompt(self) -> str:
        """The prompt for a provider that takes text only (exec profiles): the attachments, which
        ACP agents get as ``resource_link`` blocks, follow as a note with their paths."""
        if not self.attachments:
            return self.prompt
        lines = [f"- {a.name}: {a.path}" + (f" ({a.description})" if a.description else "") for a in self.attachments]
        return self.prompt + "\n\nAttached files:\n" + "\n".join(lines)


class TurnError(msgspec.Struct, frozen=True):
    """A turn failure. ``code`` comes from the one table in docs/api.md (``AGENT_EXITED`` …)."""

    code: str
    message: str
    data: dict[str, Any] | None = None


class TurnOutcome(msgspec.Struct, frozen=True):
    """How a provider's turn ended, as the provider saw it; the orchestrator decides the turn's
    final status from it and from what happened to the turn meanwhile (cancel, limits)."""

    status: TurnStatus
    stop_reason: str | None = None
    error: TurnError | None = None
    usage: dict[str, Any] | None = None
    upstream_session_id: str | None = None
    resolved_model: str | None = None
    context_reset: bool = False
    context_restored: str | None = None  # how a stored conversation was continued: ``session/load`` or ``history``
    artifacts: list[dict[str, Any]] | None = None  # the result's ``artifacts`` (knowledge turns)
    run_id: str | None = None  # the result's ``runId`` (gateway turns)
    mode: str | None = None  # the result's ``mode`` (``gateway-chat``)


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

    @property
    def upstream_session_id(self) -> str | None:
        """The provider's own id for this conversation (ACP session id, a profile's session)."""
        ...

    async def run_turn(self, request: TurnRequest, sink: TurnSink) -> TurnOutcome:
        """Run one turn to its end. Never raises for provider failures: they are outcomes.

        When the caller's scope is cancelled (the turn is cut off), end what the turn started
        (bounded, shielded) and let the cancellation propagate.
        """
        ...

    def request_cancel(self) -> bool:
        """Ask the running turn to stop gracefully (ACP: ``session/cancel``); never blocks.

        Returns:
            True when a graceful stop was asked for: ``run_turn`` should return (``cancelled``)
            within ``cancelGrace`` seconds, after which it is cut off. False when the provider has
            no graceful stop right now: the turn is cut off at once.
        """
        ...

    async def aclose(self) -> None:
        """End the provider session and its processes. Bounded in time; idempotent."""
        ...


@runtime_checkable
class Resumable(Protocol):
    """A provider session that can take up its own earlier session after a bridge restart (an
    ACP agent that advertises ``loadSession``: docs/api.md "Restarts")."""

    def resume(self, upstream_session_id: str, working_directory: str) -> bool:
        """Continue ``upstream_session_id`` on the next turn instead of starting afresh; True
        when it will try (the turn then uses ``TurnRequest.fallback_prompt`` if the agent
        cannot load it, and reports which in ``TurnOutcome.context_restored``)."""
        ...


@runtime_checkable
class KeepsHistory(Protocol):
    """A provider session that keeps the conversation itself, as structured history (the
    knowledge provider asks its sources the message alone and gives the runtime the history):
    after a restart it is handed the stored conversation instead of text before the message."""

    def restore_history(self, history: Sequence[tuple[str, str]]) -> None:
        """Take ``history`` (``(role, text)``, role ``user`` or ``assistant``, oldest first) as
        the conversation so far."""
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

    async def preflight(self, params: dict[str, Any]) -> None:
        """Refuse a turn whose provider-family params cannot run, before the turn exists.

        Args:
            params: the turn params that are not core fields (``TurnParams.extra_params()``).

        Raises:
            bridge.rpc.errors.InvalidParams: -32602 (e.g. ``RETRIEVAL_MODE_UNSUPPORTED``).
        """
        ...

    async def aclose(self) -> None: ...


AdapterFactory = Callable[[str, ProviderConfig, Limits, Timeouts], ProviderAdapter]
