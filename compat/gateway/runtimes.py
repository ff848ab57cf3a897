"""``xworkmate.gateway.connect`` / ``request`` / ``disconnect``: per-principal runtimes on the
bridge's one gateway connection (docs/api.md "xworkmate.gateway.*").

A runtime is a client's name (``runtimeId``) for its view of the gateway, owned by one principal:
``(principal, runtimeId)`` is the key, so one client's runtime and its events never reach
another principal. Each runtime sends its notifications to the connection that last called
``connect`` or ``request`` for it, while that connection is open:

* ``xworkmate.gateway.snapshot {runtimeId, snapshot}`` on every status change;
* ``xworkmate.gateway.log {runtimeId, log: {timestampMs, level, category, message}}``;
* ``xworkmate.gateway.push {runtimeId, event: {event, payload, sequence}}`` for each gateway event
  the principal may see, plus the normalised ``chat.run`` push for ``chat`` and assistant
  ``agent`` events.

A principal sees the events of its own gateway sessions (their ``sessionKey`` is in its
namespace, :func:`compat.gateway.adapter.scoped_key`) and gateway-wide status events
(:data:`GLOBAL_EVENTS`); the ``sessionKey`` of every request it sends is put in its namespace.
Only methods on ``gateway.allowMethods`` are passed (the bridge calls them with its own operator
credential); others answer ``METHOD_NOT_ALLOWED``.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from compat.gateway import protocol as wire
from compat.gateway.adapter import GatewayAdapter, in_namespace, scoped_key
from compat.gateway.protocol import GatewayError
from compat.knowledge.shapes import as_dict  # gateway payloads are read defensively, as knowledge ones

Notify = Callable[[str, dict[str, Any]], None]

GLOBAL_EVENTS = frozenset({"health", "presence", "heartbeat", "shutdown", "models.snapshot", "update.available"})
"""Events about the gateway as a whole, relayed to every runtime; any other event is relayed
only to the principal whose session its ``sessionKey`` names."""

MAX_RUNTIMES_PER_PRINCIPAL = 16
"""Runtimes a principal keeps; a new one beyond them replaces its least recently used one (the
app opens a fresh HTTP request per call, so a runtime outlives the connection that made it)."""
MAX_RUNTIME_ID = 200


def visible(value: Any, principal: str, depth: int = 0) -> Any:
    """``value`` (a gateway payload) without the entries about other sessions: in every list, an
    object whose ``key`` or ``sessionKey`` names a session outside the principal's namespace is
    left out (``health`` lists the gateway's recent sessions, everyone's)."""
    if depth > 32:
        return None
    if isinstance(value, list):
        kept = []
        for item in value:
            if isinstance(item, dict):
                key = item.get("sessionKey", item.get("key"))
                if isinstance(key, str) and key and not in_namespace(principal, key):
                    continue
            kept.append(visible(item, principal, depth + 1))
        return kept
    if isinstance(value, dict):
        return {k: visible(v, principal, depth + 1) for k, v in value.items()}
    return value


class _Runtime:
    __slots__ = ("connection_id", "notify", "principal", "runtime_id")

    def __init__(self, principal: str, runtime_id: str) -> None:
        self.principal = principal
        self.runtime_id = runtime_id
        self.notify: Notify | None = None
        self.connection_id = ""


def _bad_runtime_id(runtime_id: str) -> GatewayError | None:
    if not runtime_id:
        return GatewayError("INVALID_RUNTIME_ID", "runtimeId is required")
    if len(runtime_id) > MAX_RUNTIME_ID:
        return GatewayError("INVALID_RUNTIME_ID", f"runtimeId is longer than {MAX_RUNTIME_ID} characters")
    return None


class GatewayRuntimes:
    """The runtimes of every principal on ``adapter``'s gateway connection."""

    def __init__(self, adapter: GatewayAdapter) -> None:
        self.adapter = adapter
        self.client = adapter.client
        self._runtimes: OrderedDict[tuple[str, str], _Runtime] = OrderedDict()  # least recently used first
        self.client.on_change.append(self._on_change)
        self.client.on_log.append(self._on_log)
        self.client.on_event.append(self._on_event)

    @property
    def status(self) -> str:
        """The connection's status word (``system.logs``' ``gatewayStatus``)."""
        return self.client.status

    # ---- methods ------------------------------------------------------------------------------

    async def connect(
        self,
        principal: str,
        runtime_id: str,
        gateway_provider_id: str,
        notify: Notify,
        connection_id: str,
        closers: list[Callable[[], None]] | None,
    ) -> dict[str, Any]:
        """``xworkmate.gateway.connect``: ``{ok, snapshot, auth, returnedDeviceToken, error}``;
        a failure is inside the result (``error.code``: ``INVALID_RUNTIME_ID``,
        ``UNKNOWN_GATEWAY_PROVIDER``, ``CONNECT_CHALLENGE_TIMEOUT``, ``SOCKET_FAILURE``,
        ``CONNECT_TIMEOUT``, or the gateway's own code with ``details.code``)."""
        if (bad := _bad_runtime_id(runtime_id)) is not None:
            return self._failure(bad)
        if gateway_provider_id not in ("", "openclaw"):
            message = f"unknown gateway provider {gateway_provider_id[:100]!r} (configured: openclaw)"
            return self._failure(GatewayError("UNKNOWN_GATEWAY_PROVIDER", message))
        runtime = self._bind(principal, runtime_id, notify, connection_id, closers)
        self.client.connect()
        try:
            await self.client.ready(self.adapter.settings.connect_timeout)
        except GatewayError as exc:
            return self._failure(exc)
        finally:
            if closers is None:
                runtime.notify = None  # a plain HTTP reply carries nothing after it
        auth = as_dict(as_dict(self.client.hello).get("auth"))
        role, method = auth.get("role"), auth.get("method")
        return {
            "ok": True,
            "snapshot": self.client.snapshot(),
            "auth": {
                "role": role[:100] if isinstance(role, str) else wire.ROLE,
                "scopes": self.client.granted_scopes(),
                "method": method[:100] if isinstance(method, str) else "",
            },
            "returnedDeviceToken": self.client.returned_device_token,
            "error": None,
        }

    async def request(
        self,
        principal: str,
        runtime_id: str,
        method: str,
        params: dict[str, Any] | None,
        timeout_ms: float | None,
        notify: Notify,
        connection_id: str,
        closers: list[Callable[[], None]] | None,
    ) -> dict[str, Any]:
        """``xworkmate.gateway.request``: ``{ok, payload, error}`` (``error.code``: ``OFFLINE``,
        ``RPC_TIMEOUT``, ``SOCKET_CLOSED``, ``METHOD_NOT_ALLOWED``, ``UNKNOWN_RUN``,
        ``INVALID_RUNTIME_ID``, or the gateway's own)."""
        if (bad := _bad_runtime_id(runtime_id)) is not None:
            return {"ok": False, "payload": None, "error": bad.to_wire()}
        if method == "connect" or method not in self.adapter.settings.allow_methods:
            error = GatewayError("METHOD_NOT_ALLOWED", f"{method[:100]!r} is not on this bridge's gateway.allowMethods")
            return {"ok": False, "payload": None, "error": error.to_wire()}
        params = dict(params or {})
        if isinstance(params.get("sessionKey"), str):
            params["sessionKey"] = scoped_key(principal, params["sessionKey"])
        if isinstance(params.get("idempotencyKey"), str):  # its run id: never another principal's
            params["idempotencyKey"] = scoped_key(principal, params["idempotencyKey"])
        run_id = params.get("runId")
        if run_id is not None and not (isinstance(run_id, str) and self.adapter.owns_run(principal, run_id)):
            error = GatewayError("UNKNOWN_RUN", "runId names no run this token started")
            return {"ok": False, "payload": None, "error": error.to_wire()}
        runtime = self._bind(principal, runtime_id, notify, connection_id, closers)
        timeout = timeout_ms / 1000 if timeout_ms and timeout_ms > 0 else self.adapter.settings.request_timeout
        try:
            payload = await self.client.request(method, params, min(timeout, 3600.0))
        except GatewayError as exc:
            return {"ok": False, "payload": None, "error": exc.to_wire()}
        finally:
            if closers is None:
                runtime.notify = None
        if method == "chat.send" and isinstance(payload, dict) and isinstance(payload.get("runId"), str):
            self.adapter.own_run(principal, payload["runId"])
        return {"ok": True, "payload": visible(payload, principal), "error": None}

    def disconnect(self, principal: str, runtime_id: str) -> dict[str, Any]:
        """``xworkmate.gateway.disconnect``: forget the runtime; when it was the last one and no
        gateway-routed turn runs, the gateway connection closes. Idempotent: ``{accepted: true}``."""
        removed = self._runtimes.pop((principal, runtime_id), None)
        if removed is not None and not self._runtimes and self.adapter.running == 0:
            self.client.disconnect()
        return {"accepted": True}

    # ---- plumbing -----------------------------------------------------------------------------

    def _bind(
        self,
        principal: str,
        runtime_id: str,
        notify: Notify,
        connection_id: str,
        closers: list[Callable[[], None]] | None,
    ) -> _Runtime:
        key = (principal, runtime_id)
        runtime = self._runtimes.get(key)
        if runtime is None:
            mine = [k for k in self._runtimes if k[0] == principal]
            if len(mine) >= MAX_RUNTIMES_PER_PRINCIPAL:
                del self._runtimes[mine[0]]  # the principal's least recently used
            runtime = self._runtimes[key] = _Runtime(principal, runtime_id)
        self._runtimes.move_to_end(key)
        runtime.notify, runtime.connection_id = notify, connection_id
        if closers is not None:
            closers.append(lambda: self._unbind(runtime, connection_id))
        return runtime

    def _unbind(self, runtime: _Runtime, connection_id: str) -> None:
        if runtime.connection_id == connection_id:
            runtime.notify = None

    def _failure(self, error: GatewayError) -> dict[str, Any]:
        return {
            "ok": False,
            "snapshot": self.client.snapshot(),
            "auth": None,
            "returnedDeviceToken": False,
            "error": error.to_wire(),
        }

    def _send(self, runtime: _Runtime, method: str, params: dict[str, Any]) -> None:
        if runtime.notify is not None:
            runtime.notify(method, {"runtimeId": runtime.runtime_id, **params})

    def _on_change(self) -> None:
        if not self._runtimes:
            return
        snapshot = self.client.snapshot()
        for runtime in list(self._runtimes.values()):
            self._send(runtime, "xworkmate.gateway.snapshot", {"snapshot": snapshot})

    def _on_log(self, level: str, category: str, message: str) -> None:
        entry = {"timestampMs": int(time.time() * 1000), "level": level, "category": category, "message": message}
        for runtime in list(self._runtimes.values()):
            self._send(runtime, "xworkmate.gateway.log", {"log": entry})

    def _on_event(self, event: str, payload: Any, seq: int | None) -> None:
        if not self._runtimes or event == "connect.challenge":
            return
        key = payload.get("sessionKey") if isinstance(payload, dict) else None
        run = wire.chat_run(event, payload)
        for runtime in list(self._runtimes.values()):
            if runtime.notify is None:
                continue
            if isinstance(key, str) and key:
                if not in_namespace(runtime.principal, key):
                    continue
            elif event not in GLOBAL_EVENTS:
                continue
            self._send(
                runtime, "xworkmate.gateway.push", {"event": {"event": event, "payload": payload, "sequence": seq or 0}}
            )
            if run is not None:
                self._send(
                    runtime,
                    "xworkmate.gateway.push",
                    {"event": {"event": "chat.run", "payload": run, "sequence": seq or 0}},
                )
