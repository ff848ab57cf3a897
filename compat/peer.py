"""A JSON-RPC 2.0 peer over a line transport: the I/O half around ``bridge.rpc.peer.PeerCore``.

The transport hands every received line to :meth:`JsonRpcPeer.feed` (from its reader, in order)
and gives the peer a ``write`` function for outgoing lines; :meth:`JsonRpcPeer.serve` hosts the
tasks that answer incoming requests. The ACP adapter talks to agents through it.

Behaviour taken from field-failures.md: lines that are not JSON, and JSON that is not a JSON-RPC
message, are logged at debug and skipped (#10); an unknown incoming request is answered -32601 at
once and an unknown notification gets nothing (#2); "id": null is a request too.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import anyio
import anyio.abc

from bridge.rpc.peer import (
    INTERNAL_ERROR,
    METHOD_NOT_FOUND,
    Answered,
    IncomingNotification,
    IncomingRequest,
    PeerCore,
    Stray,
)
from bridge.rpc.redact import redact

logger = logging.getLogger(__name__)

RequestHandler = Callable[[dict[str, Any]], Awaitable[Any]]
NotificationHandler = Callable[[dict[str, Any]], None]
Write = Callable[[bytes], None]
"""Queues one outgoing line (the newline is the transport's). Raises ``anyio.BrokenResourceError``
once the other side can no longer be written to."""
_PREVIEW_BYTES = 200
REQUEST_ID: contextvars.ContextVar[Any] = contextvars.ContextVar("REQUEST_ID", default=None)
"""In a request handler: the ``id`` of the request it answers (``$/cancel_request`` names it)."""


class AfterReply(NamedTuple):
    """A request handler's return value when something must follow its response on the wire:
    ``result`` is sent, then ``then()`` runs (ACP: an update a client must not see before the
    ``session/new`` response it belongs to)."""

    result: Any
    then: Callable[[], None]


MAX_SERVING = 64
"""Requests from the other side answered at once; more are refused with -32603 at once (an agent
that floods requests cannot grow the bridge's tasks without bound)."""


_STRAY_ERRORS = {
    "not JSON": (-32700, "Parse error"),
    "not a JSON-RPC message": (-32600, "Invalid Request"),
}


class PeerError(Exception):
    """Root of the peer's errors."""


class ResponseError(PeerError):
    """A JSON-RPC error object: received in a response, or raised by a request handler."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        self.code = code
        self.message = message
        self.data = data
        super().__init__(f"{code}: {message}")


class PeerClosed(PeerError):
    """The other side went away (a child: closed stdout or exited); ``stderr_tail`` is redacted."""

    def __init__(self, exit_code: int | None, stderr_tail: str = "") -> None:
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail
        super().__init__(f"agent closed the connection (exit code {exit_code})")


class PeerProtocolError(PeerError):
    """The byte stream broke the framing (a line over the bound); the peer is unusable."""


class RequestWithdrawn(PeerError):
    """This side stopped waiting for the response (:meth:`JsonRpcPeer.withdraw`)."""

    def __init__(self, method: str) -> None:
        self.method = method
        super().__init__(f"{method} was withdrawn")


class RequestTimeout(PeerError):
    """No response to ``method`` within ``timeout`` seconds."""

    def __init__(self, method: str, timeout: float) -> None:
        self.method = method
        self.timeout = timeout
        super().__init__(f"no response to {method} within {timeout} s")


class Call:
    """One request this side sent, until its response arrives."""

    __slots__ = ("done", "error", "id", "method", "result")

    def __init__(self, method: str) -> None:
        self.id = 0
        self.method = method
        self.done = anyio.Event()
        self.result: Any = None
        self.error: PeerError | None = None

    @property
    def answered(self) -> bool:
        """The response (or the peer's end) arrived."""
        return self.done.is_set()


class JsonRpcPeer:
    """JSON-RPC 2.0 over lines; host :meth:`serve` in a task group you own.

    Args:
        write: queues one outgoing line.
        name: a label for logs (e.g. ``pid 1234``).
        answer_strays: answer a line that is not JSON (-32700) or not a JSON-RPC message
            (-32600) with an error of id null, as a server owes its client (JSON-RPC 2.0 §5.1);
            toward an agent (the default) such lines are skipped (field-failures.md #10).
        strict: the other side must speak JSON-RPC 2.0 exactly (``jsonrpc: "2.0"``, ids strings,
            numbers or null), as a client must; an agent (the default) is read leniently.
    """

    def __init__(self, write: Write, *, name: str, answer_strays: bool = False, strict: bool = False) -> None:
        self._write = write
        self.name = name
        self._answer_strays = answer_strays
        self._core: PeerCore[Call] = PeerCore(strict=strict)
        self._requests: dict[str, RequestHandler] = {}
        self._notifications: dict[str, NotificationHandler] = {}
        self._error: PeerError | None = None
        self._handlers: anyio.abc.TaskGroup | None = None
        self._serving = 0  # request handlers running now
        self._idle = anyio.Event()
        self._idle.set()
        self._room = anyio.Event()  # set while fewer than MAX_SERVING requests are answered
        self._room.set()
        self.skipped_lines = 0

    @property
    def error(self) -> PeerError | None:
        """Why the peer stopped working (closed or protocol error), or None while it works."""
        return self._error

    @property
    def unanswered(self) -> int:
        """Requests sent and not yet answered (a timed-out one no longer counts)."""
        return self._core.pending

    def on_request(self, method: str, handler: RequestHandler) -> None:
        """Serve incoming ``method`` requests in a task of :meth:`serve`; the handler's return value
        is the result. Raise :class:`ResponseError` to answer with that error; any other exception
        answers -32603 without its text."""
        self._requests[method] = handler

    def on_notification(self, method: str, handler: NotificationHandler) -> None:
        """Call ``handler(params)`` for incoming ``method`` notifications, in :meth:`feed`, in
        order with everything else the other side sent: it must not block."""
        self._notifications[method] = handler

    # ---- outgoing ---------------------------------------------------------------------------------

    def call(self, method: str, params: Any = None) -> Call:
        """Send a request now; await :meth:`wait` for its response.

        Raises:
            PeerError: the peer no longer works (its :attr:`error`).
        """
        if self._error is not None:
            raise self._error
        call = Call(method)
        call.id, line = self._core.request(method, params, call)
        self._send(line)
        return call

    async def wait(self, call: Call, timeout: float | None) -> Any:
        """The response to ``call``.

        Args:
            timeout: seconds to wait, or None for no bound of its own.

        Raises:
            ResponseError: the other side answered with an error object.
            RequestTimeout: no response within ``timeout``.
            PeerClosed: the other side went away first.
            PeerProtocolError: the stream broke framing.
        """
        with anyio.move_on_after(timeout if timeout is not None else float("inf")):
            await call.done.wait()
        if not call.done.is_set():
            self._core.forget(call.id)
            raise RequestTimeout(call.method, timeout or 0.0)
        if call.error is not None:
            raise call.error
        return call.result

    async def request(self, method: str, params: Any = None, *, timeout: float | None) -> Any:
        """:meth:`call` and :meth:`wait`."""
        return await self.wait(self.call(method, params), timeout)

    def notify(self, method: str, params: Any = None) -> None:
        """Send a notification now.

        Raises:
            PeerError: the peer no longer works.
        """
        if self._error is not None:
            raise self._error
        self._send(self._core.notification(method, params))

    def _send(self, line: bytes) -> None:
        try:
            self._write(line + b"\n")
        except anyio.BrokenResourceError:
            self.close(self._error or PeerClosed(None))
            raise self._error or PeerClosed(None) from None

    # ---- incoming ---------------------------------------------------------------------------------

    def feed(self, line: bytes) -> None:
        """Handle one received line: a response wakes its request, a notification runs its
        handler now, a request gets a task of :meth:`serve`."""
        if self._error is not None:
            return
        received = self._core.receive(line)
        if isinstance(received, Answered):
            call: Call = received.waiter
            if received.error is not None:
                error = received.error
                call.error = ResponseError(error.code, error.message, error.data)
            else:
                call.result = received.result
            call.done.set()
        elif isinstance(received, IncomingNotification):
            self._notify(received)
        elif isinstance(received, IncomingRequest):
            if self._handlers is None:
                logger.debug("%s: request %s before the peer is served; not answered", self.name, received.method)
            elif self._serving >= MAX_SERVING:
                logger.warning(
                    "%s: more than %d requests in flight; refusing %s", self.name, MAX_SERVING, received.method[:100]
                )
                self._answer(self._core.error(received.id, INTERNAL_ERROR, "too many requests in flight"))
            else:
                self._serving += 1
                if self._idle.is_set():
                    self._idle = anyio.Event()
                if self._serving >= MAX_SERVING and self._room.is_set():
                    self._room = anyio.Event()
                self._handlers.start_soon(self._serve_request, received)
        else:
            self._skip(received, line)

    def _notify(self, received: IncomingNotification) -> None:
        handler = self._notifications.get(received.method)
        if handler is None:
            logger.debug("%s: ignored notification %s", self.name, received.method[:100])
            return
        try:
            handler(received.params)
        except Exception:
            logger.exception("%s: notification handler for %s failed", self.name, received.method)

    def _skip(self, stray: Stray, line: bytes) -> None:
        self.skipped_lines += 1
        if self._answer_strays and stray.why in _STRAY_ERRORS:
            code, message = _STRAY_ERRORS[stray.why]
            self._answer(self._core.error(None, code, message))
        preview = line[:_PREVIEW_BYTES].decode("utf-8", "replace")
        logger.debug("%s: skipped a line (%s): %s", self.name, stray.why, redact(preview))

    async def _serve_request(self, request: IncomingRequest) -> None:
        try:
            await self._answer_request(request)
        finally:
            self._serving -= 1
            if not self._serving:
                self._idle.set()
            if self._serving < MAX_SERVING:
                self._room.set()

    async def idle(self) -> None:
        """Until no request from the other side is being answered."""
        await self._idle.wait()

    async def room(self) -> None:
        """Until fewer than :data:`MAX_SERVING` requests are being answered: a transport that can
        wait before :meth:`feed` (a client's socket) never hits the refusal."""
        await self._room.wait()

    def withdraw(self, call: Call) -> None:
        """Stop waiting for ``call`` and tell the other side (``$/cancel_request``, as ACP and LSP
        name it): its late response is dropped."""
        if call.answered:
            return
        self._core.forget(call.id)
        call.error = RequestWithdrawn(call.method)
        call.done.set()
        try:
            self.notify("$/cancel_request", {"requestId": call.id})
        except PeerError:
            pass

    async def _answer_request(self, request: IncomingRequest) -> None:
        handler = self._requests.get(request.method)
        if handler is None:
            self._answer(self._core.error(request.id, METHOD_NOT_FOUND, "Method not found"))
            return
        REQUEST_ID.set(request.id)  # this task's own context
        try:
            result = await handler(request.params)
        except ResponseError as exc:
            self._answer(self._core.error(request.id, exc.code, exc.message, exc.data))
        except Exception:
            logger.exception("%s: request handler for %s failed", self.name, request.method)
            self._answer(self._core.error(request.id, INTERNAL_ERROR, "Internal error"))
        else:
            if isinstance(result, AfterReply):
                self._answer(self._core.result(request.id, result.result))
                result.then()
            else:
                self._answer(self._core.result(request.id, result))

    def _answer(self, line: bytes) -> None:
        if self._error is not None:
            return
        try:
            self._write(line + b"\n")
        except anyio.BrokenResourceError:
            logger.debug("%s: could not answer a request: the other side is gone", self.name)

    # ---- lifetime ---------------------------------------------------------------------------------

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Host the tasks that answer incoming requests until :meth:`close` (or cancellation)."""
        async with anyio.create_task_group() as tg:
            self._handlers = tg
            task_status.started()
            try:
                await anyio.sleep_forever()
            finally:
                self._handlers = None
                tg.cancel_scope.cancel()

    def close(self, error: PeerError) -> None:
        """The peer stops working: every request waiting for a response fails with ``error`` (the
        first error given wins) and requests being answered are abandoned."""
        if self._error is None:
            self._error = error
        for call in self._core.close():
            call.error = self._error
            call.done.set()
        if self._handlers is not None:
            self._handlers.cancel_scope.cancel()
