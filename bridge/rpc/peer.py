"""The sans-I/O half of a JSON-RPC 2.0 peer: ids for the requests this side sends, the table of
those still waiting for a response, and what each message that arrives is (JSON-RPC 2.0 §4-§5).

A transport owns one :class:`PeerCore` per connection and the waiting (an event per pending
request, a timeout): it feeds received lines to :meth:`PeerCore.receive`, acts on the
:class:`Received` it gets back, and calls :meth:`PeerCore.close` when the connection ends, which
hands back every request still waiting so the transport can fail them. The ACP client side
(``compat.peer``) uses it toward agents; the bridge's own transports use :func:`parse_message`
from the same codec toward clients.

No ``await``, no I/O. Must not import the rest of the project.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec

from bridge.rpc.codec import MISSING, Invalid, ParseError, Request, Response, dumps, loads, parse_message

W = TypeVar("W")
"""Whatever the transport waits on for one request (an event, a future)."""

METHOD_NOT_FOUND = -32601
INTERNAL_ERROR = -32603


class ErrorObject(msgspec.Struct, frozen=True):
    """A JSON-RPC error object as received (``code`` is -32603 when the peer sent none usable)."""

    code: int
    message: str
    data: Any = None


class IncomingRequest(msgspec.Struct, frozen=True):
    """The other side asks this side something; answer with :meth:`PeerCore.result` or
    :meth:`PeerCore.error`. ``id`` may be null (a request all the same, field-failures #2)."""

    id: Any
    method: str
    params: dict[str, Any]


class IncomingNotification(msgspec.Struct, frozen=True):
    method: str
    params: dict[str, Any]


class Answered(msgspec.Struct, Generic[W], frozen=True):
    """A response to one of this side's requests; ``error`` is None for a result."""

    waiter: W
    result: Any = None
    error: ErrorObject | None = None


class Stray(msgspec.Struct, frozen=True):
    """A line that is not a message this side can use: not JSON, not JSON-RPC, or a response to
    no pending request. ``why`` is a short reason for the log."""

    why: str


Received = IncomingRequest | IncomingNotification | Answered[Any] | Stray


class PeerCore(Generic[W]):
    """Ids, the pending-request table and message classification for one connection.

    Args:
        strict: the other side must speak JSON-RPC 2.0 exactly; lenient (an agent) accepts a
            missing ``jsonrpc`` member.
    """

    __slots__ = ("_next_id", "_pending", "_strict")

    def __init__(self, *, strict: bool = False) -> None:
        self._strict = strict
        self._next_id = 0
        self._pending: dict[int, W] = {}

    @property
    def pending(self) -> int:
        """How many requests wait for a response."""
        return len(self._pending)

    def is_pending(self, request_id: int) -> bool:
        return request_id in self._pending

    def request(self, method: str, params: Any, waiter: W) -> tuple[int, bytes]:
        """A new request: its id and encoded bytes; ``waiter`` is handed back with its response."""
        self._next_id += 1
        self._pending[self._next_id] = waiter
        return self._next_id, _encode({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params})

    def forget(self, request_id: int) -> None:
        """The request was abandoned (timed out, cancelled): a late response is stray."""
        self._pending.pop(request_id, None)

    @staticmethod
    def notification(method: str, params: Any) -> bytes:
        return _encode({"jsonrpc": "2.0", "method": method, "params": params})

    @staticmethod
    def result(request_id: Any, result: Any) -> bytes:
        return dumps({"jsonrpc": "2.0", "id": request_id, "result": result})

    @staticmethod
    def error(request_id: Any, code: int, message: str, data: Any = None) -> bytes:
        error: dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        return dumps({"jsonrpc": "2.0", "id": request_id, "error": error})

    def receive(self, data: bytes | str) -> Received:
        """Classify one received message; a response is matched to its pending request (which is
        then no longer pending)."""
        if not data.strip():
            return Stray("blank line")
        try:
            obj = loads(data, untrusted=not self._strict)
        except ParseError:
            return Stray("not JSON")
        message = parse_message(obj, strict=self._strict)
        if isinstance(message, Invalid):
            return Stray("not a JSON-RPC message")
        if isinstance(message, Request):
            params = message.params if isinstance(message.params, dict) else {}
            if message.id is MISSING:
                return IncomingNotification(message.method, params)
            return IncomingRequest(message.id, message.method, params)
        return self.match(message)

    def match(self, response: Response) -> Answered[W] | Stray:
        """The pending request ``response`` answers, or Stray when none waits for it."""
        request_id = response.id
        waiter = self._pending.pop(request_id, None) if type(request_id) is int else None
        if waiter is None:
            return Stray(f"response to unknown or abandoned request id {request_id!r}"[:120])
        if response.error is not None:
            return Answered(waiter, error=_error_object(response.error))
        return Answered(waiter, result=response.result)

    def close(self) -> list[W]:
        """The connection ended: every waiter still pending, oldest first; none is pending after."""
        waiters = list(self._pending.values())
        self._pending.clear()
        return waiters


def _encode(message: dict[str, Any]) -> bytes:
    if message.get("params") is None:
        message.pop("params", None)
    return dumps(message)


def _error_object(error: Any) -> ErrorObject:
    if not isinstance(error, dict):
        return ErrorObject(INTERNAL_ERROR, str(error)[:500])
    code = error.get("code")
    if not isinstance(code, int) or isinstance(code, bool):
        code = INTERNAL_ERROR
    return ErrorObject(code, str(error.get("message", "")), error.get("data"))
