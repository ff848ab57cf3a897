"""The method table: JSON-RPC method names → orchestrator operations (docs/api.md "Methods").

Params are validated here with the orchestrator's pydantic models; a validation error becomes
-32602. The models, and pydantic, are imported when a request first needs them rather than at
start: they were ~60 ms of the bridge's cold start (bench case 6; see compat.settings).
"""

from __future__ import annotations

import functools
import inspect
from types import ModuleType
from typing import Any

import orjson

from bridge.dispatch import CallContext, Dispatcher, Handler
from bridge.rpc.errors import NotFound
from compat.params import validated
from orchestrator.service import Orchestrator

METHODS = (
    "acp.capabilities",
    "xworkmate.routing.resolve",
    "session.start",
    "session.message",
    "session.cancel",
    "session.close",
    "session.permission",
    "xworkmate.gateway.connect",
    "xworkmate.gateway.request",
    "xworkmate.gateway.disconnect",
    "knowledge.sources",
    "knowledge.read",
)


@functools.cache
def _models() -> ModuleType:
    """orchestrator.models, on first use."""
    from orchestrator import models

    return models


@functools.cache
def _knowledge_models() -> ModuleType:
    """compat.knowledge.params, on first use."""
    from compat.knowledge import params

    return params


def _gateway_missing() -> dict[str, Any]:
    return {"code": "GATEWAY_NOT_CONFIGURED", "message": "no OpenClaw gateway is configured on this bridge"}


def build_handlers(orch: Orchestrator) -> dict[str, Handler]:
    """One async handler per method in ``METHODS``."""

    encoded: list[Any] = [None, None]  # [the orchestrator's cached result, its JSON fragment]

    def capabilities(params: dict[str, Any], ctx: CallContext) -> Any:
        # The result is rebuilt only when a probe changes it, so its JSON is encoded once per
        # build rather than per call: the hottest call of a polling client (bench case 1).
        result = orch.capabilities()
        if encoded[0] is not result:
            encoded[:] = [result, orjson.Fragment(orjson.dumps(result))]
        return encoded[1]

    def routing_resolve(params: dict[str, Any], ctx: CallContext) -> Any:
        return orch.resolve(validated(_models().ResolveParams, params))

    async def start(params: dict[str, Any], ctx: CallContext) -> Any:
        return await orch.run_turn(validated(_models().TurnParams, params), ctx.principal, ctx.notify, start=True)

    async def message(params: dict[str, Any], ctx: CallContext) -> Any:
        return await orch.run_turn(validated(_models().TurnParams, params), ctx.principal, ctx.notify, start=False)

    def cancel(params: dict[str, Any], ctx: CallContext) -> Any:
        return orch.cancel(validated(_models().SessionRef, params).session_id, ctx.principal)

    async def close(params: dict[str, Any], ctx: CallContext) -> Any:
        return await orch.close(validated(_models().SessionRef, params).session_id, ctx.principal)

    def permission(params: dict[str, Any], ctx: CallContext) -> Any:
        return orch.permission(validated(_models().PermissionParams, params), ctx.principal)

    def gateway_connect(params: dict[str, Any], ctx: CallContext) -> Any:
        validated(_models().GatewayParams, params)
        return {
            "ok": False,
            "snapshot": {"status": "offline", "mode": "openclaw", "statusText": "not configured"},
            "error": _gateway_missing(),
        }

    def gateway_request(params: dict[str, Any], ctx: CallContext) -> Any:
        validated(_models().GatewayParams, params)
        return {"ok": False, "payload": None, "error": _gateway_missing()}

    def gateway_disconnect(params: dict[str, Any], ctx: CallContext) -> Any:
        validated(_models().GatewayParams, params)
        return {"accepted": True}

    async def knowledge_sources(params: dict[str, Any], ctx: CallContext) -> Any:
        return await _knowledge().list_sources(validated(_knowledge_models().SourcesParams, params).probe)

    async def knowledge_read(params: dict[str, Any], ctx: CallContext) -> Any:
        read = validated(_knowledge_models().ReadParams, params)
        return await _knowledge().read(read.source_id, read.path)

    def _knowledge() -> Any:
        if orch.knowledge is None:
            raise NotFound("no knowledge sources are configured")
        return orch.knowledge

    handlers = dict(
        zip(
            METHODS,
            (
                capabilities,
                routing_resolve,
                start,
                message,
                cancel,
                close,
                permission,
                gateway_connect,
                gateway_request,
                gateway_disconnect,
                knowledge_sources,
                knowledge_read,
            ),
            strict=False,
        )
    )
    return handlers


def build_dispatcher(orch: Orchestrator) -> Dispatcher:
    handlers = build_handlers(orch)
    immediate = {m: h for m, h in handlers.items() if not inspect.iscoroutinefunction(h)}
    return Dispatcher({m: h for m, h in handlers.items() if m not in immediate}, immediate)
