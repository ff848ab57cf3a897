"""acp.capabilities' per-principal ``access`` view follows the model runtime table, which
``knowledge.sources.select {runtime}`` edits while the bridge runs (docs/api.md "Migrating
knowledge.runtime"): no provider status changes when the runtime does."""

from __future__ import annotations

import pytest

from bridge.config import BridgeConfig
from compat.settings import convert

from .conftest import bridge, call

pytestmark = pytest.mark.timeout(60)


async def test_access_llm_follows_a_runtime_registered_at_run_time(tmp_path, primary):
    config = convert(
        {"stateDir": str(tmp_path / "state"), "providers": {"knowledge": {"type": "knowledge"}}}, BridgeConfig
    )
    runtime = {"baseUrl": f"{primary.base_url}/v1", "model": "m-registered"}
    async with bridge(config) as rpc:
        before = await call(rpc, "acp.capabilities", {}, principal="local")
        await call(rpc, "knowledge.sources.select", {"runtime": runtime}, principal="local")
        during = await call(rpc, "acp.capabilities", {}, principal="local")
        await call(rpc, "knowledge.sources.select", {"runtime": None}, principal="local")
        after = await call(rpc, "acp.capabilities", {}, principal="local")
    assert before["access"]["llm"]["available"] is False
    assert during["access"]["llm"]["available"] is True
    assert during["access"]["llm"]["defaultModel"] == "m-registered"
    assert after["access"]["llm"]["available"] is False
