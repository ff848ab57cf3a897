"""The method registry: every wire method, declared once (docs/api.md "Methods").

Each entry names the method, its params model, its handler, its result model, and whether it runs
inline on the reader (it never waits: ``acp.capabilities``, ``session.cancel``, …) or in a task of
its own. ``acp.capabilities``' method list, the dispatcher and the docs test all read this table;
the dispatcher refuses an entry whose handler's kind (``def`` / ``async def``) does not match what
it declares.

Params are validated with pydantic models imported when a request first needs them, not at start:
pydantic and the models were ~60 ms of the bridge's cold start (bench case 6). The result models
(``orchestrator.results``) are msgspec structs and load with the registry.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from bridge.dispatch import CallContext, Dispatcher, Method, Observer
from bridge.logs import RECENT
from bridge.rpc.errors import (
    InternalError,
    InvalidParams,
    LimitReached,
    LlmOverrideDenied,
    ModelCallFailed,
    NotFound,
    RpcError,
    SessionBusy,
    Unauthorized,
)
from compat.params import validated
from orchestrator.results import (
    AcceptedResult,
    CancelResult,
    CapabilitiesResult,
    CloseResult,
    GatewayConnectResult,
    GatewayError,
    GatewayRequestResult,
    KnowledgeReadResult,
    KnowledgeRegistryResult,
    KnowledgeSourcesResult,
    LlmResult,
    ResolveResult,
    SessionListResult,
    SessionSnapshot,
    SubscribeResult,
    SystemLogsResult,
    TurnResult,
    UnavailableTurnResult,
    UnsubscribeResult,
)
from orchestrator.service import Orchestrator
from orchestrator.sessions import StreamListener

if TYPE_CHECKING:
    from compat.knowledge.registry import KnowledgeRegistry
    from compat.knowledge.service import KnowledgeService
    from compat.llm.service import LlmService


class Params:
    """A params model, imported on first use: ``Params("orchestrator.models", "TurnParams")``."""

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name

    @functools.cached_property
    def model(self) -> Any:
        return getattr(importlib.import_module(self.module), self.name)

    def validate(self, raw: dict[str, Any]) -> Any:
        """The validated params.

        Raises:
            InvalidParams: -32602 with ``data.errors`` (compat.params).
        """
        return validated(self.model, raw)


COMMON_ERRORS: tuple[type[RpcError], ...] = (InvalidParams, Unauthorized, InternalError)
"""Errors any method may answer: bad params, a missing or wrong token, a bridge failure."""


class MethodSpec(msgspec.Struct, frozen=True):
    """One wire method.

    Attributes:
        name: the wire name.
        handler: ``handler(orchestrator, params, ctx) -> result``; ``params`` is the validated
            model (the raw dict when ``params`` is None).
        params: the params model.
        result: the result model (a union where a method has two shapes).
        inline: the handler never waits (a plain ``def``) and runs on the connection's reader, in
            arrival order; otherwise it is an ``async def`` run in a task of its own.
        summary: one line for the OpenRPC document (``rpc.discover``).
        errors: the JSON-RPC errors the method may answer besides those every method may
            (``COMMON_ERRORS``).
    """

    name: str
    handler: Callable[..., Any]
    params: Params | None
    result: Any
    inline: bool
    summary: str = ""
    errors: tuple[type[RpcError], ...] = ()

    @property
    def all_errors(self) -> tuple[type[RpcError], ...]:
        return (*COMMON_ERRORS, *self.errors)

    def bind(self, orch: Orchestrator) -> Method:
        validate = self.params.validate if self.params is not None else None
        return Method(self.name, functools.partial(self.handler, orch), inline=self.inline, params=validate)


# ---- handlers ------------------------------------------------------------------------------------------


def capabilities(orch: Orchestrator, params: dict[str, Any], ctx: CallContext) -> CapabilitiesResult:
    return orch.capabilities(ctx.principal)


def routing_resolve(orch: Orchestrator, params: Any, ctx: CallContext) -> ResolveResult:
    return orch.resolve(params, ctx.principal)


def _listener(ctx: CallContext) -> StreamListener:
    """The requesting stream as a session's listener (``orchestrator.sessions.Listener``)."""
    return StreamListener(ctx.notify, ctx.connection_id, ctx.closers, ctx.backlog)


