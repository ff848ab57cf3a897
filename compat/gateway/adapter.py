"""Gateway-routed sessions: the OpenClaw gateway as a provider (docs/api.md "Gateway-routed turns").

A turn runs ``chat.send {sessionKey, message, idempotencyKey: turnId}`` on the bridge's gateway
connection (connected on demand), streams the gateway's ``chat`` and ``agent`` events of that run
to the turn's sink (text, status phases, tool calls, usage), waits for the run with ``agent.wait``,
and ends with ``mode: "gateway-chat"`` and the ``runId``. ``session.cancel`` sends ``chat.abort
{sessionKey, runId}`` (the gateway has no ``agent.cancel``).

The ``sessionKey`` is derived from the principal and the bridge session (:func:`session_key`),
so two principals never share a gateway session; the same prefix scopes the keys principals send
through ``xworkmate.gateway.request`` (:mod:`compat.gateway.runtimes`).

A socket lost mid-turn is waited out (up to ``connectTimeout``): the run goes on at the gateway,
``agent.wait`` is asked again after the reconnect (the idempotency key makes a repeated
``chat.send`` harmless), and ``agent.wait``'s ``terminalReply`` completes text missed meanwhile.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

import anyio

from compat.base import (
    ProbeResult,
    ProviderInfo,
    StatusEvent,
    TextDelta,
    ToolCallEvent,
    TurnError,
    TurnOutcome,
    TurnRequest,
    TurnSink,
    UsageEvent,
)
from compat.gateway import protocol as wire
from compat.gateway.client import GatewayClient
from compat.gateway.protocol import GatewayError
from compat.gateway.settings import GatewaySettings
from compat.knowledge.shapes import as_dict  # gateway payloads are read defensively, as knowledge ones

log = logging.getLogger(__name__)

PROVIDER_ID = "openclaw"
MODE = "gateway-chat"
LATE_EVENTS_WAIT = 2.0
"""Seconds a turn waits, after ``agent.wait`` answered, for the run's terminal ``chat`` event
(its last deltas can arrive after the run's end)."""
MAX_OWNED_RUNS = 1000
"""Runs per principal the adapter remembers (``agent.wait`` / ``chat.abort`` of other runs are refused)."""
MIN_WAIT_POLL = 1.0
"""Seconds an ``agent.wait`` poll takes at least (a gateway answering ``timeout`` at once is not polled in a loop)."""
ABORT_WAIT = 5.0
"""Seconds a turn that was cut off spends sending ``chat.abort``."""

_PLAIN_ID = re.compile(r"[A-Za-z0-9._-]{1,100}")
_SCOPED = re.compile(r"(?:agent:[^:]{1,200}:)?(xwm-[0-9a-f]{12}-)[A-Za-z0-9._-]{1,100}")
"""A session key the bridge sent (``xwm-<tag>-<plain id>``), as events name it (canonicalised
``agent:<agentId>:<key>``)."""


def principal_prefix(principal: str) -> str:
    """``xwm-<12 hex of SHA-256(principal)>-``: the start of every gateway session key of a principal."""
    tag = hashlib.sha256(principal.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return f"{wire.SESSION_KEY_PREFIX}{tag}-"


def scoped_key(principal: str, key: str) -> str:
    """``key`` inside the principal's namespace (unchanged when it already is)."""
    prefix = principal_prefix(principal)
    if key.startswith(prefix) and _PLAIN_ID.fullmatch(key[len(prefix) :]):
        return key
    if not _PLAIN_ID.fullmatch(key):
        key = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return prefix + key


def in_namespace(principal: str, event_key: str) -> bool:
    """Whether an event's (possibly canonicalised, ``agent:<id>:<key>``) session key is the principal's."""
    match = _SCOPED.fullmatch(event_key)
    return match is not None and match.group(1) == principal_prefix(principal)


def error_code(exc: GatewayError) -> str:
    """The turn error code of a gateway failure (docs/api.md "Turn error codes")."""
    if exc.code in ("OFFLINE", "SOCKET_CLOSED", "SOCKET_FAILURE", "CONNECT_TIMEOUT", "CONNECT_CHALLENGE_TIMEOUT"):
        return "GATEWAY_UNAVAILABLE"
    if exc.code == "RPC_TIMEOUT":
        return "GATEWAY_TIMEOUT"
    return "GATEWAY_ERROR"


class GatewayAdapter:
    """Implements ``ProviderAdapter`` for the configured gateway.

    Args:
        settings: the ``gateway:`` key.
        identity_file: the device key file (created when missing).
        version: the bridge's version.
    """

    def __init__(self, settings: GatewaySettings, identity_file: Path, *, version: str) -> None:
        self.info = ProviderInfo(
            provider_id=PROVIDER_ID, label="OpenClaw gateway", category="gateway", targets=("gateway",)
        )
        self.settings = settings
        self.client = GatewayClient(settings, identity_file, version=version)
        self.running = 0  # gateway-routed turns running now
        self._runs: dict[str, OrderedDict[str, None]] = {}  # principal -> its runIds, newest last

    def own_run(self, principal: str, run_id: str) -> None:
        """Record that ``principal`` started run ``run_id`` (its last :data:`MAX_OWNED_RUNS` are kept)."""
        runs = self._runs.setdefault(principal, OrderedDict())
        runs[run_id] = None
        runs.move_to_end(run_id)
        if len(runs) > MAX_OWNED_RUNS:
            runs.popitem(last=False)

    def owns_run(self, principal: str, run_id: str) -> bool:
        """Whether run ``run_id`` is one ``principal`` started (through a turn or a ``chat.send``)."""
        return run_id in self._runs.get(principal, ())

    def probe_cheap(self) -> ProbeResult:
        """``ok`` when configured: a probe never dials (the connection is made on demand)."""
        return ProbeResult("ok", self.settings.url)

    async def probe_full(self) -> ProbeResult:
        return self.probe_cheap()

    async def preflight(self, params: dict[str, Any]) -> None:
        """Nothing to refuse: the gateway takes the turn's text."""

    def open_session(self, session_id: str) -> GatewaySession:
        return GatewaySession(self)

    async def aclose(self) -> None:
        self.client.disconnect()


class _Run:
    """One run's events, as they arrive (called from the client's reader: never blocks)."""

    def __init__(self, key: str, run_id: str, sink: TurnSink) -> None:
        self.key = key
        self.run_id = run_id
        self.sink = sink
        self.text = ""  # the assistant text streamed so far
        self.terminal = anyio.Event()
        self.chat_state = ""
        self.error_message = ""
        self.stop_reason = ""
        self.usage: dict[str, Any] = {}
        self.tools: dict[str, dict[str, Any]] = {}
        self.sent = anyio.Event()  # chat.send was answered: the gateway knows the run

    def on_event(self, event: str, payload: Any, seq: int | None) -> None:
        if not isinstance(payload, dict) or payload.get("runId") != self.run_id:
            return
        if not wire.key_matches(str(payload.get("sessionKey") or ""), self.key):
            return
        if event == "chat":
            self._chat(payload)
        elif event == "agent":
            self._agent(payload)

    def extend(self, full: str) -> None:
        """Emit what ``full`` (the cumulative assistant text) adds to what was streamed."""
        if full.startswith(self.text) and len(full) > len(self.text):
            self.sink.emit(TextDelta(full[len(self.text) :]))
            self.text = full

    def _chat(self, payload: dict[str, Any]) -> None:
        state = str(payload.get("state") or "")
        if state == "status":
            phase = str(payload.get("phase") or "")
            if phase:
                self.sink.emit(StatusEvent("gateway_status", phase, {"phase": phase}))
            return
        full = wire.message_text(payload.get("message"))
        if full:
            self.extend(full)
        elif state == "delta" and isinstance(delta := payload.get("deltaText"), str) and delta:
            self.sink.emit(TextDelta(delta))
            self.text += delta
        if state in wire.TERMINAL_CHAT_STATES:
            self.chat_state = state
            self.stop_reason = str(payload.get("stopReason") or self.stop_reason)
            if isinstance(error := payload.get("errorMessage"), str):
                self.error_message = error
            self.terminal.set()

    def _agent(self, payload: dict[str, Any]) -> None:
        stream = payload.get("stream")
        data = as_dict(payload.get("data"))
        if stream == "usage":
            usage = {k: v for k, v in data.items() if k in _USAGE_KEYS and isinstance(v, int)}
            if usage:
                self.usage.update(usage)
                self.sink.emit(UsageEvent(dict(self.usage)))
        elif stream in ("tool", "item"):
            self._tool(stream, data)
        elif stream == "lifecycle" and data.get("phase") == "end":
            self.stop_reason = str(data.get("stopReason") or self.stop_reason)

    def _tool(self, stream: str, data: dict[str, Any]) -> None:
        call_id = data.get("toolCallId")
        if not isinstance(call_id, str) or not call_id or (stream == "item" and data.get("kind") != "tool"):
            return
        known = call_id in self.tools
        call = self.tools.setdefault(
            call_id, {"toolCallId": call_id, "title": str(data.get("name") or "tool"), "kind": "other"}
        )
        phase = data.get("phase")
        if stream == "item":
            if isinstance(data.get("title"), str):
                call["title"] = data["title"]
            if phase == "end":
                call["status"] = "completed" if data.get("status") == "completed" else "failed"
            else:
                call.setdefault("status", "in_progress")
        else:
            if "args" in data:
                call["rawInput"] = data["args"]
            if phase == "result":
                call["status"] = "failed" if data.get("isError") else "completed"
                result = as_dict(data.get("result"))
                text = wire.message_text(result)
                if text:
                    call["content"] = [{"type": "content", "content": {"type": "text", "text": text[:4000]}}]
            else:
                call.setdefault("status", "in_progress")
        self.sink.emit(ToolCallEvent(dict(call), is_update=known))


_USAGE_KEYS = ("inputTokens", "outputTokens", "totalTokens", "cachedReadTokens", "cachedWriteTokens")


class GatewaySession:
    """One bridge session's conversation on the gateway (its ``sessionKey``)."""

    def __init__(self, adapter: GatewayAdapter) -> None:
        self._adapter = adapter
        self._key: str | None = None
        self._run: _Run | None = None
        self._abort = anyio.Event()

    @property
    def upstream_session_id(self) -> str | None:
        return self._key

    def request_cancel(self) -> bool:
        """Send ``chat.abort`` for the running run; False before the run was sent."""
        if self._run is None:
            return False
        self._abort.set()
        return True

    async def aclose(self) -> None:
        self._abort.set()

    async def run_turn(self, request: TurnRequest, sink: TurnSink) -> TurnOutcome:
        adapter = self._adapter
        client, settings = adapter.client, adapter.settings
        key = self._key = scoped_key(request.principal, request.session_id)
        adapter.running += 1  # counted from here: a disconnect() meanwhile does not close its connection
        try:
            await client.ready(settings.connect_timeout)
        except GatewayError as exc:
            adapter.running -= 1
            return _failed(exc)
        run = _Run(key, request.turn_id, sink)
        adapter.own_run(request.principal, run.run_id)
        self._abort = anyio.Event()
        client.on_event.append(run.on_event)
        ended = False
        try:
            self._run = run
            sink.begin()
            outcome: TurnOutcome | None = None
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._abort_when_asked, run)
                outcome = await self._chat(request, run)
                tg.cancel_scope.cancel()
            assert outcome is not None
            ended = True
            return outcome
        finally:
            self._run = None
            adapter.running -= 1
            if not ended and run.sent.is_set():  # cut off: the run must not go on at the gateway
                with anyio.CancelScope(shield=True), anyio.move_on_after(ABORT_WAIT):
                    await self._send_abort(run)
            client.on_event.remove(run.on_event)

    async def _chat(self, request: TurnRequest, run: _Run) -> TurnOutcome:
        _client, settings = self._adapter.client, self._adapter.settings
        params: dict[str, Any] = {"sessionKey": run.key, "message": request.text_prompt(), "idempotencyKey": run.run_id}
        if settings.agent_id:
            params["agentId"] = settings.agent_id
        # chat.send is not cut short: once sent, the run exists at the gateway, and a cancel can
        # only abort it after the gateway answered with its runId (bounded by requestTimeout).
        sent: Any = None
        with anyio.CancelScope(shield=True):
            try:
                sent = await self._retrying("chat.send", params, settings.request_timeout)
            except GatewayError as exc:
                return _failed(exc)
        run.sent.set()
        if isinstance(sent, dict) and isinstance(sent.get("runId"), str) and sent["runId"] != run.run_id:
            run.run_id = sent["runId"]
            self._adapter.own_run(request.principal, run.run_id)
        wait_ms = int(settings.wait_timeout * 1000)
        while True:
            polled = anyio.current_time()
            try:
                waited = await self._retrying(
                    "agent.wait",
                    {"runId": run.run_id, "timeoutMs": wait_ms},
                    settings.wait_timeout + settings.request_timeout,
                )
            except GatewayError as exc:
                return _failed(exc, run)
            if not isinstance(waited, dict) or waited.get("status") != "timeout":
                break
            await anyio.sleep_until(polled + MIN_WAIT_POLL)
        waited = waited if isinstance(waited, dict) else {}
        if not run.terminal.is_set():
            with anyio.move_on_after(LATE_EVENTS_WAIT):
                await run.terminal.wait()
        reply = as_dict(waited.get("terminalReply"))
        if isinstance(text := reply.get("text"), str):
            run.extend(text)  # what the events missed (a reconnect meanwhile)
        status = waited.get("status")
        stop = str(waited.get("stopReason") or run.stop_reason or "")
        usage = dict(run.usage) or None
        common = {
            "stop_reason": stop or None,
            "usage": usage,
            "upstream_session_id": run.key,
            "run_id": run.run_id,
            "mode": MODE,
        }
        if self._abort.is_set() or run.chat_state == "aborted":
            return TurnOutcome("cancelled", **common)
        if status == "ok":
            return TurnOutcome("completed", **common)
        message = run.error_message or str(
            waited.get("error") or waited.get("errorMessage") or f"the gateway run ended {status}"
        )
        return TurnOutcome("failed", error=TurnError("GATEWAY_RUN_FAILED", message[:2000]), **common)

    async def _retrying(self, method: str, params: dict[str, Any], timeout: float) -> Any:
        """``method`` once, and once more after a reconnect when the socket dropped meanwhile
        (``chat.send`` carries its idempotency key, ``agent.wait`` only reads)."""
        client = self._adapter.client
        try:
            return await client.request(method, params, timeout)
        except GatewayError as exc:
            if exc.code not in ("SOCKET_CLOSED", "OFFLINE") or self._abort.is_set():
                raise
        await client.ready(self._adapter.settings.connect_timeout)
        return await client.request(method, params, timeout)

    async def _abort_when_asked(self, run: _Run) -> None:
        await self._abort.wait()
        await run.sent.wait()  # the gateway knows the run only once chat.send was answered
        await self._send_abort(run)

    async def _send_abort(self, run: _Run) -> None:
        try:
            await self._adapter.client.request("chat.abort", {"sessionKey": run.key, "runId": run.run_id})
        except GatewayError as exc:
            log.warning("gateway: chat.abort of run %s failed: %s", run.run_id, exc.message)


def _failed(exc: GatewayError, run: _Run | None = None) -> TurnOutcome:
    data: dict[str, Any] = {"gatewayCode": exc.code}
    if exc.detail_code:
        data["detailCode"] = exc.detail_code
    extra: dict[str, Any] = {"mode": MODE}
    if run is not None:
        extra.update(run_id=run.run_id, upstream_session_id=run.key)
    return TurnOutcome("failed", error=TurnError(error_code(exc), exc.message, data), **extra)
