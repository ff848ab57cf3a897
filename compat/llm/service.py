"""``LlmService``: one-shot model calls on host-held runtimes (docs/api.md "Model calls").

A call is gated (``compat.llm.gate``), counted against its principal's ``llm.callsPerMinute``,
routed (image input to ``llm.vision`` when the chosen runtime takes none), and sent with one
pooled HTTP client per runtime. On HTTP 5xx, 429 or a connection failure it moves on to the next
runtime of ``llm.fallback`` (at most ``llm.maxAttempts`` runtimes); a runtime that answered
``Retry-After`` is not asked again before that time has passed. Every wait is within the call's
timeout: the request's ``timeout`` (capped by ``llm.maxTimeoutSeconds``), else the runtime's,
else ``llm.timeoutSeconds``.

Each call writes one INFO line (principal, purpose, schema name, provider, model, tokens,
duration), never the prompt or the reply.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio

from bridge.rpc.errors import InvalidParams, LimitReached, ModelCallFailed
from bridge.rpc.redact import redact, register_secret
from compat import tracing
from compat.llm import structured, wire
from compat.llm.gate import Gate
from compat.llm.settings import LlmSettings, ModelRuntime
from compat.llm.wire import Call, JsonRequest, Reply
from compat.telemetry import METRICS

if TYPE_CHECKING:
    import httpx

    from compat.llm.params import CompleteParams, StructuredParams

log = logging.getLogger(__name__)
WINDOW_SECONDS = 60.0
MAX_RETRY_AFTER = 600.0
"""Seconds of a ``Retry-After`` that are honoured at most."""


class _Failure(Exception):
    """One runtime's attempt failed; ``retryable``: the next runtime may be asked."""

    def __init__(self, reason: str, message: str, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.reason, self.message, self.status, self.retryable = reason, message, status, retryable


class LlmService:
    """The ``llm.*`` methods.

    Args:
        settings: ``llm:``.
        gate: the ``principals`` table.

    Use ``await service.aclose()`` when done (closes the HTTP clients).
    """

    def __init__(self, settings: LlmSettings, gate: Gate | None = None) -> None:
        self.settings = settings
        self.gate = gate or Gate()
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._keys: dict[str, str] = {}  # runtime id -> an API key set at run time (knowledge registry)
        self._calls: dict[str, deque[float]] = {}  # principal -> monotonic times of its recent calls
        self._cooling: dict[str, float] = {}  # runtime id -> monotonic time its Retry-After ends
        self._closing: list[httpx.AsyncClient] = []  # clients of replaced entries, closed with the rest
        self._slots: anyio.CapacityLimiter | None = None
        self._checks: anyio.CapacityLimiter | None = None
        for runtime in settings.runtimes:
            if runtime.api_key_env:
                key = os.environ.get(runtime.api_key_env) or ""
                register_secret(key)
                register_secret(key.strip())  # the value sent: an env file's trailing newline is not

    @property
    def available(self) -> bool:
        return self.settings.default_runtime is not None

    # ---- the runtime table, as the knowledge registry edits it --------------------------------------

    def set_runtime(
        self, runtime_id: str, *, base_url: str, model: str, timeout_seconds: float | None, api_key: str
    ) -> None:
        """Point entry ``runtime_id`` at ``base_url`` / ``model`` with ``api_key`` (an OpenAI-compatible
        runtime; created when there is none: ``knowledge.sources.select`` with ``runtime``)."""
        old = self.settings.runtime(runtime_id)
        entry = ModelRuntime(
            id=runtime_id,
            kind="openai",
            base_url=base_url,
            model=model,
            timeout_seconds=timeout_seconds,
            images=old.images if old else False,
            image_urls=old.image_urls if old else False,
            max_tokens=old.max_tokens if old else 4096,
            default=old.default if old else False,
        )
        self._replace(runtime_id, entry)
        self._keys[runtime_id] = api_key
        register_secret(api_key)

    def restore_runtime(self, runtime_id: str, entry: ModelRuntime | None) -> None:
        """Put entry ``runtime_id`` back as configured (``entry``; None removes it)."""
        self._replace(runtime_id, entry)
        self._keys.pop(runtime_id, None)

    def _replace(self, runtime_id: str, entry: ModelRuntime | None) -> None:
        import msgspec

        runtimes = [r for r in self.settings.runtimes if r.id != runtime_id]
        if entry is not None:
            at = next((i for i, r in enumerate(self.settings.runtimes) if r.id == runtime_id), len(runtimes))
            runtimes.insert(at, entry)
        self.settings = msgspec.structs.replace(self.settings, runtimes=tuple(runtimes))
        client = self._clients.pop(runtime_id, None)
        if client is not None:
            self._closing.append(client)

    # ---- the methods ----------------------------------------------------------------------------------

    async def complete(self, principal: str, params: CompleteParams) -> dict[str, Any]:
        """``llm.complete`` → ``{text, provider, model, usage, audit}``.

        Raises:
            LlmOverrideDenied: -32007 (the gate); NotFound: -32004, no runtime is configured;
            InvalidParams: -32602, an unknown provider, images no runtime takes;
            LimitReached: -32006, ``llm.callsPerMinute``; ModelCallFailed: -32008.
        """
        messages = [m.model_dump(by_alias=False, exclude_none=True) for m in params.messages]
        for message in messages:  # the wire's image part key is image_url whatever the alias
            if isinstance(message["content"], list):
                message["content"] = [_part(p) for p in message["content"]]
        reply, runtime, attempts = await self._run(principal, params, messages, None)
        return self._result(principal, params, reply, runtime, attempts, None)

    async def complete_structured(self, principal: str, params: StructuredParams) -> dict[str, Any]:
        """``llm.completeStructured`` → the ``llm.complete`` result plus ``contentType`` (``json`` /
        ``text``), ``parsed`` and, when JSON was asked for and the reply is not valid JSON of the
        schema, ``error: {code: STRUCTURED_OUTPUT_INVALID, message}``.

        Raises:
            InvalidParams: -32602, also a ``jsonSchema`` refused by ``structured.check_schema``;
            the rest as :meth:`complete`.
        """
        system = "\n\n".join(p for p in (params.system_prompt, params.instructions) if p and p.strip())
        content: list[dict[str, Any]] = []
        for block in params.input:
            if block.type == "text":
                content.append({"type": "text", "text": block.text})
            else:
                url = block.url or f"data:{block.mime_type};base64,{''.join((block.data or '').split())}"
                content.append({"type": "image_url", "image_url": {"url": url}})
        messages = [{"role": "system", "content": system}, {"role": "user", "content": content}]
        wants_json = params.json_schema is not None or params.json_mode
        json_request = JsonRequest(params.json_schema, params.schema_name or "result") if wants_json else None
        reply, runtime, attempts = await self._run(principal, params, messages, json_request, params.json_schema)
        result = self._result(principal, params, reply, runtime, attempts, params.schema_name)
        result.update(contentType="text", parsed=None)
        if json_request is None:
            return result
        try:
            value = structured.parse_reply(reply.text)
            if params.json_schema is not None:
                await structured.validate(params.json_schema, value, self._validation_slots())
        except structured.OutputInvalid as exc:
            result["error"] = {"code": "STRUCTURED_OUTPUT_INVALID", "message": str(exc)[:1000]}
            return result
        result.update(contentType="json", parsed=value)
        return result

    # ---- one call ---------------------------------------------------------------------------------------

    async def _run(
        self,
        principal: str,
        params: Any,
        messages: list[dict[str, Any]],
        json_request: JsonRequest | None,
        schema: dict[str, Any] | None = None,
    ) -> tuple[Reply, ModelRuntime, list[dict[str, Any]]]:
        runtime, model = self.gate.choose(self.settings, principal, params.provider, params.model)
        self._count(principal)
        if schema is not None:  # after the gate and the count: checking a schema costs CPU
            await structured.check_schema(schema, self._validation_slots())
        images = [
            p for m in messages if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image_url"
        ]
        urls = any(not p["image_url"]["url"].startswith("data:") for p in images)
        if images and not runtime.images:
            vision = self.settings.runtime(self.settings.vision) if self.settings.vision else None
            if vision is None or not vision.images:
                raise InvalidParams(
                    f"the input has images and runtime {runtime.id} takes none; no vision runtime is configured "
                    "(llm.vision)",
                    field="input",
                    reason="VISION_UNAVAILABLE",
                )
            runtime, model = vision, vision.model
        if urls and not runtime.image_urls:
            raise InvalidParams(
                f"runtime {runtime.id} cannot take image URLs (the bridge never fetches one); send the image as data",
                field="input",
                reason="IMAGE_URL_UNSUPPORTED",
            )
        chain = [(runtime, model)] + [
            (r, r.model)
            for name in dict.fromkeys(self.settings.fallback)  # each runtime once
            if (r := self.settings.runtime(name)) is not None
            and r.id != runtime.id
            and (not images or r.images)
            and (not urls or r.image_urls)
        ]
        chain = chain[: self.settings.max_attempts]
        timeout = min(
            params.timeout or runtime.timeout_seconds or self.settings.timeout_seconds,
            self.settings.max_timeout_seconds,
        )
        attempts: list[dict[str, Any]] = []
        asking = [runtime.id]  # the runtime being asked (its last entry)
        try:
            with anyio.fail_after(timeout):
                async with self._call_slots():
                    reply, used = await self._chain(chain, params, messages, json_request, attempts, asking)
        except TimeoutError:
            attempts.append({"provider": asking[-1], "reason": "timeout"})
            raise ModelCallFailed(
                f"the model call took longer than {timeout:g} s (timeout)",
                reason="timeout",
                provider=asking[-1],
                attempts=attempts,
            ) from None
        return reply, used, attempts

    async def _chain(
        self,
        chain: Sequence[tuple[ModelRuntime, str]],
        params: Any,
        messages: list[dict[str, Any]],
        json_request: JsonRequest | None,
        attempts: list[dict[str, Any]],
        asking: list[str],
    ) -> tuple[Reply, ModelRuntime]:
        last: _Failure | None = None
        for index, (runtime, model) in enumerate(chain):
            asking.append(runtime.id)
            wait = self._cooling.get(runtime.id, 0.0) - time.monotonic()
            if wait > 0:
                if index + 1 < len(chain):  # a later runtime can answer now
                    attempts.append({"provider": runtime.id, "reason": "retry_after", "retryAfter": round(wait, 3)})
                    continue
                if anyio.current_time() + wait >= anyio.current_effective_deadline():
                    # the pause outlasts the call's timeout: fail now instead of holding a slot till then
                    attempts.append({"provider": runtime.id, "reason": "retry_after", "retryAfter": round(wait, 3)})
                    last = _Failure(
                        "retry_after", f"runtime {runtime.id} asked for a pause of {wait:.0f} s (Retry-After)"
                    )
                    break
                await anyio.sleep(wait)  # the last one: wait (within the call's timeout)
            max_tokens = min(params.max_tokens or runtime.max_tokens, runtime.max_tokens)
            call = Call(messages, model, max_tokens, params.temperature, json_request)
            try:
                attributes = {"xworkmate.runtime": runtime.id, "gen_ai.request.model": model}
                with tracing.span("model.call", attributes) as span:
                    reply = await self._post(runtime, call)
                    tracing.annotate(span, **{"gen_ai.usage.output_tokens": reply.usage.get("outputTokens")})
            except _Failure as failure:
                METRICS.model_calls.inc(runtime.id, failure.reason)
                attempt: dict[str, Any] = {"provider": runtime.id, "reason": failure.reason}
                if failure.status is not None:
                    attempt["httpStatus"] = failure.status
                attempts.append(attempt)
                last = failure
                if not failure.retryable:
                    break
            else:
                METRICS.model_calls.inc(runtime.id, "ok")
                METRICS.tokens(runtime.id, reply.usage)
                return reply, runtime
        assert last is not None or attempts
        failure = last or _Failure("retry_after", "every runtime asked for a pause (Retry-After)")
        data: dict[str, Any] = {"reason": failure.reason, "provider": attempts[-1]["provider"], "attempts": attempts}
        if failure.status is not None:
            data["httpStatus"] = failure.status
        raise ModelCallFailed(redact(failure.message), **data)

    async def _post(self, runtime: ModelRuntime, call: Call) -> Reply:
        import httpx

        key = self._keys.get(runtime.id) or (
            os.environ.get(runtime.api_key_env, "").strip() if runtime.api_key_env else ""
        )
        client = self._client(runtime)
        try:
            async with client.stream(
                "POST", wire.endpoint(runtime), json=wire.body(runtime, call), headers=wire.headers(runtime, key)
            ) as resp:
                raw = await _read_capped(resp)
                if resp.status_code != 200:
                    # redacted whole, before error_message cuts it: a cut key would pass the redactor
                    detail = wire.error_message(redact((raw or b"")[:65536].decode("utf-8", "replace")))
                    status = resp.status_code
                    if status == 429 or status >= 500:
                        delay = wire.retry_after(resp.headers.get("retry-after"))
                        if delay is not None:
                            self._cooling[runtime.id] = time.monotonic() + min(delay, MAX_RETRY_AFTER)
                    message = f"runtime {runtime.id} answered HTTP {status}" + (f": {detail}" if detail else "")
                    raise _Failure("http_status", message, status, retryable=status == 429 or status >= 500)
        except httpx.TimeoutException as exc:
            raise _Failure("connect", f"runtime {runtime.id} timed out: {type(exc).__name__}", retryable=True) from exc
        except httpx.HTTPError as exc:
            raise _Failure(
                "connect", f"cannot reach runtime {runtime.id}: {type(exc).__name__}", retryable=True
            ) from exc
        if raw is None:
            raise _Failure("invalid_reply", f"runtime {runtime.id}'s reply is larger than {wire.MAX_REPLY_BYTES} bytes")
        try:
            return wire.parse(runtime, json.loads(raw))
        except (ValueError, RecursionError) as exc:  # json's and wire.ReplyInvalid; "[[[…" nests too deep
            raise _Failure("invalid_reply", f"runtime {runtime.id}'s reply is unusable: {str(exc)[:300]}") from exc

    def _client(self, runtime: ModelRuntime) -> httpx.AsyncClient:
        client = self._clients.get(runtime.id)
        if client is None:
            import httpx  # here: a bridge whose clients never call llm.* never needs it

            client = self._clients[runtime.id] = httpx.AsyncClient(
                follow_redirects=False, timeout=None, event_hooks={"request": [tracing.httpx_request_hook]}
            )
        return client

    def _call_slots(self) -> anyio.CapacityLimiter:
        if self._slots is None:
            self._slots = anyio.CapacityLimiter(self.settings.max_concurrent_calls)
        return self._slots

    def _validation_slots(self) -> anyio.CapacityLimiter:
        if self._checks is None:
            self._checks = anyio.CapacityLimiter(2)
        return self._checks

    def _count(self, principal: str) -> None:
        """Count one call of ``principal``.

        Raises:
            LimitReached: -32006, ``llm.callsPerMinute`` calls in the last 60 s (``data.retryAfter``
                in seconds).
        """
        limit = self.settings.calls_per_minute
        now = time.monotonic()
        calls = self._calls.setdefault(principal, deque(maxlen=limit))
        if len(calls) == limit and now - calls[0] < WINDOW_SECONDS:
            after = math.ceil(WINDOW_SECONDS - (now - calls[0]))
            raise LimitReached(
                f"{principal} made {limit} model calls in the last minute (llm.callsPerMinute)",
                limit="llm.callsPerMinute",
                value=limit,
                retryAfter=after,
            )
        calls.append(now)

    # ---- results ----------------------------------------------------------------------------------------

    def _result(
        self,
        principal: str,
        params: Any,
        reply: Reply,
        runtime: ModelRuntime,
        attempts: list[dict[str, Any]],
        schema_name: str | None,
    ) -> dict[str, Any]:
        usage: dict[str, Any] = dict(reply.usage)
        if "totalTokens" not in usage and ("inputTokens" in usage or "outputTokens" in usage):
            usage["totalTokens"] = usage.get("inputTokens", 0) + usage.get("outputTokens", 0)
        if reply.cost is not None:
            usage["cost"] = {"amount": reply.cost, "currency": "USD"}
        elif (cost := self.cost(reply.model, usage)) is not None:
            usage["cost"] = cost
        audit = {
            "principal": principal,
            "purpose": params.purpose,
            "schemaName": schema_name,
            "provider": runtime.id,
            "model": reply.model,
        }
        result: dict[str, Any] = {
            "text": reply.text,
            "provider": runtime.id,
            "model": reply.model,
            "usage": usage,
            "audit": audit,
        }
        if attempts:
            result["fallbackFrom"] = [a["provider"] for a in attempts]
        log.info(
            "llm call principal=%s purpose=%s schemaName=%s provider=%s model=%s tokens=%s",
            principal,
            json.dumps(params.purpose),
            schema_name or "-",
            runtime.id,
            reply.model,
            usage.get("totalTokens", "-"),
        )
        return result

    def cost(self, model: str, usage: dict[str, Any]) -> dict[str, Any] | None:
        """``{amount, currency}`` for ``usage`` from ``llm.prices[model]``, or None without a price."""
        price = self.settings.prices.get(model)
        if price is None:
            return None
        cached = usage.get("cachedReadTokens", 0) if price.cached_read_per_million is not None else 0
        amount = (
            (usage.get("inputTokens", 0) - cached) * price.input_per_million
            + cached * (price.cached_read_per_million or 0.0)
            + usage.get("outputTokens", 0) * price.output_per_million
        ) / 1_000_000
        return {"amount": round(amount, 8), "currency": price.currency}

    async def aclose(self) -> None:
        """Close every HTTP client (bounded, shielded)."""
        clients = [*self._clients.values(), *self._closing]
        self._clients, self._closing = {}, []
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            for client in clients:
                await client.aclose()


def _part(part: dict[str, Any]) -> dict[str, Any]:
    if part.get("type") == "image_url":
        return {"type": "image_url", "image_url": {"url": part["image_url"]["url"]}}
    return {"type": "text", "text": part.get("text", "")}


async def _read_capped(resp: httpx.Response) -> bytes | None:
    """The body, or None when it is larger than ``wire.MAX_REPLY_BYTES``."""
    body = bytearray()
    async for chunk in resp.aiter_bytes():
        body += chunk
        if len(body) > wire.MAX_REPLY_BYTES:
            return None
    return bytes(body)
