"""The knowledge adapter behind the real orchestrator: updates, output and artifacts on the wire."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compat.knowledge.adapter import KnowledgeAdapter
from compat.settings import Limits, Timeouts
from orchestrator.models import TurnParams
from orchestrator.registry import ProviderRegistry
from orchestrator.results import TurnResult
from orchestrator.service import Orchestrator
from tests.helpers import conforms, wire
from tests.knowledge.helpers import make_service

pytestmark = pytest.mark.timeout(30)


async def test_a_session_start_routed_to_knowledge_streams_status_and_returns_the_artifact() -> None:
    updates: list[dict[str, Any]] = []
    async with make_service() as service:
        registry = ProviderRegistry({"knowledge": KnowledgeAdapter("knowledge", service)}, {"knowledge"})
        async with Orchestrator(registry, [Path("/tmp").resolve()], Limits(), Timeouts()) as orch:
            params = TurnParams.model_validate(
                {
                    "sessionId": "s1",
                    "taskPrompt": "What approval do refunds over 500 USD need?",
                    "routing": {"explicitProviderId": "knowledge"},
                    "mode": "craft",
                }
            )
            result = wire(await orch.run_turn(params, "local", lambda method, p: updates.append(p), start=True))
    conforms(TurnResult, result)
    artifact = result["artifacts"][0]
    assert result["success"] is True and result["resolvedProviderId"] == "knowledge"
    assert result["output"] == artifact["answer"]
    assert "".join(u["delta"] for u in updates if u["type"] == "delta") == result["output"]
    events = [u["event"] for u in updates if u["type"] == "status"]
    assert events[:3] == ["started", "knowledge.plan", "knowledge.source"] and "knowledge.evidence" in events
    assert updates[-1]["type"] == "done"
