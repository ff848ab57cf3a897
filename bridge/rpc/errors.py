"""The error table: JSON-RPC errors (requests that cannot run) and turn error codes (turns that ran
and failed). docs/api.md renders both tables; tests check the doc against them.

Every ``RpcError`` carries ``data.code``, a stable upper-case name clients can switch on.
"""

from __future__ import annotations

from typing import Any


class RpcError(Exception):
    """Root of every error that becomes a JSON-RPC error object on the wire.

    Attributes:
        code: the JSON-RPC error code (e.g. -32602).
        name: the stable ``data.code`` name (e.g. ``INVALID_PARAMS``).
        message: human-readable, already redacted.
        data: extra structured fields merged into ``error.data``.
    """

    code: int = -32603
    name: str = "INTERNAL_ERROR"
    default_message: str = "Internal error"

    def __init__(self, message: str | None = None, **data: Any) -> None:
        self.message = message or self.default_message
        self.data = data
        super().__init__(self.message)

    def to_error(self) -> dict[str, Any]:
        """The JSON-RPC ``error`` member: ``{code, message, data: {code, …}}``."""
        return {"code": self.code, "message": self.message, "data": {"code": self.name, **self.data}}


class ParseError(RpcError):
    code, name, default_message = -32700, "PARSE_ERROR", "Parse error"


class InvalidRequest(RpcError):
    code, name, default_message = -32600, "INVALID_REQUEST", "Invalid Request"


class MethodNotFound(RpcError):
    code, name, default_message = -32601, "METHOD_NOT_FOUND", "Method not found"


class InvalidParams(RpcError):
    """-32602. ``data.errors`` always lists the failures as ``{loc, type, msg}`` (docs/api.md
    "Errors"); raised with ``field`` (and ``reason``) instead, it lists that one failure."""

    code, name, default_message = -32602, "INVALID_PARAMS", "Invalid params"

    def __init__(self, message: str | None = None, **data: Any) -> None:
        super().__init__(message, **data)
        if "errors" not in self.data:
            self.data["errors"] = [
                {"loc": str(data.get("field", "")), "type": str(data.get("reason") or "invalid"), "msg": self.message}
            ]


class InternalError(RpcError):
    code, name, default_message = -32603, "INTERNAL_ERROR", "Internal error"


class Unauthorized(RpcError):
    code, name, default_message = -32001, "UNAUTHORIZED", "missing or invalid bearer authorization"


class OriginNotAllowed(RpcError):
    code, name, default_message = -32003, "ORIGIN_NOT_ALLOWED", "origin not allowed"


class NotFound(RpcError):
    code, name, default_message = -32004, "NOT_FOUND", "not found"


class SessionBusy(RpcError):
    code, name, default_message = -32005, "SESSION_BUSY", "session is busy"


class LimitReached(RpcError):
    code, name, default_message = -32006, "LIMIT_REACHED", "limit reached"


class LlmOverrideDenied(RpcError):
    """-32007: the trust gate refused what the principal asked ``llm.*`` for (another provider or
    model, or the methods at all); ``data.argument`` names the argument and ``data.configKey`` the
    setting that would allow it (docs/api.md "Principals")."""

    code, name, default_message = -32007, "LLM_OVERRIDE_DENIED", "not allowed for this principal"


class ModelCallFailed(RpcError):
    """-32008: every runtime tried for an ``llm.*`` call failed; ``data.reason`` (``timeout``,
    ``connect``, ``http_status``, ``invalid_reply``), ``data.httpStatus``, ``data.provider`` and
    ``data.attempts`` (one ``{provider, reason, httpStatus?}`` per runtime tried)."""

    code, name, default_message = -32008, "MODEL_CALL_FAILED", "the model call failed"


RPC_ERRORS: tuple[type[RpcError], ...] = (
    ParseError,
    InvalidRequest,
    MethodNotFound,
    InvalidParams,
    InternalError,
    Unauthorized,
    OriginNotAllowed,
    NotFound,
    SessionBusy,
    LimitReached,
    LlmOverrideDenied,
    ModelCallFailed,
)

# Codes of turns that ran and failed (a *result* with success:false, error.code = one of these).
TURN_ERROR_CODES: dict[str, str] = {
    "AGENT_EXITED": "The agent process exited or closed stdout during the turn.",
    "AGENT_CAPACITY": "maxLiveAgents agent processes were busy for agentCapacityTimeout seconds.",
    "AGENT_START_TIMEOUT": "initialize or session/new did not answer within its timeout.",
    "AGENT_AUTH_REQUIRED": "The agent needs authentication and no usable authMethod is configured.",
    "AGENT_ERROR": "The agent answered the prompt with a JSON-RPC error.",
    "AGENT_PROTOCOL_ERROR": "The agent broke the protocol (line over maxAgentLineBytes, bad frames).",
    "TURN_TIMEOUT": "The turn ran longer than turnTimeout.",
    "OUTPUT_LIMIT": "The turn's output passed maxOutputBytes; output so far is kept.",
    "PROFILE_ERROR": "The exec profile reported AGENT_ERROR (or could not be started).",
    "PROFILE_EXIT": "The exec profile exited with a non-zero code (data.exitCode).",
    "PROFILE_TIMEOUT": "The exec profile ran longer than timeout_secs; its process group was ended.",
    "KNOWLEDGE_SOURCES_FAILED": "Every selected knowledge source failed; the runtime was not called.",
    "RUNTIME_FAILED": "The knowledge runtime (an OpenAI-compatible model) failed; evidence is kept.",
    "GATEWAY_UNAVAILABLE": "The gateway was not reachable or connected within connectTimeout.",
    "GATEWAY_TIMEOUT": "A gateway request of the turn timed out.",
    "GATEWAY_ERROR": "The gateway refused the connection or a request of the turn.",
    "GATEWAY_RUN_FAILED": "The gateway ran the chat and the run ended in error.",
    "CANCELLED": "The turn was cancelled (or its session closed) before it started.",
    "INTERNAL_ERROR": "The bridge failed unexpectedly; see its log.",
}

# Codes of turns that could not run at all (a result with status "unavailable": ``unavailableCode``).
UNAVAILABLE_CODES: dict[str, str] = {
    "PROVIDER_UNAVAILABLE": "The provider cannot run (unknown, command not found, disabled).",
    "GATEWAY_NOT_CONFIGURED": "The gateway target was chosen but no gateway is configured.",
    "PROVIDER_NOT_ALLOWED": "The principal may not use the chosen provider (principals.<name>.turns).",
    "MODEL_NOT_ALLOWED": "The principal may not choose the model it named (principals.<name>.turns).",
}
