"""The provider registry: catalog order, enablement and probe status.

Catalog order (docs/api.md ``acp.capabilities``): codex, opencode, gemini, hermes first, then the
others in configuration order. The cheap probe (does the command resolve?) runs on demand, at most
every ``probeInterval`` seconds per provider; the full probe (ACP ``initialize``) runs once in the
background at start and never blocks a call.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol, runtime_checkable

import anyio
from anyio.abc import TaskGroup, TaskStatus
from msgspec import UNSET

from compat.base import ProbeResult, ProviderAdapter
from compat.settings import normalize_provider_id
from orchestrator.results import ProbeEntry, ProviderEntry

log = logging.getLogger(__name__)


@runtime_checkable
class ServiceAdapter(Protocol):
    """An adapter that runs as a service for the bridge's life (``AcpAdapter``)."""

    async def run(self, *, task_status: TaskStatus[None] = ...) -> None: ...


ADAPTER_CLOSE_TIMEOUT = 10.0
"""Seconds an adapter gets to close (its agents' processes end within cancelGrace + kill waits)."""
FIRST = ("codex", "opencode", "gemini", "hermes")


def catalog_order(ids: list[str]) -> list[str]:
    first = [i for i in FIRST if i in ids]
    return first + [i for i in ids if i not in FIRST]


