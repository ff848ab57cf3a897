"""A knowledge turn for the A2A surface: checked, run on the bridge's ``KnowledgeService`` (as the
MCP ``llmwiki_agent_run`` tool runs one), and its ``llmwiki_agent_result`` artifact.

Must not import: ``orchestrator`` or a2a-sdk.
"""

from __future__ import annotations

import uuid
from typing import Any

from bridge.a2a_server.shape import KnowledgeRequest, RequestError
from bridge.rpc.errors import RpcError
from compat.base import TurnOutcome, TurnSink
from compat.knowledge.engine import TurnInput

ARTIFACT = "llmwiki_agent_result"


def request_error(exc: RpcError) -> RequestError:
    """A -32602 from the knowledge service as the LLMWiki bridge's 400 codes (§2.3, §2.6)."""
    if exc.name == "RETRIEVAL_MODE_UNSUPPORTED":
        return RequestError(exc.message, "retrieval_mode_unsupported")
    errors = exc.data.get("errors") or [{}]
    where = str(exc.data.get("field") or errors[0].get("loc") or "")
    return RequestError(exc.message, "invalid_retrieval_intent" if where.startswith("retrieval") else "bad_request")


async def preflight(service: Any, request: KnowledgeRequest) -> None:
    """Reject a turn that cannot run, before any task or answer exists.

    Raises:
        RequestError: a bad ``orchestrationMode``, ``retrieval`` or ``knowledgeSources``.
    """
    try:
        await service.preflight(request.extra)
    except RpcError as exc:
        raise request_error(exc) from exc


async def run(service: Any, request: KnowledgeRequest, sink: TurnSink, turn_id: str) -> TurnOutcome:
    """Run the turn (never raises for source or runtime failures: they are in the outcome)."""
    session = request.session_id or f"a2a-{uuid.uuid4().hex[:12]}"
    turn = TurnInput(request.query, session, request.thread_id or session, turn_id, request.history)
    return await service.run_turn(request.extra, turn, sink)


def artifact_data(outcome: TurnOutcome, trace_id: str | None = None) -> dict[str, Any]:
    """The ``llmwiki_agent_result`` data (without the bridge's own ``type``/``name`` keys)."""
    artifact = dict((outcome.artifacts or [{}])[0])
    artifact.pop("type", None)
    artifact.pop("name", None)
    if trace_id:
        artifact["traceId"] = trace_id
    return artifact


def answer(outcome: TurnOutcome) -> str:
    return str((outcome.artifacts or [{}])[0].get("answer") or "")
