"""JSON-RPC dispatch shared by every transport (JSON-RPC 2.0 §4-§6; docs/api.md "Precise rules").

A transport hands each frame to ``Dispatcher.serve_frame`` with the frame's ``EnvelopeStream`` and a
task group it owns. Requests are admitted in the order they are read (array order in a batch): each
becomes a task, and asyncio starts tasks in creation order, so a handler's synchronous prefix (for
example, queueing a turn on its session) runs in that order. Then they run concurrently, so a long
``session.start`` never blocks a ``session.cancel`` on the same socket.

This module is the one place where an exception becomes a wire error.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskGroup

from bridge.rpc.codec import MISSING, Frame, Invalid, Reply, Request, parse_frame
from bridge.rpc.errors import InternalError, InvalidParams, MethodNotFound, RpcError
from bridge.rpc.redact import redact
from bridge.rpc.stream import EnvelopeStream

log = logging.getLogger(__name__)

Notify = Callable[[str, Any], None]


def _params(request: Request) -> dict[str, Any]:
    if request.params is None:
        return {}
    if not isinstance(request.params, dict):
        raise InvalidParams("Invalid params: params must be an object")
    return request.params


def _discard(method: str, params: Any) -> None:
    """Notifications on a plain HTTP response have nowhere to go (docs/api.md, POST /acp/rpc)."""


class CallContext(msgspec.Struct):  # one per HTTP request: see bridge.rpc.codec on structs
    """Who called, and where this request's notifications go.

    Attributes:
        principal: the authenticated token's name (``local`` when auth is off).
        notify: sends a notification on the stream that carries this request's reply; never blocks.
        connection_id: a label for logs.
    """

    principal: str = "local"
    notify: Notify = _discard
    connection_id: str = "-"


Handler = Callable[[dict[str, Any], CallContext], Awaitable[Any]]
ImmediateHandler = Callable[[dict[str, Any], CallContext], Any]
"""A handler that never waits (``acp.capabilities``, ``session.cancel``, …): it runs in the
reader, in arrival order, with no task of its own."""


class Dispatcher:
    """Maps method names to handlers and runs frames.

    Args:
        handlers: ``{method: async handler(params, ctx) -> result}``. A handler raises an
            ``RpcError`` for a request that cannot run (``InvalidParams`` for params that fail
            validation: compat.params); any other exception is -32603.
    """

    def __init__(
        self, handlers: Mapping[str, Handler], immediate: Mapping[str, ImmediateHandler] | None = None
    ) -> None:
        self._handlers = dict(handlers)
        self._immediate = dict(immediate or {})

    @property
    def methods(self) -> list[str]:
        return sorted({*self._handlers, *self._immediate})

    async def call(self, request: Request, ctx: CallContext) -> Reply | None:
        """Run one request; returns its reply, or None for a notification (never answered)."""
        if request.method in self._immediate:
            return self.call_now(request, ctx)
        try:
            handler = self._handlers.get(request.method)
            if handler is None:
                raise MethodNotFound(f"Method not found: {request.method[:200]}", method=request.method[:200])
            result = await handler(_params(request), ctx)
        except Exception as exc:
            return self._failed(request, exc)
        return self._answer(request, Reply(request.id, result=result))

    def call_now(self, request: Request, ctx: CallContext) -> Reply | None:
        """``call`` for an immediate method, without awaiting."""
        try:
            result = self._immediate[request.method](_params(request), ctx)
        except Exception as exc:
            return self._failed(request, exc)
        return None if request.id is MISSING else Reply(request.id, result)

    def _failed(self, request: Request, exc: Exception) -> Reply | None:
        if isinstance(exc, RpcError):
            reply = Reply.from_error(request.id, exc)
        else:  # one place: unexpected failures become -32603 without their text
            log.error("method %s failed", request.method, exc_info=exc)
            reply = Reply.from_error(request.id, InternalError())
        return self._answer(request, reply)

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
        if isinstance(message, Invalid):
            stream.reply(Reply.from_error(message.id, message.error))
        elif message.method in self._immediate:
            # A task per request was a fifth of the bridge's CPU for acp.capabilities
            # (bench case 1 profile: anyio TaskGroup.start_soon 21.7%); a method that never
            # waits gains nothing from one.
            reply = self.call_now(message, ctx)
            if reply is not None:
                stream.reply(reply)
        else:
            tg.start_soon(self._run_single, message, stream, ctx)

    async def run_frame(self, data: bytes | str | Frame, stream: EnvelopeStream, ctx: CallContext) -> None:
        """``serve_frame`` in the calling task: returns once every reply of ``data`` is on
        ``stream``. For transports with one frame per exchange (an HTTP request).

        A single request runs here rather than in a task of its own: for ``POST /acp/rpc`` the
        task group around it was a fifth of the bridge's CPU per request (bench case 2 profile,
        anyio ``create_task_group`` + ``TaskGroup.__aexit__``) and bought nothing, since the
        response waits for that one reply anyway. A batch still runs its requests concurrently.
        """
        frame = self._parse(data, stream)
        if frame is None:
            return
        if frame.is_batch:
            await self._run_batch(frame.messages, stream, ctx)
            return
        message = frame.messages[0]
        if isinstance(message, Invalid):
            stream.reply(Reply.from_error(message.id, message.error))
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

    async def _run_batch(self, messages: tuple, stream: EnvelopeStream, ctx: CallContext) -> None:
        replies: list[Reply | None] = [None] * len(messages)

        async def run(index: int, request: Request) -> None:
            replies[index] = await self.call(request, ctx)

        async with anyio.create_task_group() as batch_tg:
            for index, message in enumerate(messages):
                if isinstance(message, Invalid):
                    replies[index] = Reply.from_error(message.id, message.error)
                else:
                    batch_tg.start_soon(run, index, message)
        stream.batch([r for r in replies if r is not None])
