"""The OpenClaw gateway wire protocol, sans I/O: frames, the ``connect`` handshake, the device
signature, what each handshake error means, the reconnect backoff, and the ``chat.run`` push.

Frames are WebSocket text frames of JSON (the gateway's "Gateway protocol"; observed against
``openclaw@2026.9.6``, see the project's OpenClaw notes):

* request ``{type:"req", id, method, params?}``, answered by ``{type:"res", id, ok, payload?, error?}``
  with ``error = {code, message, details?: {code, …}, retryAfterMs?}``;
* event ``{type:"event", event, payload, seq?}``: ``connect.challenge`` first, then ``tick``,
  ``health``, ``chat``, ``agent``, ``shutdown`` …

Nothing here reads a socket or a clock: :mod:`compat.gateway.client` does.
"""

from __future__ import annotations

import random
from typing import Any, Literal

import msgspec

from compat.knowledge.shapes import as_dict

PROTOCOL_RANGE = (3, 4)
"""The protocol versions offered in ``connect`` (``minProtocol``, ``maxProtocol``): the gateway
picks one; a gateway that refuses the range answers ``PROTOCOL_MISMATCH`` with ``expectedProtocol``."""

CLIENT_ID = "cli"
"""``client.id``: one of the gateway's accepted ids, and the only one seen receiving a device token."""
CLIENT_MODE = "cli"
ROLE = "operator"
DEFAULT_SCOPES = ("operator.admin", "operator.read", "operator.write", "operator.approvals", "operator.pairing")
"""The scopes the xworkmate desktop app requests."""
CAPS = ("tool-events",)
"""``caps``: ``tool-events`` makes the gateway stream tool calls as ``agent`` events."""

DEFAULT_ALLOWED_METHODS = (
    "health",
    "models.list",
    "agents.list",
    "agent.identity.get",
    "chat.send",
    "chat.history",
    "chat.abort",
    "agent.wait",
)
"""``xworkmate.gateway.request`` methods passed by default: read-only ones and chat. Others
(``config.*``, ``agents.create`` …) reconfigure the gateway with the bridge's operator credential;
``status`` and ``sessions.*`` show every principal's sessions."""

SESSION_KEY_PREFIX = "xwm-"
"""Every session key the bridge sends starts with ``xwm-<principal tag>-`` (``scoped_key``)."""


def seconds(ms: Any, low: float, high: float) -> float | None:
    """A gateway's milliseconds (``tickIntervalMs``, ``retryAfterMs``, ``restartExpectedMs``) as
    seconds clamped to ``[low, high]``; None when not a number. An integer of any size is safe
    (msgspec decodes big ones as Python ints: dividing those first would overflow)."""
    if isinstance(ms, bool) or not isinstance(ms, int | float) or ms != ms:  # NaN
        return None
    return min(high, max(low, float(min(max(ms, -1), 10**12)) / 1000))


# ---- frames -------------------------------------------------------------------------------------


class Frame(msgspec.Struct, frozen=True):
    """One decoded frame; which fields are set depends on ``type`` (``req`` / ``res`` / ``event``)."""

    type: str = ""
    id: str | None = None
    ok: bool = False
    payload: Any = None
    error: Any = None
    event: str | None = None
    seq: int | None = None


_decoder = msgspec.json.Decoder(Frame)
_encoder = msgspec.json.Encoder()


def decode(text: str | bytes) -> Frame:
    """A frame from a text message.

    Raises:
        ValueError: not a JSON object of the frame shape.
    """
    try:
        return _decoder.decode(text)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not a gateway frame: {exc}") from None


def request(request_id: str, method: str, params: dict[str, Any] | None) -> bytes:
    """A ``req`` frame (``params`` left out when empty, as the gateway's own clients do)."""
    frame: dict[str, Any] = {"type": "req", "id": request_id, "method": method}
    if params:
        frame["params"] = params
    return _encoder.encode(frame)


# ---- errors -------------------------------------------------------------------------------------

MAX_RETRY_AFTER = 60.0
"""Seconds a ``retryAfterMs`` is honoured up to."""

Remedy = Literal["stop", "retry", "retry_shared", "retry_protocol"]