async def session_start(orch: Orchestrator, params: Any, ctx: CallContext) -> TurnResult | UnavailableTurnResult:
    return await orch.run_turn(params, ctx.principal, _listener(ctx), start=True)


async def session_message(orch: Orchestrator, params: Any, ctx: CallContext) -> TurnResult | UnavailableTurnResult:
    return await orch.run_turn(params, ctx.principal, _listener(ctx), start=False)


async def session_subscribe(orch: Orchestrator, params: Any, ctx: CallContext) -> SubscribeResult:
    after = params.after_seq
    if after is None and ctx.last_event_id:  # SSE resume: Last-Event-ID is <sessionId>:<seq>
        session_id, _, seq = ctx.last_event_id.rpartition(":")
        if session_id == params.session_id and seq.isascii() and seq.isdigit() and len(seq) <= 18:
            after = int(seq)
    return await orch.stored.subscribe(
        params.session_id, ctx.principal, _listener(ctx), after, until_idle=ctx.until_idle
    )


def session_unsubscribe(orch: Orchestrator, params: Any, ctx: CallContext) -> UnsubscribeResult:
    return orch.stored.unsubscribe(params.session_id, ctx.principal, ctx.connection_id)


async def session_get(orch: Orchestrator, params: Any, ctx: CallContext) -> SessionSnapshot:
    return await orch.stored.get(params.session_id, ctx.principal)


async def session_result(orch: Orchestrator, params: Any, ctx: CallContext) -> dict[str, Any]:
    return await orch.stored.turn_result(params.session_id, ctx.principal, params.turn_id)


async def session_list(orch: Orchestrator, params: Any, ctx: CallContext) -> SessionListResult:
    return await orch.stored.list_sessions(ctx.principal, params.cursor, params.limit)


def session_cancel(orch: Orchestrator, params: Any, ctx: CallContext) -> CancelResult:
    return orch.cancel(params.session_id, ctx.principal)


async def session_close(orch: Orchestrator, params: Any, ctx: CallContext) -> CloseResult:
    return await orch.close(params.session_id, ctx.principal)


def session_permission(orch: Orchestrator, params: Any, ctx: CallContext) -> AcceptedResult:
    return orch.permission(params, ctx.principal)


_NO_GATEWAY = GatewayError(code="GATEWAY_NOT_CONFIGURED", message="no OpenClaw gateway is configured on this bridge")


async def gateway_connect(orch: Orchestrator, params: Any, ctx: CallContext) -> GatewayConnectResult:
    if orch.gateway is None:
        snapshot = {"status": "offline", "mode": "openclaw", "statusText": "not configured"}
        return GatewayConnectResult(ok=False, snapshot=snapshot, error=_NO_GATEWAY)
    result = await orch.gateway.connect(
        ctx.principal, params.runtime_id, params.gateway_provider_id, ctx.notify, ctx.connection_id, ctx.closers
    )
    return msgspec.convert(result, GatewayConnectResult)


async def gateway_request(orch: Orchestrator, params: Any, ctx: CallContext) -> GatewayRequestResult:
    if orch.gateway is None:
        return GatewayRequestResult(ok=False, payload=None, error=_NO_GATEWAY)
    result = await orch.gateway.request(
        ctx.principal,
        params.runtime_id,
        params.method,
        params.params,
        params.timeout_ms,
        ctx.notify,
        ctx.connection_id,
        ctx.closers,
    )
    return msgspec.convert(result, GatewayRequestResult)


def gateway_disconnect(orch: Orchestrator, params: Any, ctx: CallContext) -> AcceptedResult:
    if orch.gateway is not None:
        orch.gateway.disconnect(ctx.principal, params.runtime_id)
    return AcceptedResult(accepted=True)


def system_logs(orch: Orchestrator, params: Any, ctx: CallContext) -> SystemLogsResult:
    admin = ctx.principal in orch.admin_principals
    return SystemLogsResult(
        bridge_status="ok",
        gateway_status=_gateway_status(orch),
        bridge_logs=RECENT.lines(params.limit) if admin else [],
    )