class ProviderRegistry:
    """Holds the configured adapters and their probe results.

    Args:
        adapters: ``{providerId: adapter}`` in configuration order.
        enabled: ids of adapters the operator enabled (disabled ones stay listed, ``enabled:false``).
        probe_interval: seconds a cheap probe result is reused.
    """

    def __init__(self, adapters: dict[str, ProviderAdapter], enabled: set[str], probe_interval: float = 15.0) -> None:
        self._order = catalog_order(list(adapters))
        self._adapters = adapters
        self._by_form = {normalize_provider_id(i): i for i in reversed(list(adapters))}  # the first wins
        self._enabled = enabled
        self._interval = probe_interval
        self._cheap: dict[str, tuple[float, ProbeResult]] = {}
        self._full: dict[str, tuple[float, ProbeResult]] = {}  # monotonic seconds it was learned, result
        self._probing: dict[str, anyio.Event] = {}
        self._tg: TaskGroup | None = None  # where a provider whose probe failed is probed again
        self._key: tuple[tuple[str, str, str], ...] | None = None  # snapshot_key's memo
        self._key_until = 0.0  # monotonic seconds: the memo holds until a cheap probe is due

    @property
    def ids(self) -> list[str]:
        return list(self._order)

    def resolve_id(self, provider_id: str) -> str:
        """The configured id ``provider_id`` names: itself, or the one it is the app's normalised
        form of (``my-agent`` for ``my_agent``; ``compat.settings.normalize_provider_id``); an id
        naming none is returned as it is."""
        if provider_id in self._adapters:
            return provider_id
        return self._by_form.get(normalize_provider_id(provider_id), provider_id)

    def get(self, provider_id: str) -> ProviderAdapter | None:
        return self._adapters.get(provider_id)

    def category(self, provider_id: str) -> str:
        return self._adapters[provider_id].info.category

    def status(self, provider_id: str) -> ProbeResult:
        if provider_id not in self._enabled:
            return ProbeResult("error", "disabled by configuration")
        now = time.monotonic()
        cached = self._cheap.get(provider_id)
        if cached is None or now - cached[0] > self._interval:
            cached = (now, self._adapters[provider_id].probe_cheap())
            self._cheap[provider_id] = cached
        cheap = cached[1]
        if not cheap.available:
            return cheap
        full = self._full.get(provider_id)
        if full is None:
            return cheap
        if full[1].status == "error" and now - full[0] > self._interval:
            # A failed full probe (a slow first start) does not bar the provider for good: after
            # probeInterval it is routable again and probed again (a turn waits for that probe).
            del self._full[provider_id]
            self._probe_again(provider_id)
            return cheap
        return full[1]

    def snapshot_key(self) -> tuple[tuple[str, str, str], ...]:
        """Changes whenever any provider's reported status does (cheap probes included).

        Memoised until the next cheap probe is due or a full probe or turn changes a status:
        ``acp.capabilities`` asks on every call, and walking every provider each time was a
        visible share of a request in bench case 1.
        """
        now = time.monotonic()
        if self._key is None or now >= self._key_until:
            self._key = tuple((i, *self._status_pair(i)) for i in self._order)
            cached = [self._cheap[i][0] for i in self._order if i in self._cheap]
            self._key_until = min(cached, default=now) + self._interval
        return self._key

    def _status_pair(self, provider_id: str) -> tuple[str, str]:
        probe = self.status(provider_id)
        return probe.status, probe.detail

    def available(self) -> list[str]:
        """Providers a turn may be routed to on the agent target. ``auth_required`` ones stay
        routable: their turn fails with a clear AGENT_AUTH_REQUIRED (and a hint) rather than a
        vague "unavailable"."""
        return [i for i in self._agents() if self.status(i).status in ("ok", "auth_required")]

    def gateway_ids(self) -> list[str]:
        """The enabled gateway providers (category ``gateway``: the ``gateway`` target)."""
        return [i for i in self._order if self._adapters[i].info.category == "gateway" and i in self._enabled]

    def _agents(self) -> list[str]:
        return [i for i in self._order if self._adapters[i].info.category != "gateway"]

    def catalog(self, *, gateways: bool = False) -> list[ProviderEntry]:
        """``providerCatalog`` (the agent target's providers), or ``gatewayProviders``."""
        entries = []
        for provider_id in self.gateway_ids() if gateways else self._agents():
            info = self._adapters[provider_id].info
            probe = self.status(provider_id)
            entries.append(
                ProviderEntry(
                    provider_id=provider_id,
                    label=info.label,
                    targets=list(info.targets),
                    category=info.category,
                    enabled=probe.available,
                    unavailable_reason=UNSET if probe.available else (probe.detail or probe.status),
                )
            )
        return entries

    def probe_summary(self) -> list[ProbeEntry]:
        summary = []
        for provider_id in self._agents():
            probe = self.status(provider_id)
            summary.append(ProbeEntry(provider_id=provider_id, available=probe.available, status=probe.status))
        return summary

    async def probe_all(self) -> dict[str, ProbeResult]:
        """Run every enabled provider's full probe concurrently; results are kept for ``status``
        (a failed one for ``probeInterval`` seconds, then the provider is probed again)."""
        async with anyio.create_task_group() as tg:
            for provider_id in self._order:
                if provider_id in self._enabled and self._adapters[provider_id].probe_cheap().available:
                    self._probing[provider_id] = finished = anyio.Event()
                    tg.start_soon(self._probe, provider_id, finished)
        return {provider_id: result for provider_id, (_, result) in self._full.items()}

    async def _probe(self, provider_id: str, finished: anyio.Event) -> None:
        try:
            try:
                result = await self._adapters[provider_id].probe_full()
            except Exception:  # a probe must never take the bridge down
                log.exception("probe of %s failed unexpectedly", provider_id)
                result = ProbeResult("error", "the probe failed unexpectedly (see the bridge's log)")
            if result.status == "error":
                log.info(
                    "provider %s: probe failed (%s); probed again after %g s",
                    provider_id,
                    result.detail,
                    self._interval,
                )
            self._full[provider_id] = (time.monotonic(), result)
            self._key = None
        finally:
            self._probing.pop(provider_id, None)
            finished.set()

    def _probe_again(self, provider_id: str) -> None:
        if self._tg is not None and provider_id not in self._probing:
            self._probing[provider_id] = finished = anyio.Event()
            self._tg.start_soon(self._probe, provider_id, finished)

    def note_turn(self, provider_id: str, status: str, error_code: str | None, message: str) -> None:
        """What a turn learned about its provider: an auth failure shows as ``auth_required`` in
        the probe summary until a turn completes (a real turn is the most accurate probe)."""
        if error_code == "AGENT_AUTH_REQUIRED":
            self._full[provider_id] = (time.monotonic(), ProbeResult("auth_required", message[:200]))
            self._key = None
        elif status == "completed":
            self._full[provider_id] = (time.monotonic(), ProbeResult("ok"))
            self._key = None

    async def wait_probe(self, provider_id: str, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) for a running full probe of ``provider_id``.

        Some agents keep state in one database per home directory (opencode's SQLite file): a turn
        that spawns a second process while the probe's is starting meets "database is locked".
        """
        finished = self._probing.get(provider_id)
        if finished is not None:
            with anyio.move_on_after(timeout):
                await finished.wait()

    async def start(self, tg: TaskGroup) -> None:
        """Start the adapters that run as services (``run(*, task_status)``: the ACP adapters host
        their agents' pumps); later probes run in ``tg`` too."""
        self._tg = tg
        for adapter in self._adapters.values():
            if isinstance(adapter, ServiceAdapter):
                await tg.start(adapter.run)

    async def aclose(self) -> None:
        """Close every adapter at once, each within :data:`ADAPTER_CLOSE_TIMEOUT` seconds; never
        raises (an adapter's failure is logged and the others still close)."""

        async def close(provider_id: str, adapter: ProviderAdapter) -> None:
            try:
                with anyio.move_on_after(ADAPTER_CLOSE_TIMEOUT) as scope:
                    await adapter.aclose()
                if scope.cancelled_caught:
                    log.warning("provider %s did not close within %g s", provider_id, ADAPTER_CLOSE_TIMEOUT)
            except Exception:
                log.exception("provider %s: closing failed", provider_id)

        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for provider_id, adapter in self._adapters.items():
                    tg.start_soon(close, provider_id, adapter)
