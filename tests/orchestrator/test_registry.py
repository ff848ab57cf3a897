"""``orchestrator.registry``: a failed full probe bars a provider only for ``probeInterval``; then
the provider is routable again and probed again (a slow first start, as a cold ``npx``, once
made a working agent unavailable until the bridge restarted)."""

from __future__ import annotations

import anyio

from compat.base import ProbeResult
from orchestrator.registry import ProviderRegistry
from tests.orchestrator.fake_adapter import FakeAdapter

WAIT = 10.0


class FlakyAdapter(FakeAdapter):
    def __init__(self, *results: ProbeResult) -> None:
        super().__init__()
        self.results = list(results)
        self.probes = 0

    async def probe_full(self) -> ProbeResult:
        self.probes += 1
        return self.results.pop(0) if self.results else ProbeResult("ok")


async def test_a_failed_probe_expires_and_the_provider_is_probed_again() -> None:
    adapter = FlakyAdapter(ProbeResult("error", "initialize timed out after 1.0 s"))
    registry = ProviderRegistry({"fake": adapter}, {"fake"}, probe_interval=0.05)
    async with anyio.create_task_group() as tg:
        await registry.start(tg)
        await registry.probe_all()
        assert registry.status("fake").status == "error" and registry.available() == []
        with anyio.fail_after(WAIT):
            while registry.status("fake").status != "ok" or adapter.probes < 2:
                await anyio.sleep(0.02)  # probeInterval passing: the time the rule is about
        assert registry.available() == ["fake"]
        tg.cancel_scope.cancel()


async def test_a_provider_that_needs_authentication_stays_so_until_a_turn_completes() -> None:
    adapter = FlakyAdapter(ProbeResult("ok"))
    registry = ProviderRegistry({"fake": adapter}, {"fake"}, probe_interval=0.01)
    registry.note_turn("fake", "failed", "AGENT_AUTH_REQUIRED", "Authentication required")
    with anyio.fail_after(WAIT):
        await anyio.sleep(0.05)  # several probe intervals: auth_required is not a passing failure
    assert registry.status("fake").status == "auth_required" and adapter.probes == 0
    registry.note_turn("fake", "completed", None, "completed")
    assert registry.status("fake").status == "ok"
