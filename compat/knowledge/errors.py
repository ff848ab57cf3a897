"""Errors of the knowledge family: JSON-RPC errors raised before a turn, and source failures.

``RpcError`` subclasses become JSON-RPC errors in the dispatcher; ``SourceError`` never leaves the
family: it becomes a per-source step and a sanitized diagnostic. Messages are built from fixed
templates, never from upstream text, so they cannot carry URLs, keys or paths.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from typing import Any

from bridge.rpc.errors import InvalidParams, NotFound

# Turn error codes this family produces (KNOWLEDGE_SOURCES_FAILED, RUNTIME_FAILED) live in the one
# table, bridge.rpc.errors.TURN_ERROR_CODES.


class RetrievalModeUnsupported(InvalidParams):
    """-32602 with ``data.code: RETRIEVAL_MODE_UNSUPPORTED`` (§2.6 step 4)."""

    name = "RETRIEVAL_MODE_UNSUPPORTED"
    default_message = "the requested retrieval mode is not supported by the selected sources"


class KnowledgeNotFound(NotFound):
    """-32004 for an unknown source or tree path (``data.nearestParent`` when a path)."""


class SourceError(Exception):
    """A source could not answer. ``reason`` is a stable token; ``http_status`` when known.

    Reasons: ``timeout``, ``connect``, ``http_status``, ``invalid_json``, ``too_large``,
    ``upstream_error``, ``mcp_unavailable``, ``not_found``, ``unsupported``, ``error``;
    ``session_expired`` (MCP: a second 404 after re-initialising); ``input_required``,
    ``auth_required`` (an A2A task that wants more than one message), ``binding_mismatch`` (an
    A2A card advertising a binding its URL does not serve), ``binding_unsupported`` (no binding
    the bridge speaks).
    """

    def __init__(self, reason: str, message: str = "", *, http_status: int | None = None) -> None:
        self.reason = reason
        self.http_status = http_status
        self.message = message or reason.replace("_", " ")
        super().__init__(self.message)

    @property
    def retryable(self) -> bool:
        if self.http_status is not None:
            return self.http_status in (408, 409, 425, 429) or self.http_status >= 500
        return self.reason in ("timeout", "connect", "error")

    def observations(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reason": self.reason}
        if self.http_status is not None:
            out["httpStatus"] = self.http_status
        if self.reason == "timeout":
            out["timeout"] = True
        return out


class SourceUnsupported(SourceError):
    """The source's protocol has no such operation (e.g. ``read`` on an A2A agent)."""

    def __init__(self, operation: str) -> None:
        super().__init__("unsupported", f"this source does not support {operation}")
