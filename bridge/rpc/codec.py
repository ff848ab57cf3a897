"""JSON-RPC 2.0 parsing and hybrid-envelope encoding (JSON-RPC 2.0 spec §4-§6; docs/api.md
"Envelope"), and the text rules every message obeys.

Text in, typed messages out; replies in, bytes out. Both directions of both peers use it: clients
of the bridge (strict JSON-RPC 2.0) and the agents the bridge drives (lenient: agents omit
``jsonrpc`` and write stray lines, field-failures.md #10).

- ``id`` values round-trip exactly: orjson reads integers past 64 bits as floats and refuses lone
  surrogates, so those inputs take the standard library's slower but exact path (chosen by a
  cheap scan, not by trial on every frame).
- Lone UTF-16 surrogates never leave the bridge in a body: Node agents cut strings inside a
  surrogate pair and write ``"\\ud83d"``, which strict clients (orjson, serde_json) refuse.
  :func:`scrub` replaces each with U+FFFD; :func:`encode_body` applies it to whatever orjson
  refuses, so every provider family's text is covered at the one place it is encoded.

No ``await``, no I/O, no pydantic. Must not import the rest of the project.
"""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Any

import msgspec
import orjson

from bridge.rpc.errors import InternalError, InvalidRequest, ParseError, RpcError

log = logging.getLogger(__name__)

# orjson reads integers outside [-2**63, 2**64) as floats: 19 digits already reach below -2**63.
_BIG_INT = re.compile(rb"[0-9]{19,}")
_BIG_INT_TEXT = re.compile(r"[0-9]{19,}")  # WebSocket frames arrive as str: no encode on the fast path
_SURROGATE = re.compile("[\ud800-\udfff]")


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()  # the id of a notification (no ``id`` member at all)


# ---- text ----------------------------------------------------------------------------------------


def scrub(value: Any) -> Any:
    """``value`` with every lone UTF-16 surrogate in its strings (keys included) replaced by U+FFFD.

    A high surrogate followed by a low one is joined into the character they encode. Containers
    are copied only where something changed; other values are returned as they are.
    """
    if isinstance(value, str):
        if _SURROGATE.search(value) is None:
            return value
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v) for v in value]
    return value


def cut_utf8(text: str, max_bytes: int) -> str:
    """The longest prefix of ``text`` whose UTF-8 encoding fits in ``max_bytes`` (never inside a
    character; lone surrogates count as the 3 bytes U+FFFD will take)."""
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= max_bytes:
        return text
    cut = encoded[: max(0, max_bytes)]
    for trim in range(4):  # back off the bytes of a character the cut went through (at most 3)
        try:
            return cut[: len(cut) - trim].decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            continue
    return cut.decode("utf-8", "ignore")  # unreachable for text encoded above


