"""A newline-delimited JSON-RPC 2.0 peer over a child process's stdin and stdout.

The ACP adapter talks to agents through this peer with raw dicts: the ACP SDK's ``Connection``
drops fields it does not know, such as gemini's ``models`` (acp-and-real-agents.md §0, fact 2).

Behaviour taken from field-failures.md: lines that are not JSON, and JSON that is not a JSON-RPC
message, are logged at debug and skipped (#10); an unknown incoming request is answered -32601 at
once and an unknown notification gets nothing (#2); a line over the bound fails every pending
request with :class:`PeerProtocolError`, after which the caller kills the child (#9).

The end of the child is the leader's exit, not stdout EOF, which never comes while a descendant
still holds the pipe (#15): once the leader exited, the peer reads what stdout and stderr still
hold for a short, bounded time, then fails every pending request with :class:`PeerClosed`.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import orjson

from bridge.rpc.redact import redact
from compat._lines import LineTooLong
from compat._process import AgentProcess

logger = logging.getLogger(__name__)

METHOD_NOT_FOUND = -32601
INTERNAL_ERROR = -32603
_PREVIEW_BYTES = 200
_EXIT_WAIT = 2.0  # seconds to wait for an exit status once stdout closed
_STDERR_WAIT = 0.5  # seconds to let the stderr pump catch the child's last words
_EXIT_DRAIN = 1.0  # seconds, at most, to read what the pipes hold once the leader exited ...
_EXIT_QUIET = 0.15  # ... ending earlier once they stayed quiet this long

RequestHandler = Callable[[dict[str, Any]], Awaitable[Any]]
NotificationHandler = Callable[[dict[str, Any]], None]


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
    """The child closed stdout or exited; ``stderr_tail`` is redacted."""

    def __init__(self, exit_code: int | None, stderr_tail: str) -> None:
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail
        super().__init__(f"agent closed the connection (exit code {exit_code})")


class PeerProtocolError(PeerError):
    """The byte stream broke the framing (a line over the bound); the peer is unusable."""


class RequestTimeout(PeerError):
    """No response to ``method`` within ``timeout`` seconds."""

    def __init__(self, method: str, timeout: float) -> None:
        self.method = method
        self.timeout = timeout
        super().__init__(f"no response to {method} within {timeout} s")


class _Pending:
    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.result: Any = None
        self.error: PeerError | None = None


class JsonRpcPeer:
    """JSON-RPC 2.0 over an :class:`AgentProcess`; host :meth:`run` in a task group you own.

    :meth:`run` may be stopped (by cancelling its scope) and started again on the same process;
    a partial line stays buffered in between.
    """

    def __init__(self, process: AgentProcess, *, stderr_tail_bytes: int) -> None:
        """
        Args:
            process: The child to talk to.
            stderr_tail_bytes: How much stderr a :class:`PeerClosed` carries, in bytes
                (``Limits.client_stderr_tail_bytes``).
        """
        self.process = process
        self.skipped_lines = 0
        self._tail_bytes = stderr_tail_bytes
        self._requests: dict[str, RequestHandler] = {}
        self._notifications: dict[str, NotificationHandler] = {}
        self._pending: dict[int, _Pending] = {}
        self._next_id = 0
        # fast_acquire: an uncontended write must not cost a pass of the event loop; a turn's
        # start writes three requests, each delayed by a whole pass in a start storm.
        self._write_lock = anyio.Lock(fast_acquire=True)
        self._error: PeerError | None = None
        self._busy = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._lines = 0  # stdout lines read so far
        self._stdout_ended = anyio.Event()  # EOF or a framing error: the reader ends the peer

    @property
    def error(self) -> PeerError | None:
        """Why the peer stopped working (closed or protocol error), or None while it works."""
        return self._error

    def on_request(self, method: str, handler: RequestHandler) -> None:
        """Serve incoming ``method`` requests; the handler's return value is the result.

        A handler raises :class:`ResponseError` to answer with that error; any other exception
        answers -32603 without its text.
        """
        self._requests[method] = handler

    def on_notification(self, method: str, handler: NotificationHandler) -> None:
        """Call ``handler(params)`` for incoming ``method`` notifications.

        Handlers run from the pipe's data callback as the line arrives (compat._lines), outside
        any task: they must not block, and may use anyio only where no current task is needed.
        """
        self._notifications[method] = handler

    async def request(self, method: str, params: Any = None, *, timeout: float | None) -> Any:
        """Send a request and wait for its response.

        Args:
            method: The method name.
            params: JSON-serializable params, omitted when None.
            timeout: Seconds to wait for the response, or None for no bound of its own.

        Returns:
            The response's ``result``.

        Raises:
            ResponseError: The peer answered with an error object.
            RequestTimeout: No response within ``timeout``.
            PeerClosed: The child closed stdout or exited first.
            PeerProtocolError: The stream broke framing.
        """
        if self._error is not None:
            raise self._error
        self._next_id += 1
        request_id = self._next_id
        pending = self._pending[request_id] = _Pending()
        try:
            await self._write(_message(id=request_id, method=method, params=params))
            with anyio.move_on_after(timeout) as scope:
                await pending.done.wait()
            if scope.cancelled_caught:
                raise RequestTimeout(method, timeout or 0.0)
        finally:
            self._pending.pop(request_id, None)
        if pending.error is not None:
            raise pending.error
        return pending.result

    async def notify(self, method: str, params: Any = None) -> None:
        """Send a notification.

        Raises:
            PeerClosed: The child's stdin is closed.
        """
        await self._write(_message(method=method, params=params))

    async def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no incoming request is being served."""
        with anyio.move_on_after(timeout):
            await self._idle.wait()
        return self._busy == 0

    async def run(self) -> None:
        """Read stdout and dispatch messages until EOF, a framing error or the leader's exit
        (plus a bounded drain); never raises."""
        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as reading:
                tg.start_soon(self._end_after_exit, reading)
                await self._read_loop(tg)
            tg.cancel_scope.cancel()  # handlers cannot answer a closed peer

    async def _read_loop(self, tg: anyio.abc.TaskGroup) -> None:
        def on_line(line: bytes) -> None:
            if self._error is None:
                self._lines += 1
                self._dispatch(line, tg)

        try:
            await self.process.read_lines(on_line)
        except LineTooLong as exc:
            self._stdout_ended.set()
            self._fail(PeerProtocolError(str(exc)))
            return
        except Exception:
            # A bug of ours on some agent output: it must end this agent's peer, never the task
            # group that hosts it (the adapter's, shared by every session, when hosted).
            logger.exception("pid %d: reading the agent's output failed", self.process.pid)
            self._stdout_ended.set()
            self._fail(PeerProtocolError("internal error reading the agent's output"))
            return
        self._stdout_ended.set()
        code = await self.process.wait(_EXIT_WAIT)
        await self.process.wait_stderr_eof(_STDERR_WAIT)
        self._fail(PeerClosed(code, self.process.stderr_tail(self._tail_bytes)))

    async def _end_after_exit(self, reading: anyio.CancelScope) -> None:
        """Once the leader exited, let the reader take what the pipes still hold, then end."""
        code = await self.process.wait(math.inf)
        with anyio.move_on_after(_EXIT_DRAIN):
            while True:
                seen = (self._lines, self.process.stderr_bytes)
                with anyio.move_on_after(_EXIT_QUIET):
                    await self._stdout_ended.wait()
                    return  # the reader got EOF (no descendant holds stdout): it ends the peer
                if (self._lines, self.process.stderr_bytes) == seen:
                    break
        if self._stdout_ended.is_set():
            return
        logger.debug("pid %d exited with %s; a descendant holds stdout, not waiting for EOF", self.process.pid, code)
        self._fail(PeerClosed(code, self.process.stderr_tail(self._tail_bytes)))
        reading.cancel()

    def _dispatch(self, line: bytes, tg: anyio.abc.TaskGroup) -> None:
        msg = _decode(line)
        method = msg.get("method") if isinstance(msg, dict) else None
        if isinstance(method, str):
            params = msg.get("params")
            params = params if isinstance(params, dict) else {}
            if "id" in msg:  # "id": null is a request too (field-failures #2)
                tg.start_soon(self._serve, msg["id"], method, params)
            else:
                self._on_notification(method, params)
        elif isinstance(msg, dict) and "id" in msg and ("result" in msg or "error" in msg):
            self._resolve(msg)
        else:
            self.skipped_lines += 1
            preview = line[:_PREVIEW_BYTES].decode("utf-8", "replace")
            logger.debug("pid %d: skipped non-JSON-RPC line: %s", self.process.pid, redact(preview))

    def _on_notification(self, method: str, params: dict[str, Any]) -> None:
        handler = self._notifications.get(method)
        if handler is None:
            logger.debug("ignored notification %s", method)
            return
        try:
            handler(params)
        except Exception:
            logger.exception("notification handler for %s failed", method)

    def _resolve(self, msg: dict[str, Any]) -> None:
        pending = self._pending.get(msg["id"]) if isinstance(msg["id"], int) else None
        if pending is None:
            logger.debug("response to unknown or abandoned request id %r", msg["id"])
            return
        if "error" in msg:
            pending.error = _response_error(msg["error"])
        else:
            pending.result = msg["result"]
        pending.done.set()

    async def _serve(self, request_id: Any, method: str, params: dict[str, Any]) -> None:
        handler = self._requests.get(method)
        if handler is None:
            await self._reply(request_id, error=ResponseError(METHOD_NOT_FOUND, "Method not found"))
            return
        if self._busy == 0:
            self._idle = anyio.Event()
        self._busy += 1
        try:
            try:
                result = await handler(params)
            except ResponseError as exc:
                await self._reply(request_id, error=exc)
            except Exception:
                logger.exception("request handler for %s failed", method)
                await self._reply(request_id, error=ResponseError(INTERNAL_ERROR, "Internal error"))
            else:
                await self._reply(request_id, result=result)
        finally:
            self._busy -= 1
            if self._busy == 0:
                self._idle.set()

    async def _reply(self, request_id: Any, *, result: Any = None, error: ResponseError | None = None) -> None:
        if error is None:
            msg: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "result": result}
        else:
            body = {"code": error.code, "message": error.message}
            if error.data is not None:
                body["data"] = error.data
            msg = {"jsonrpc": "2.0", "id": request_id, "error": body}
        try:
            await self._write(msg)
        except PeerError as exc:
            logger.debug("could not answer request %r: %s", request_id, exc)

    async def _write(self, msg: dict[str, Any]) -> None:
        data = _encode(msg)
        async with self._write_lock:
            try:
                await self.process.send(data)
            except anyio.BrokenResourceError:
                if self._error is not None:
                    raise self._error from None
                tail = self.process.stderr_tail(self._tail_bytes)
                raise PeerClosed(self.process.returncode, tail) from None

    def _fail(self, error: PeerError) -> None:
        if self._error is None:
            self._error = error
        for pending in self._pending.values():
            if not pending.done.is_set():
                pending.error = self._error
                pending.done.set()


def _message(**fields: Any) -> dict[str, Any]:
    msg = {"jsonrpc": "2.0", **fields}
    if msg.get("params") is None:
        msg.pop("params", None)
    return msg


def _response_error(error: Any) -> ResponseError:
    if not isinstance(error, dict):
        return ResponseError(INTERNAL_ERROR, str(error))
    code = error.get("code")
    return ResponseError(
        code if isinstance(code, int) and not isinstance(code, bool) else INTERNAL_ERROR,
        str(error.get("message", "")),
        error.get("data"),
    )


def _encode(msg: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(msg) + b"\n"
    except TypeError:  # orjson refuses ints over 64 bits and lone surrogates; json escapes both
        return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


def _decode(line: bytes) -> Any:
    if not line.strip():
        return None
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        try:
            return json.loads(line.decode("utf-8", "replace"))
        except (ValueError, RecursionError):  # RecursionError: nested past the stack, e.g. "[" * 2000
            return None
