"""JSON-RPC dispatch shared by every transport (JSON-RPC 2.0 §4-§6; docs/api.md "Precise rules").

A transport hands each frame to :meth:`Dispatcher.serve_frame` with the frame's
``EnvelopeStream`` and a task group it owns. Requests are admitted in the order they are read
(array order in a batch). A method declared ``inline`` (``bridge.methods``) runs right there, on
the reader, and is answered before the next frame is read; every other request becomes a task,
and asyncio starts tasks in creation order, so a handler's synchronous prefix (for example,
queueing a turn on its session) runs in arrival order. Then they run concurrently, so a long
``session.start`` never blocks a ``session.cancel`` on the same socket.

This module is the one place where an exception becomes a wire error.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskGroup

from bridge.rpc import logctx
from bridge.rpc.codec import Frame, Invalid, Reply, Request, Response, parse_frame
from bridge.rpc.errors import InternalError, InvalidParams, InvalidRequest, LimitReached, MethodNotFound, RpcError
from bridge.rpc.redact import redact
from bridge.rpc.stream import EnvelopeStream
from compat import tracing
from compat.telemetry import METRICS

log = logging.getLogger(__name__)

Notify = Callable[[str, Any], None]
Observer = Callable[[Request, str, Reply, float], None]
"""Called after each request with its principal, its reply and its duration in seconds
(``bridge.audit.RequestLog``); it must not block."""


def _discard(method: str, params: Any) -> None:
    """Notifications on a plain HTTP response have nowhere to go (docs/api.md, POST /acp/rpc)."""


class CallContext(msgspec.Struct):  # one per HTTP request: see bridge.rpc.codec on structs
    """Who called, and where this request's notifications go.

    Attributes:
        principal: the authenticated token's name (``local`` when auth is off).
        notify: sends a notification on the stream that carries this request's reply; never blocks.
        connection_id: names the stream (a WebSocket connection, an HTTP request, the stdio
            process): in logs, and for a session's subscribers.
        closers: run when the stream closes (a subscription ends there); None on a plain HTTP
            response, which carries nothing after its reply.
        backlog: the bytes the stream has queued and not yet sent.
        until_idle: the stream ends with the reply (SSE): ``session.subscribe`` answers once the
            running turn ended.
        last_event_id: the SSE ``Last-Event-ID`` request header (``<sessionId>:<seq>``).
    """

    principal: str = "local"
    notify: Notify = _discard
    connection_id: str = "-"
    closers: list[Callable[[], None]] | None = None
    backlog: Callable[[], int] | None = None
    until_idle: bool = False
    last_event_id: str | None = None


def run_closers(closers: list[Callable[[], None]]) -> None:
    """Run a stream's close hooks (each once; one that raises is logged, the others still run)."""
    while closers:
        try:
            closers.pop()()
        except Exception:
            log.exception("a stream's close hook failed")


class Method(msgspec.Struct, frozen=True):
    """One method as the dispatcher runs it.

    Attributes:
        name: the wire name.
        handler: ``handler(params, ctx) -> result``: a plain function when ``inline``, else a
            coroutine function. It raises an ``RpcError`` for a request that cannot run; any
            other exception is -32603.
        inline: runs on the reader, in arrival order, with no task of its own (it never waits).
        params: validates the raw params object into what the handler takes (raises
            ``InvalidParams``); None passes the dict as it is.
    """

    name: str
    handler: Callable[[Any, CallContext], Any]
    inline: bool = False
    params: Callable[[dict[str, Any]], Any] | None = None


def _annotate(span: Any, reply: Reply) -> None:
    if span is not None and reply.error is not None:
        code = reply.error.get("code")
        tracing.annotate(span, **{"rpc.jsonrpc.error_code": code if isinstance(code, int) else None})


def _params(request: Request) -> dict[str, Any]:
    if request.params is None:
        return {}
    if not isinstance(request.params, dict):
        raise InvalidParams("Invalid params: params must be an object")
    return request.params