def utf8_len(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (lone surrogates as 3, as U+FFFD)."""
    return len(text.encode("utf-8", "surrogatepass"))


# ---- decoding --------------------------------------------------------------------------------------


def loads(data: bytes | str, *, untrusted: bool = False) -> Any:
    """Decode JSON exactly (big integers stay integers).

    Args:
        data: one JSON text.
        untrusted: the text comes from a provider (an agent's line): its strings are scrubbed
            (:func:`scrub`) so nothing downstream holds a lone surrogate, and integers past 64
            bits may come back as floats (only a client's ``id`` must round-trip exactly; an
            agent's lines, nanosecond timestamps in their text included, skip the scan for them:
            bench case 4, 11% of the event loop with it). Bytes that are not UTF-8 become U+FFFD
            (field-failures.md: one bad byte must not cost the line, a prompt answer included).

    Raises:
        ParseError: -32700, not JSON (or nested past the interpreter's stack).
    """
    big = None
    if not untrusted:
        big = _BIG_INT_TEXT.search(data) if isinstance(data, str) else _BIG_INT.search(data)
    if big is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # maybe a lone surrogate or 1e400: the stdlib decides
    raw: bytes | str = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if untrusted and isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    try:
        value = json.loads(raw, parse_constant=_not_json, parse_float=_finite)
    except (ValueError, RecursionError) as exc:
        raise ParseError("Parse error: invalid JSON") from exc
    return scrub(value) if untrusted else value


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # the stdlib accepts NaN and Infinity; RFC 8259 does not


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("number out of range")
    return value


# ---- encoding --------------------------------------------------------------------------------------


def _builtins(value: Any) -> Any:
    """orjson's ``default``: result models (msgspec structs) become their wire dicts."""
    if isinstance(value, msgspec.Struct):
        return msgspec.to_builtins(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


def dumps(value: Any) -> bytes:
    """Encode JSON exactly, as given (an ``id`` echoed back; a value kept in a log).

    Values orjson refuses (ints past 64 bits, lone surrogates) take the standard library, which
    escapes lone surrogates rather than changing them.
    """
    try:
        return orjson.dumps(value, default=_builtins)
    except TypeError:
        return json.dumps(_plain(value), separators=(",", ":"), ensure_ascii=True).encode()


def encode_body(value: Any) -> bytes:
    """Encode what the bridge sends in a ``result`` or ``params``: result models are written as
    their wire dicts, lone surrogates become U+FFFD (see the module docstring) and ints past 64
    bits stay exact.

    msgspec writes result models directly; orjson needs them copied to builtins first, which
    for a knowledge turn's 170 KB result cost 3 ms of the turn's 35 ms of CPU (bench case 7).
    """
    try:
        return msgspec.json.encode(value)
    except (TypeError, UnicodeEncodeError):  # lone surrogates; a type neither library writes
        clean = scrub(_plain(value))
    try:
        return orjson.dumps(clean)
    except TypeError:  # an int past 64 bits: the stdlib writes it exactly
        return json.dumps(clean, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _plain(value: Any) -> Any:
    """``value`` with every struct inside turned into builtins (the stdlib knows no structs)."""
    return msgspec.to_builtins(value) if _has_struct(value) else value


def _has_struct(value: Any) -> bool:
    if isinstance(value, msgspec.Struct):
        return True
    if isinstance(value, dict):
        return any(_has_struct(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_struct(v) for v in value)
    return False


# ---- messages --------------------------------------------------------------------------------------
# The per-message types are msgspec structs rather than dataclasses: a struct's C __init__ takes
# 50 ns where a slotted dataclass takes 100 ns, and the class is built in 0.01 ms instead of
# 0.35 ms (bench case 6). Nothing mutates them after construction.


class Request(msgspec.Struct):
    """A well-formed request or notification. ``params`` is the raw member (None when absent or
    null); the dispatcher checks its type after the method, so an unknown method is -32601."""

    id: Any
    method: str
    params: Any = None

    @property
    def is_notification(self) -> bool:
        return self.id is MISSING


class Response(msgspec.Struct):
    """A response to a request this side sent: ``error`` is the raw error member (None for a
    result). Matched against the pending requests by :class:`bridge.rpc.peer.PeerCore`."""

    id: Any
    result: Any = None
    error: Any = None


class Invalid(msgspec.Struct):
    """A message that cannot be dispatched; a client's is always answered with ``error``."""

    id: Any
    error: RpcError


Message = Request | Response | Invalid


class Frame(msgspec.Struct):
    messages: tuple[Message, ...]
    is_batch: bool


def _valid_id(value: Any) -> bool:
    if value is None or isinstance(value, str):
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value)


def parse_message(obj: Any, *, strict: bool = True) -> Message:
    """Classify one decoded JSON value (§4, §5).

    Args:
        obj: the decoded value.
        strict: JSON-RPC 2.0 exactly (a client of the bridge). Lenient (an agent): ``jsonrpc``
            may be missing and a request's ``id`` may have any type.
    """
    if not isinstance(obj, dict):
        return Invalid(None, InvalidRequest("Invalid Request: a message must be an object"))
    raw_id = obj.get("id", MISSING)
    if strict and raw_id is not MISSING and not _valid_id(raw_id):
        return Invalid(None, InvalidRequest("Invalid Request: id must be a string, number or null"))
    reply_id = None if raw_id is MISSING else raw_id
    if strict and obj.get("jsonrpc") != "2.0":
        return Invalid(reply_id, InvalidRequest('Invalid Request: jsonrpc must be "2.0"'))
    method = obj.get("method")
    if isinstance(method, str) and method:
        return Request(raw_id, method, obj.get("params"))
    if method is None and raw_id is not MISSING and ("result" in obj or "error" in obj):
        return Response(raw_id, obj.get("result"), obj.get("error"))
    return Invalid(reply_id, InvalidRequest("Invalid Request: method must be a non-empty string"))


def parse_frame(data: bytes | str) -> Frame:
    """Parse one frame from a client (WebSocket text frame, HTTP body, stdio line).

    Raises:
        ParseError: -32700, the frame is not JSON.
        InvalidRequest: -32600, the frame is an empty batch (answered with one error, §6).
    """
    obj = loads(data)
    if isinstance(obj, list):
        if not obj:
            raise InvalidRequest("Invalid Request: empty batch")
        return Frame(tuple(parse_message(item) for item in obj), True)
    return Frame((parse_message(obj),), False)


# ---- envelopes -------------------------------------------------------------------------------------
# The hybrid envelope repeats ``result``/``params`` as ``payload``. Serialising the body once and
# splicing the bytes halves the encoding work for large results and notifications.


def encode_result(id_: Any, result: Any, seq: int) -> bytes:
    body = encode_body(result)
    return b'{"jsonrpc":"2.0","id":%b,"result":%b,"ok":true,"type":"res","payload":%b,"seq":%d}' % (
        dumps(id_),
        body,
        body,
        seq,
    )


def encode_error(id_: Any, error: dict[str, Any], seq: int) -> bytes:
    return b'{"jsonrpc":"2.0","id":%b,"error":%b,"ok":false,"type":"res","payload":null,"seq":%d}' % (
        dumps(id_),
        encode_body(error),
        seq,
    )


def encode_notification(method: str, params: Any, seq: int) -> bytes:
    body, name = encode_body(params), dumps(method)
    return b'{"jsonrpc":"2.0","method":%b,"params":%b,"type":"event","event":%b,"payload":%b,"seq":%d}' % (
        name,
        body,
        name,
        body,
        seq,
    )


class Reply(msgspec.Struct):
    """A response to send: exactly one of ``result`` / ``error`` is meaningful."""

    id: Any
    result: Any = None
    error: dict[str, Any] | None = None

    def encode(self, seq: int) -> bytes:
        """The envelope; a result JSON cannot hold (a handler's bug) is sent as -32603 for the
        same id instead, so the client still gets its answer on every transport (an SSE stream
        ended with no reply, plain HTTP answered a text 500)."""
        if self.error is not None:
            return encode_error(self.id, self.error, seq)
        try:
            return encode_result(self.id, self.result, seq)
        except (TypeError, ValueError) as exc:
            log.error("a result could not be encoded: %s", type(exc).__name__)
            return encode_error(self.id, InternalError().to_error(), seq)

    @classmethod
    def from_error(cls, id_: Any, exc: RpcError) -> Reply:
        return cls(id_, error=exc.to_error())
