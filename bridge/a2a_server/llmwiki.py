"""``POST /message:send`` in the LLMWiki agent bridge's shape: a whole knowledge turn, answered
with the same JSON the LLMWiki bridge returns, so its clients work unchanged.

Response (shared/reference/knowledge-sources.md §2.3): ``{id, requestId, traceId, status:
{state: "completed", message}, message: {role: "agent", parts}, artifacts: [{name:
"llmwiki_agent_result", parts: [{kind: "data", data}]}]}``; a turn whose every source failed is
also 200 (its answer says so). Errors: ``{"error": {code, message}, requestId, traceId}`` with 400
(``bad_request``, ``invalid_retrieval_intent``, ``retrieval_mode_unsupported``), 502
``chat_completions_failed`` (with ``steps`` and ``diagnostics``) when the runtime failed, 500
``bridge_error`` for anything unexpected (logged, no text of it on the wire).

Must not import: ``orchestrator`` or a2a-sdk.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from bridge.a2a_server import turns
from bridge.a2a_server.shape import RequestError, from_llmwiki, request_id
from compat.knowledge.turn_sink import CollectingSink

log = logging.getLogger(__name__)


async def message_send(service: Any, body: Any, headers: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
    """Run the turn a ``/message:send`` body asks for.

    Args:
        service: the bridge's ``KnowledgeService``.
        body: the parsed JSON body.
        headers: the request headers (``x-request-id``, ``x-trace-id`` are echoed when safe).

    Returns:
        ``(HTTP status, JSON body)``.
    """
    rid, tid = request_id(headers.get("x-request-id")), request_id(headers.get("x-trace-id"))
    try:
        request = from_llmwiki(body)
        await turns.preflight(service, request)
        outcome = await turns.run(service, request, CollectingSink(), turn_id=rid)
    except RequestError as exc:
        return exc.status, error_body(exc.code, exc.message, rid, tid)
    except Exception:
        log.exception("a /message:send turn failed unexpectedly")
        return 500, error_body("bridge_error", "Bridge request failed.", rid, tid)
    data = turns.artifact_data(outcome, tid)
    if outcome.error is not None and outcome.error.code == "RUNTIME_FAILED":
        extra = {"steps": data.get("steps", []), "diagnostics": data.get("diagnostics", [])}
        return 502, error_body("chat_completions_failed", outcome.error.message, rid, tid, **extra)
    if not outcome.artifacts:
        message = outcome.error.message if outcome.error else "Bridge request failed."
        return 400, error_body("bad_request", message, rid, tid)
    return 200, result_body(data, rid, tid)


def result_body(data: dict[str, Any], rid: str, tid: str) -> dict[str, Any]:
    parts = [{"kind": "text", "text": str(data.get("answer") or "")}]
    return {
        "id": str(uuid.uuid4()),
        "requestId": rid,
        "traceId": tid,
        "status": {"state": "completed", "message": {"parts": parts}},
        "message": {"role": "agent", "parts": parts},
        "artifacts": [{"name": turns.ARTIFACT, "parts": [{"kind": "data", "data": data}]}],
    }


def error_body(code: str, message: str, rid: str, tid: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}, "requestId": rid, "traceId": tid, **extra}


def refusal(error: RequestError, headers: Mapping[str, str]) -> dict[str, Any]:
    """The body of a request refused before it was parsed (bad JSON, too large)."""
    rid, tid = request_id(headers.get("x-request-id")), request_id(headers.get("x-trace-id"))
    return error_body(error.code, error.message, rid, tid)