def _gateway_status(orch: Orchestrator) -> str:
    """``ok`` (connected), ``error`` (stopped on a refusal), ``unknown`` (not configured or not
    connected yet): the words the app's Logs panel colours."""
    if orch.gateway is None:
        return "unknown"
    return {"connected": "ok", "error": "error"}.get(orch.gateway.status, "unknown")


async def knowledge_sources(orch: Orchestrator, params: Any, ctx: CallContext) -> KnowledgeSourcesResult:
    listing = await _knowledge(orch).list_sources(params.probe)
    return msgspec.convert(listing, KnowledgeSourcesResult)


async def knowledge_read(orch: Orchestrator, params: Any, ctx: CallContext) -> KnowledgeReadResult:
    node = await _knowledge(orch).read(params.source_id, params.path)
    return msgspec.convert(node, KnowledgeReadResult)


async def knowledge_sources_add(orch: Orchestrator, params: Any, ctx: CallContext) -> KnowledgeRegistryResult:
    return msgspec.convert(await _registry(orch, ctx).add(params.source, params.probe), KnowledgeRegistryResult)


async def knowledge_sources_update(orch: Orchestrator, params: Any, ctx: CallContext) -> KnowledgeRegistryResult:
    view = await _registry(orch, ctx).update(params.source_id, params.source, params.probe)
    return msgspec.convert(view, KnowledgeRegistryResult)


async def knowledge_sources_remove(orch: Orchestrator, params: Any, ctx: CallContext) -> KnowledgeRegistryResult:
    return msgspec.convert(await _registry(orch, ctx).remove(params.source_id), KnowledgeRegistryResult)


async def knowledge_sources_select(orch: Orchestrator, params: Any, ctx: CallContext) -> KnowledgeRegistryResult:
    registry = _registry(orch, ctx)
    if params.runtime_given:
        runtime = params.runtime.model_dump() if params.runtime is not None else None
        view = await registry.select(params.source_ids, runtime)
    else:
        view = await registry.select(params.source_ids)
    return msgspec.convert(view, KnowledgeRegistryResult)


async def llm_complete(orch: Orchestrator, params: Any, ctx: CallContext) -> LlmResult:
    return msgspec.convert(await _llm(orch).complete(ctx.principal, params), LlmResult)


async def llm_complete_structured(orch: Orchestrator, params: Any, ctx: CallContext) -> LlmResult:
    return msgspec.convert(await _llm(orch).complete_structured(ctx.principal, params), LlmResult)


def _llm(orch: Orchestrator) -> LlmService:
    """The ``llm.*`` service.

    Raises:
        NotFound: -32004, no model runtime is configured (``llm.runtimes``).
    """
    if orch.llm is None or not orch.llm.available:
        raise NotFound("no model runtime is configured (llm.runtimes)")
    return orch.llm


