"""The result of every method, as typed models: one schema per result (docs/api.md "Methods"; the
docs test validates the document's examples with these, and ``bridge.methods`` names each method's
result model).

msgspec structs, not pydantic models: they are built on every call, and they import in a
millisecond (bench case 6). Python names are snake_case, wire names camelCase; a field set to
``UNSET`` is left out of the wire object.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``compat``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType


class Result(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """Base of the result models."""


# ---- acp.capabilities ------------------------------------------------------------------------------


class ProviderEntry(Result, frozen=True):
    provider_id: str
    label: str
    targets: list[str]
    category: str
    enabled: bool
    unavailable_reason: str | UnsetType = UNSET
    provider_display: dict[str, Any] | UnsetType = UNSET


class ProbeEntry(Result, frozen=True):
    provider_id: str
    available: bool
    status: str


class NestedCapabilities(Result, frozen=True):
    """The catalog again, as older app builds read it (two snake_case keys)."""

    single_agent: bool = msgspec.field(name="single_agent")
    multi_agent: bool = msgspec.field(name="multi_agent")
    provider_catalog: list[ProviderEntry]
    gateway_providers: list[ProviderEntry]
    available_execution_targets: list[str]


class BridgeInfo(Result, frozen=True):
    name: str
    version: str
    contract_version: str


class PrincipalAccess(Result, frozen=True):
    """What the caller may use (``principals.<name>``): its turns' providers and models, and
    ``llm``: ``{available, defaultProvider?, defaultModel?, providers, allowModelOverride,
    allowedModels?}``."""

    principal: str
    allowed_providers: list[str]
    allow_model_override: bool
    allowed_models: list[str] | str  # "*": any
    llm: dict[str, Any]


class CapabilitiesResult(Result, frozen=True):
    single_agent: bool
    multi_agent: bool
    available_execution_targets: list[str]
    provider_catalog: list[ProviderEntry]
    gateway_providers: list[ProviderEntry]
    provider_probe_summary: list[ProbeEntry]
    capabilities: NestedCapabilities
    bridge: BridgeInfo
    methods: list[str]
    limits: dict[str, float | int]
    access: PrincipalAccess | UnsetType = UNSET


# ---- xworkmate.routing.resolve -------------------------------------------------------------------


class ResolveResult(Result, frozen=True):
    """The routing fields (docs/api.md "xworkmate.routing.resolve").

    ``providerId`` and ``agentId`` repeat ``resolvedProviderId`` and ``metadata`` carries the
    routing details, as the app's dispatch client reads them (it asks again without them when
    they are missing: ``go_task_service_client.dart`` of ai-workspace-lab/xworkmate-app).
    """

    resolved_execution_target: str
    resolved_provider_id: str
    resolved_gateway_provider_id: str
    resolved_model: str
    resolved_skills: list[str]
    status: str
    unavailable: bool
    unavailable_code: str
    unavailable_message: str
    skill_resolution_source: str
    needs_skill_install: bool
    skill_install_request_id: str
    preferred_provider_id: str = ""
    preferred_provider_unavailable: bool = False
    preferred_provider_message: str = ""
    provider_id: str = ""
    agent_id: str = ""
    metadata: dict[str, Any] = {}


# ---- session.start / session.message ---------------------------------------------------------------


class TurnErrorInfo(Result, frozen=True):
    code: str
    message: str
    provider_id: str
    data: dict[str, Any] | UnsetType = UNSET


class TurnResult(Result, frozen=True):
    """A turn that ran (or was cancelled before it started: then ``turnId`` is null)."""

    success: bool
    status: str
    turn_id: str | None
    session_id: str
    thread_id: str
    resolved_execution_target: str
    resolved_provider_id: str
    resolved_gateway_provider_id: str
    resolved_model: str
    resolved_skills: list[str]
    resolved_working_directory: str
    output: str
    summary: str
    stop_reason: str
    usage: dict[str, Any] = {}
    upstream_session_id: str | None = None
    context_reset: bool = False
    preferred_provider_id: str = ""
    preferred_provider_unavailable: bool = False
    preferred_provider_message: str = ""
    error: TurnErrorInfo | UnsetType = UNSET
    artifacts: list[dict[str, Any]] | UnsetType = UNSET
    artifacts_omitted: str | UnsetType = UNSET
    context_restored: str | UnsetType = UNSET
    mode: str | UnsetType = UNSET
    run_id: str | UnsetType = UNSET


class UnavailableTurnResult(Result, frozen=True):
    """No provider could take the turn: the routing fields, no ``turnId``, no updates were sent."""

    success: bool
    status: str
    session_id: str
    thread_id: str
    resolved_execution_target: str
    resolved_provider_id: str
    resolved_gateway_provider_id: str
    resolved_model: str
    resolved_skills: list[str]
    unavailable: bool
    unavailable_code: str
    unavailable_message: str
    skill_resolution_source: str
    needs_skill_install: bool
    skill_install_request_id: str
    resolved_working_directory: str
    preferred_provider_id: str = ""
    preferred_provider_unavailable: bool = False
    preferred_provider_message: str = ""


class SessionUpdate(Result, frozen=True, forbid_unknown_fields=False):
    """The params of a ``session.update`` notification: the fields every update carries (each
    ``type`` adds its own, docs/api.md "Update stream"). Updates are built as dicts on the
    streaming path; this model is their schema, for the docs and the tests."""

    session_id: str
    thread_id: str
    turn_id: str | None
    seq: int
    type: str
    event: str
    pending: bool
    error: bool
    structured_event: dict[str, Any]

    def __post_init__(self) -> None:
        if self.seq < 1:
            raise ValueError("seq starts at 1")


# ---- the small ones --------------------------------------------------------------------------------


# ---- session.get / subscribe / result / list -------------------------------------------------------


class TurnSummary(Result, frozen=True):
    """One turn of a session, newest first in ``session.get``; times in seconds since the epoch."""

    turn_id: str
    status: str
    started_at: float
    ended_at: float | None
    summary: str


class SessionSnapshot(Result, frozen=True):
    """``session.get``: the authoritative state of a session (docs/api.md "Resumable streams")."""

    session_id: str
    thread_id: str
    state: str  # idle, running or closed
    provider_id: str | None
    working_directory: str | None
    session_state: dict[str, Any]
    turns: list[TurnSummary]
    last_seq: int
    created_at: float
    title: str | UnsetType = UNSET


class SubscribeResult(Result, frozen=True):
    """``session.subscribe``: the snapshot, and (over SSE, which answers once the running turn
    ended) that turn's result."""

    subscribed: bool
    last_seq: int
    state: SessionSnapshot
    gap: bool | UnsetType = UNSET
    first_seq: int | UnsetType = UNSET
    result: dict[str, Any] | UnsetType = UNSET