class GatewayError(Exception):
    """A gateway failure with a code clients can act on.

    ``code`` is the gateway's ``error.code`` (``INVALID_REQUEST``, ``UNAVAILABLE`` …) or one of the
    bridge's (docs/api.md "Gateway error codes": ``OFFLINE``, ``RPC_TIMEOUT``, ``SOCKET_CLOSED``,
    ``SOCKET_FAILURE``, ``CONNECT_CHALLENGE_TIMEOUT``, ``CONNECT_TIMEOUT``, ``METHOD_NOT_ALLOWED`` …);
    ``details`` the gateway's ``error.details`` (its ``code`` is the precise cause:
    ``AUTH_TOKEN_MISMATCH``, ``PAIRING_REQUIRED``, ``PROTOCOL_MISMATCH`` …).
    """

    def __init__(
        self, code: str, message: str, details: dict[str, Any] | None = None, retry_after_ms: int | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}
        self.retry_after_ms = retry_after_ms

    @property
    def detail_code(self) -> str:
        code = self.details.get("code")
        return code if isinstance(code, str) else ""

    @classmethod
    def from_wire(cls, error: Any) -> GatewayError:
        """From a ``res`` frame's ``error`` (any shape: a gateway may send a bare string)."""
        if not isinstance(error, dict):
            return cls("GATEWAY_ERROR", str(error)[:500] or "the gateway answered an error")
        details = error.get("details") if isinstance(error.get("details"), dict) else None
        retry = error.get("retryAfterMs")
        if retry is None and details is not None:
            retry = details.get("retryAfterMs")
        after = seconds(retry, 0.0, MAX_RETRY_AFTER)
        return cls(
            str(error.get("code") or "GATEWAY_ERROR"),
            str(error.get("message") or "the gateway answered an error")[:1000],
            details,
            int(after * 1000) if after is not None else None,
        )

    def to_wire(self) -> dict[str, Any]:
        """``{code, message, details?}``, the ``error`` of the ``xworkmate.gateway.*`` results."""
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            out["details"] = self.details
        return out


GATEWAY_ERROR_CODES: dict[str, str] = {
    "GATEWAY_NOT_CONFIGURED": "no gateway is configured on this bridge",
    "INVALID_RUNTIME_ID": "runtimeId is missing or longer than 200 characters",
    "UNKNOWN_GATEWAY_PROVIDER": "gatewayProviderId names no configured gateway (only openclaw exists)",
    "METHOD_NOT_ALLOWED": "the method is not on gateway.allowMethods",
    "UNKNOWN_RUN": "the request's runId names no run this principal started",
    "OFFLINE": "the gateway is not connected",
    "RPC_TIMEOUT": "the gateway did not answer the request within its timeout",
    "SOCKET_CLOSED": "the connection closed while the request was pending",
    "SOCKET_FAILURE": "the gateway could not be reached (refused, DNS, TLS, not a WebSocket)",
    "CONNECT_CHALLENGE_TIMEOUT": "the gateway sent no connect.challenge within challengeTimeout",
    "CONNECT_TIMEOUT": "no hello-ok within connectTimeout (the message names the last failure)",
    "DEVICE_IDENTITY_INVALID": "gateway.identityFile cannot be read, is not Ed25519, or others may read it",
}
"""The bridge's own ``error.code`` values in ``xworkmate.gateway.*`` results; any other code is
the gateway's (``INVALID_REQUEST``, ``NOT_PAIRED``, ``UNAVAILABLE`` …) with its ``details.code``."""


def remedy(error: GatewayError, *, sent_device_token: bool) -> Remedy:
    """What a failed handshake calls for.

    * ``retry_protocol``: the gateway wants another protocol version (``PROTOCOL_MISMATCH`` with an
      ``expectedProtocol``): connect again at once, offering exactly that one.
    * ``retry_shared``: a stored device token was refused: forget it and connect again at once with
      the shared credential (once; the documented rule against device-token loops).
    * ``retry``: transient (``UNAVAILABLE``, a socket failure): back off and retry.
    * ``stop``: a retry cannot fix it (auth, pairing, protocol, bad params): report and stop.
    """
    detail = error.detail_code
    if detail == "PROTOCOL_MISMATCH":
        return "retry_protocol" if isinstance(error.details.get("expectedProtocol"), int) else "stop"
    if sent_device_token and (detail.startswith(("AUTH_", "DEVICE_TOKEN"))):
        return "retry_shared"
    if error.code in ("UNAVAILABLE", "SOCKET_FAILURE", "SOCKET_CLOSED", "CONNECT_CHALLENGE_TIMEOUT", "CONNECT_TIMEOUT"):
        return "retry"
    return "stop"


def explain(error: GatewayError, *, url: str, device_id: str) -> str:
    """A message that names the real cause of a refused handshake (a protocol or pairing problem
    is never reported as a bad token)."""
    detail = error.detail_code
    if detail == "PROTOCOL_MISMATCH":
        expected = error.details.get("expectedProtocol")
        low, high = PROTOCOL_RANGE
        return (
            f"protocol mismatch: the gateway at {url} speaks protocol {expected}, "
            f"this bridge speaks {low} to {high} (upgrade the bridge or the gateway)"
        )
    if detail in ("PAIRING_REQUIRED", "DEVICE_IDENTITY_REQUIRED", "CONTROL_UI_DEVICE_IDENTITY_REQUIRED") or (
        error.code == "NOT_PAIRED"
    ):
        return f"the gateway at {url} requires this bridge's device to be paired: approve device {device_id} there"
    if detail.startswith("DEVICE_AUTH_SIGNATURE"):
        return f"the gateway at {url} rejected this bridge's device signature ({error.message})"
    if detail in ("AUTH_TOKEN_MISMATCH", "AUTH_TOKEN_MISSING"):
        return f"the gateway at {url} refused gateway.token ({error.message})"
    if detail in ("AUTH_PASSWORD_MISMATCH", "AUTH_PASSWORD_MISSING"):
        return f"the gateway at {url} refused gateway.password ({error.message})"
    if detail.startswith(("AUTH_DEVICE_TOKEN", "DEVICE_TOKEN")):
        return f"the gateway at {url} refused the device token it issued to this bridge ({error.message})"
    return f"the gateway at {url} refused the connection: {error.message}"