async def rpc_discover(orch: Orchestrator, params: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
    return await anyio.to_thread.run_sync(openrpc_document)  # pydantic's schemas take ~0.1 s, once


@functools.cache
def openrpc_document() -> dict[str, Any]:
    """The OpenRPC document of :data:`METHODS` (``bridge.openrpc``), built once."""
    from bridge.openrpc import document

    return document(METHODS)


def _registry(orch: Orchestrator, ctx: CallContext) -> KnowledgeRegistry:
    """The source registry, for an admin only: a registered source makes the bridge fetch a URL
    or read a folder.

    Raises:
        Unauthorized: -32001 with ``data.reason: ADMIN_REQUIRED``, the caller is not in
            ``adminPrincipals``.
        NotFound: -32004, this bridge has no knowledge service.
    """
    if ctx.principal not in orch.admin_principals:
        raise Unauthorized("only adminPrincipals may use the knowledge source registry", reason="ADMIN_REQUIRED")
    registry = _knowledge(orch).registry
    if registry is None:
        raise NotFound("this bridge keeps no knowledge source registry")
    return registry


def _knowledge(orch: Orchestrator) -> KnowledgeService:
    if orch.knowledge is None:
        raise NotFound("no knowledge sources are configured")
    return orch.knowledge


# ---- the table ---------------------------------------------------------------------------------------

_MODELS = "orchestrator.models"
_KNOWLEDGE = "compat.knowledge.params"
_REGISTRY = "compat.knowledge.registry_params"
_TURN = Params(_MODELS, "TurnParams")
_SESSION = Params(_MODELS, "SessionRef")
_GATEWAY = Params(_MODELS, "GatewayParams")
_LLM = "compat.llm.params"

_SESSION_ERRORS = (NotFound,)
_TURN_ERRORS = (SessionBusy, LimitReached)
_LLM_ERRORS = (NotFound, LlmOverrideDenied, LimitReached, ModelCallFailed)
_KNOWLEDGE_ERRORS = (NotFound,)

METHODS: tuple[MethodSpec, ...] = (
    MethodSpec(
        "acp.capabilities",
        capabilities,
        None,
        CapabilitiesResult,
        inline=True,
        summary="Providers, targets, probes, limits, and what the caller may use.",
    ),
    MethodSpec(
        "xworkmate.routing.resolve",
        routing_resolve,
        Params(_MODELS, "ResolveParams"),
        ResolveResult,
        inline=True,
        summary="Choose an execution target, provider, model and skills for a prompt.",
    ),
    MethodSpec(
        "session.start",
        session_start,
        _TURN,
        TurnResult | UnavailableTurnResult,
        inline=False,
        summary="Start a conversation with a turn; answers after the last session.update.",
        errors=_TURN_ERRORS,
    ),
    MethodSpec(
        "session.message",
        session_message,
        _TURN,
        TurnResult | UnavailableTurnResult,
        inline=False,
        summary="Run the next turn of a session.",
        errors=_TURN_ERRORS,
    ),
    MethodSpec(
        "session.cancel",
        session_cancel,
        _SESSION,
        CancelResult,
        inline=True,
        summary="Cancel the session's running turn.",
        errors=_SESSION_ERRORS,
    ),
    MethodSpec(
        "session.close",
        session_close,
        _SESSION,
        CloseResult,
        inline=False,
        summary="Close a session and end its agent.",
        errors=(*_SESSION_ERRORS, SessionBusy),  # owned by another process on the state directory
    ),
    MethodSpec(
        "session.subscribe",
        session_subscribe,
        Params(_MODELS, "SubscribeParams"),
        SubscribeResult,
        inline=False,
        summary="Replay a session's updates after afterSeq, then stream the live ones.",
        errors=_SESSION_ERRORS,
    ),
    MethodSpec(
        "session.unsubscribe",
        session_unsubscribe,
        _SESSION,
        UnsubscribeResult,
        inline=True,
        summary="Stop streaming a session's updates to this connection.",
        errors=_SESSION_ERRORS,
    ),
    MethodSpec(
        "session.get",
        session_get,
        _SESSION,
        SessionSnapshot,
        inline=False,
        summary="A session's snapshot: state, provider, turns, lastSeq.",
        errors=_SESSION_ERRORS,
    ),
    MethodSpec(
        "session.result",
        session_result,
        Params(_MODELS, "ResultParams"),
        dict[str, Any],
        inline=False,
        summary="A finished turn's full result, or its state while it runs.",
        errors=_SESSION_ERRORS,
    ),
    MethodSpec(
        "session.list",
        session_list,
        Params(_MODELS, "ListParams"),
        SessionListResult,
        inline=False,
        summary="The caller's sessions, newest first, with a cursor.",
    ),
    MethodSpec(
        "session.permission",
        session_permission,
        Params(_MODELS, "PermissionParams"),
        AcceptedResult,
        inline=True,
        summary="Answer an agent's permission request.",
        errors=_SESSION_ERRORS,
    ),
    MethodSpec(
        "system.logs",
        system_logs,
        Params(_MODELS, "SystemLogsParams"),
        SystemLogsResult,
        inline=True,
        summary="Bridge and gateway status, and (for administrators) recent log lines.",
    ),
    MethodSpec(
        "xworkmate.gateway.connect",
        gateway_connect,
        _GATEWAY,
        GatewayConnectResult,
        inline=False,
        summary="Connect a gateway runtime of this principal.",
    ),
    MethodSpec(
        "xworkmate.gateway.request",
        gateway_request,
        _GATEWAY,
        GatewayRequestResult,
        inline=False,
        summary="Send an allowed request to the OpenClaw gateway.",
    ),
    MethodSpec(
        "xworkmate.gateway.disconnect",
        gateway_disconnect,
        _GATEWAY,
        AcceptedResult,
        inline=True,
        summary="Disconnect a gateway runtime.",
    ),
    MethodSpec(
        "llm.complete",
        llm_complete,
        Params(_LLM, "CompleteParams"),
        LlmResult,
        inline=False,
        summary="One model call on a runtime the bridge holds.",
        errors=_LLM_ERRORS,
    ),
    MethodSpec(
        "llm.completeStructured",
        llm_complete_structured,
        Params(_LLM, "StructuredParams"),
        LlmResult,
        inline=False,
        summary="One model call whose reply is JSON checked against a schema.",
        errors=_LLM_ERRORS,
    ),
    MethodSpec(
        "knowledge.sources",
        knowledge_sources,
        Params(_KNOWLEDGE, "SourcesParams"),
        KnowledgeSourcesResult,
        inline=False,
        summary="The knowledge sources, their readiness and capabilities.",
        errors=_KNOWLEDGE_ERRORS,
    ),
    MethodSpec(
        "knowledge.read",
        knowledge_read,
        Params(_KNOWLEDGE, "ReadParams"),
        KnowledgeReadResult,
        inline=False,
        summary="One node of a knowledge source's tree and its children.",
        errors=_KNOWLEDGE_ERRORS,
    ),
    MethodSpec(
        "knowledge.sources.add",
        knowledge_sources_add,
        Params(_REGISTRY, "SourceAddParams"),
        KnowledgeRegistryResult,
        inline=False,
        summary="Register a knowledge source (administrators).",
        errors=(*_KNOWLEDGE_ERRORS, LimitReached),
    ),
    MethodSpec(
        "knowledge.sources.update",
        knowledge_sources_update,
        Params(_REGISTRY, "SourceUpdateParams"),
        KnowledgeRegistryResult,
        inline=False,
        summary="Change a registered knowledge source (administrators).",
        errors=_KNOWLEDGE_ERRORS,
    ),
    MethodSpec(
        "knowledge.sources.remove",
        knowledge_sources_remove,
        Params(_REGISTRY, "SourceRemoveParams"),
        KnowledgeRegistryResult,
        inline=False,
        summary="Remove a registered knowledge source (administrators).",
        errors=_KNOWLEDGE_ERRORS,
    ),
    MethodSpec(
        "knowledge.sources.select",
        knowledge_sources_select,
        Params(_REGISTRY, "SourceSelectParams"),
        KnowledgeRegistryResult,
        inline=False,
        summary="Choose the registered sources turns use, and the runtime connection (administrators).",
        errors=_KNOWLEDGE_ERRORS,
    ),
    MethodSpec(
        "rpc.discover",
        rpc_discover,
        None,
        dict[str, Any],
        inline=False,
        summary="This contract as an OpenRPC document.",
    ),
)
"""Every wire method, in the order ``acp.capabilities`` lists them."""

METHOD_NAMES: tuple[str, ...] = tuple(spec.name for spec in METHODS)


def build_dispatcher(orch: Orchestrator, observer: Observer | None = None) -> Dispatcher:
    """The dispatcher for every method in :data:`METHODS`, bound to ``orch``; ``observer`` sees
    every request (the audit and I/O logs, ``bridge.audit``).

    Raises:
        TypeError: an entry's ``inline`` does not match its handler's kind.
    """
    limits = orch.limits
    return Dispatcher(
        (spec.bind(orch) for spec in METHODS),
        max_batch_size=limits.max_batch_size,
        max_batch_reply_bytes=limits.max_batch_reply_bytes,
        observer=observer,
    )