class SessionListEntry(Result, frozen=True):
    session_id: str
    thread_id: str
    state: str
    provider_id: str | None
    created_at: float
    updated_at: float
    title: str | UnsetType = UNSET
    working_directory: str | None = None


class SessionListResult(Result, frozen=True):
    sessions: list[SessionListEntry]
    next_cursor: str | None


class UnsubscribeResult(Result, frozen=True):
    accepted: bool
    unsubscribed: bool


class CancelResult(Result, frozen=True):
    accepted: bool
    cancelled: bool


class CloseResult(Result, frozen=True):
    accepted: bool
    closed: bool


class AcceptedResult(Result, frozen=True):
    """``session.permission``, ``xworkmate.gateway.disconnect``."""

    accepted: bool


class SystemLogsResult(Result, frozen=True):
    """``system.logs``: the words the app's Settings › Logs panel shows (``ok`` green, ``unknown``
    grey) and the latest log lines, oldest first (empty for a principal not in
    ``adminPrincipals``)."""

    bridge_status: str
    gateway_status: str
    bridge_logs: list[str]


class GatewayError(Result, frozen=True):
    """A gateway failure: the bridge's code or the gateway's, with the gateway's ``details``."""

    code: str
    message: str
    details: dict[str, Any] | UnsetType = UNSET


class GatewayAuth(Result, frozen=True):
    role: str
    scopes: list[str]
    method: str = ""


class GatewayConnectResult(Result, frozen=True):
    ok: bool
    snapshot: dict[str, Any]  # docs/api.md xworkmate.gateway.connect: status, mode, statusText, …
    auth: GatewayAuth | None = None
    returned_device_token: bool = False
    error: GatewayError | None = None


class GatewayRequestResult(Result, frozen=True):
    ok: bool
    payload: Any = None
    error: GatewayError | None = None


class KnowledgeSourcesResult(Result, frozen=True):
    """``knowledge.sources``: each source's id, label, protocol, readiness and capabilities (no
    URLs, credentials or absolute roots)."""

    sources: list[dict[str, Any]]
    total_source_count: int
    ready_source_count: int
    enabled_source_count: int
    probed: bool


class KnowledgeRegistryResult(Result, frozen=True):
    """``knowledge.sources.add|update|remove|select``: the registered sources as an admin sees
    them (``{id, label, protocol, url | root, capabilities, enabled, usable, reason?}``), the
    runtime connection (``{origin, baseUrl, model, apiKeyConfigured, timeoutSeconds}``: never the
    key) and, for add and update, that ``source`` with its probe ``status``."""

    sources: list[dict[str, Any]]
    runtime: dict[str, Any]
    source: dict[str, Any] | UnsetType = UNSET


class KnowledgeReadResult(Result, frozen=True):
    """``knowledge.read``: one node of a source's tree and its ``children`` (progressive
    disclosure)."""

    source_id: str
    path: str
    kind: str  # "page" | "folder"
    title: str
    summary: str
    front_matter: dict[str, Any]
    content: str
    children: list[dict[str, Any]]
    truncated: bool


# ---- llm.complete / llm.completeStructured --------------------------------------------------------


class LlmAudit(Result, frozen=True):
    principal: str
    purpose: str | None
    schema_name: str | None
    provider: str
    model: str


class LlmError(Result, frozen=True):
    code: str  # STRUCTURED_OUTPUT_INVALID
    message: str


class LlmResult(Result, frozen=True):
    """``llm.complete``: the reply ``text``, the runtime (``provider``) and ``model`` that
    answered, ``usage`` in the turn usage shape (``cost`` from ``llm.prices`` when the runtime
    reports none), ``audit``, and ``fallbackFrom`` (the runtimes that failed first) when any did.
    ``llm.completeStructured`` adds ``contentType`` (``json`` / ``text``), ``parsed`` and, when the
    reply is not valid JSON of the schema, ``error``."""

    text: str
    provider: str
    model: str
    usage: dict[str, Any]
    audit: LlmAudit
    fallback_from: list[str] | UnsetType = UNSET
    content_type: str | UnsetType = UNSET
    parsed: Any = UNSET
    error: LlmError | UnsetType = UNSET


def title_of(state: dict[str, Any]) -> str | UnsetType:
    """A session's title, as its agent last reported it (ACP ``session_info_update``)."""
    title = (state.get("session_info_update") or {}).get("title")
    return title if isinstance(title, str) else UNSET