# ---- the handshake ------------------------------------------------------------------------------


def signature_payload(
    *,
    device_id: str,
    client_id: str,
    client_mode: str,
    role: str,
    scopes: list[str],
    signed_at_ms: int,
    token: str,
    nonce: str,
    platform: str,
    device_family: str,
) -> str:
    """The v3 device-signature payload: ``v3|deviceId|clientId|clientMode|role|scopes|signedAtMs|
    token|nonce|platform|deviceFamily``, platform and device family trimmed and ASCII-lowercased;
    ``token`` is exactly what ``auth.token`` carries (or empty)."""
    parts = [
        "v3",
        device_id,
        client_id,
        client_mode,
        role,
        ",".join(scopes),
        str(signed_at_ms),
        token,
        nonce,
        platform.strip().lower(),
        device_family.strip().lower(),
    ]
    return "|".join(parts)


class Credentials(msgspec.Struct, frozen=True):
    """What ``connect`` authenticates with: the stored device token when there is one, else the
    configured token or password."""

    token: str = ""
    password: str = ""
    device_token: str = ""

    def auth(self) -> dict[str, str]:
        if self.device_token:  # as the gateway's own client sends it
            return {"deviceToken": self.device_token}
        out = {}
        if self.token:
            out["token"] = self.token
        if self.password:
            out["password"] = self.password
        return out

    @property
    def signed_token(self) -> str:
        return self.device_token or self.token


def challenge_nonce(frame: Frame) -> tuple[str, int]:
    """The ``nonce`` and ``ts`` of a ``connect.challenge`` event.

    Raises:
        ValueError: the frame is not a challenge.
    """
    payload = frame.payload if isinstance(frame.payload, dict) else {}
    nonce, ts = payload.get("nonce"), payload.get("ts")
    if frame.type != "event" or frame.event != "connect.challenge" or not isinstance(nonce, str) or not nonce:
        raise ValueError(f"expected connect.challenge, got {frame.type} {frame.event or frame.id or ''}".strip())
    return nonce, ts if isinstance(ts, int) and not isinstance(ts, bool) else 0


# ---- reconnect ----------------------------------------------------------------------------------


class Backoff:
    """Capped exponential backoff with jitter: 0.5 s doubling to 30 s, each delay shortened by up
    to ``jitter`` of itself (so many bridges do not reconnect in step). ``attempt`` counts the
    delays handed out since the last :meth:`reset`."""

    def __init__(self, initial: float = 0.5, cap: float = 30.0, jitter: float = 0.25) -> None:
        self.initial = initial
        self.cap = cap
        self.jitter = jitter
        self.attempt = 0

    def next_delay(self, at_least: float = 0.0) -> float:
        """The next delay in seconds, never below ``at_least`` (a ``retryAfterMs``)."""
        delay = min(self.cap, self.initial * 2**self.attempt)
        self.attempt += 1
        return max(at_least, delay * (1 - self.jitter * random.random()))

    def reset(self) -> None:
        self.attempt = 0


# ---- events -------------------------------------------------------------------------------------


def message_text(message: Any) -> str:
    """The text of a gateway chat ``message`` (``{role, content: [{type:"text", text}]}`` or a string)."""
    if isinstance(message, str):
        return message
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text") or "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    text = message.get("text")
    return text if isinstance(text, str) else ""


TERMINAL_CHAT_STATES = ("final", "aborted", "error")


def chat_run(event: str, payload: Any) -> dict[str, Any] | None:
    """The normalised ``chat.run`` push of a ``chat`` event or an assistant ``agent`` event:
    ``{runId, sessionKey, state, source, terminal, assistantText?, errorMessage?, stream?}``;
    None for other events."""
    if not isinstance(payload, dict):
        return None
    run: dict[str, Any] = {"runId": str(payload.get("runId") or ""), "sessionKey": str(payload.get("sessionKey") or "")}
    if event == "chat":
        state = str(payload.get("state") or "")
        run.update(state=state, source="chat", terminal=state in TERMINAL_CHAT_STATES)
        if text := message_text(payload.get("message")):
            run["assistantText"] = text
        if isinstance(error := payload.get("errorMessage"), str) and error:
            run["errorMessage"] = error
        return run
    if event == "agent" and payload.get("stream") == "assistant":
        data = as_dict(payload.get("data"))
        run.update(state="delta", source="agent", terminal=False, stream="assistant")
        if isinstance(text := data.get("text"), str):
            run["assistantText"] = text
        return run
    return None


def key_matches(event_key: str, sent_key: str) -> bool:
    """Whether an event's ``sessionKey`` names the session sent as ``sent_key``: the gateway
    canonicalises ``k`` to ``agent:<agentId>:k`` in events."""
    return event_key == sent_key or event_key.endswith(":" + sent_key)