class Dispatcher:
    """Runs frames against a table of methods.

    Args:
        methods: the methods (``bridge.methods.build_dispatcher`` binds the registry's).
        max_batch_size: ``limits.maxBatchSize``: a longer batch is answered with one -32006 error
            (``id: null``) and none of its requests runs.
        max_batch_reply_bytes: ``limits.maxBatchReplyBytes``: a batch whose replies together are
            larger gets one -32006 error instead of them.

    Raises:
        TypeError: a method's ``inline`` does not match its handler (``def`` vs ``async def``).
    """

    def __init__(
        self,
        methods: Iterable[Method],
        *,
        max_batch_size: int = 100,
        max_batch_reply_bytes: int = 32 * 1024 * 1024,
        observer: Observer | None = None,
    ) -> None:
        self._observer = observer
        self._max_batch = max_batch_size
        self._max_batch_reply = max_batch_reply_bytes
        self._methods: dict[str, Method] = {}
        for method in methods:
            if method.inline == inspect.iscoroutinefunction(method.handler):
                kind = "an async" if method.inline else "a plain"
                raise TypeError(f"{method.name}: declared inline={method.inline} but its handler is {kind} function")
            self._methods[method.name] = method

    @property
    def methods(self) -> list[str]:
        return list(self._methods)

    async def call(self, request: Request, ctx: CallContext) -> Reply | None:
        """Run one request; returns its reply, or None for a notification (never answered)."""
        method = self._methods.get(request.method)
        if method is not None and method.inline:
            return self.call_now(request, ctx, method)
        started = time.monotonic()
        ids = logctx.bind(requestId=request.id, principal=ctx.principal)
        try:
            with tracing.span(*self._span(request), server=True) as span:
                try:
                    if method is None:
                        raise MethodNotFound(f"Method not found: {request.method[:200]}", method=request.method[:200])
                    result = await method.handler(self._validated(method, request), ctx)
                except Exception as exc:
                    reply = self._failed(request, exc)
                else:
                    reply = Reply(request.id, result=result)
                _annotate(span, reply)
        finally:
            logctx.unbind(ids)
        self._observe(request, ctx, reply, started)
        return self._answer(request, reply)

    def call_now(self, request: Request, ctx: CallContext, method: Method) -> Reply | None:
        """``call`` for an inline method, without awaiting."""
        started = time.monotonic()
        ids = logctx.bind(requestId=request.id, principal=ctx.principal)
        try:
            with tracing.span(*self._span(request), server=True) as span:
                try:
                    reply = Reply(request.id, method.handler(self._validated(method, request), ctx))
                except Exception as exc:
                    reply = self._failed(request, exc)
                _annotate(span, reply)
        finally:
            logctx.unbind(ids)
        self._observe(request, ctx, reply, started)
        return self._answer(request, reply)

    def _label(self, request: Request) -> str:
        """The method's name for metrics and spans: unknown methods are ``other``, so a client
        cannot make names up."""
        return request.method if request.method in self._methods else "other"

    def _span(self, request: Request) -> tuple[str, dict[str, str]]:
        """A request span's name and attributes (OpenTelemetry's RPC conventions)."""
        method = self._label(request)
        return f"rpc {method}", {"rpc.system": "jsonrpc", "rpc.method": method}

    def _observe(self, request: Request, ctx: CallContext, reply: Reply, started: float) -> None:
        seconds = time.monotonic() - started
        method = self._label(request)
        error = reply.error
        if error is None:
            METRICS.requests.inc(method, "ok")
        else:
            raw = error.get("data")
            data: dict[str, Any] = raw if isinstance(raw, dict) else {}
            name = str(data.get("code") or error.get("code"))[:64]
            METRICS.requests.inc(method, name)
            if name == "LIMIT_REACHED":
                METRICS.limit_refusals.inc(str(data.get("limit") or "other")[:64])
            elif name == "SESSION_BUSY":
                METRICS.limit_refusals.inc(f"session:{str(data.get('reason') or 'busy')[:32]}")
        METRICS.request_seconds.observe(seconds, method)
        if self._observer is not None:
            try:
                self._observer(request, ctx.principal, reply, seconds)
            except Exception:
                log.exception("the request log failed")

    @staticmethod
    def _validated(method: Method, request: Request) -> Any:
        raw = _params(request)
        return method.params(raw) if method.params is not None else raw

    def _failed(self, request: Request, exc: Exception) -> Reply:
        if isinstance(exc, RpcError):
            return Reply.from_error(request.id, exc)
        log.error("method %s failed", request.method, exc_info=exc)  # one place: -32603 without its text
        return Reply.from_error(request.id, InternalError())

    @staticmethod
    def _answer(request: Request, reply: Reply) -> Reply | None:
        if request.is_notification:
            if reply.error is not None:
                log.info("notification %s failed: %s", request.method, redact(reply.error["message"]))
            return None
        return reply

    def serve_frame(self, data: bytes | str | Frame, stream: EnvelopeStream, ctx: CallContext, tg: TaskGroup) -> None:
        """Parse ``data`` (unless the transport already did) and start its requests in ``tg``;
        replies go to ``stream``.

        Frame-level errors (-32700 not JSON, -32600 empty batch) are answered at once with
        ``id: null``. A batch's replies are sent as one array once all its requests finished;
        a batch of only notifications sends nothing.
        """
        frame = self._parse(data, stream)
        if frame is None:
            return
        if frame.is_batch:
            tg.start_soon(self._run_batch, frame.messages, stream, ctx)
            return
        message = frame.messages[0]
        if not isinstance(message, Request):
            stream.reply(_not_a_request(message))
            return
        method = self._methods.get(message.method)
        if method is not None and method.inline:
            reply = self.call_now(message, ctx, method)
            if reply is not None:
                stream.reply(reply)
        else:
            tg.start_soon(self._run_single, message, stream, ctx)

    async def run_frame(self, data: bytes | str | Frame, stream: EnvelopeStream, ctx: CallContext) -> None:
        """``serve_frame`` in the calling task: returns once every reply of ``data`` is on
        ``stream``. For transports with one frame per exchange (an HTTP request): a single
        request runs in the calling task, since the response waits for it anyway."""
        frame = self._parse(data, stream)
        if frame is None:
            return
        if frame.is_batch:
            await self._run_batch(frame.messages, stream, ctx)
            return
        message = frame.messages[0]
        if not isinstance(message, Request):
            stream.reply(_not_a_request(message))
            return
        reply = await self.call(message, ctx)
        if reply is not None:
            stream.reply(reply)

    @staticmethod
    def _parse(data: bytes | str | Frame, stream: EnvelopeStream) -> Frame | None:
        """``data`` as a frame; None when it was answered with a frame-level error instead."""
        if isinstance(data, Frame):
            return data
        try:
            return parse_frame(data)
        except RpcError as exc:
            stream.reply(Reply.from_error(None, exc))
            return None

    async def _run_single(self, request: Request, stream: EnvelopeStream, ctx: CallContext) -> None:
        reply = await self.call(request, ctx)
        if reply is not None:
            stream.reply(reply)

    async def _run_batch(self, messages: tuple[Any, ...], stream: EnvelopeStream, ctx: CallContext) -> None:
        if len(messages) > self._max_batch:
            error = LimitReached(
                f"the batch has {len(messages)} elements; maxBatchSize is {self._max_batch}",
                limit="maxBatchSize",
                value=self._max_batch,
            )
            stream.reply(Reply.from_error(None, error))
            return
        replies: list[Reply | None] = [None] * len(messages)

        async def run(index: int, request: Request) -> None:
            replies[index] = await self.call(request, ctx)

        async with anyio.create_task_group() as batch_tg:
            for index, message in enumerate(messages):
                if isinstance(message, Request):
                    batch_tg.start_soon(run, index, message)
                else:
                    replies[index] = _not_a_request(message)
        stream.batch([r for r in replies if r is not None], self._max_batch_reply)


def _not_a_request(message: Invalid | Response) -> Reply:
    """A client's message that is not a request: its error, or -32600 for a response (the bridge
    sends clients no requests, so no response can be expected)."""
    if isinstance(message, Invalid):
        return Reply.from_error(message.id, message.error)
    return Reply.from_error(message.id, InvalidRequest("Invalid Request: method must be a non-empty string"))
