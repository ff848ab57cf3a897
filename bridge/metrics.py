"""``GET /metrics``: the bridge's metrics (``compat.telemetry``) in the Prometheus text format,
written by the official ``prometheus-client`` with its process collector (docs/api.md "Metrics").

prometheus-client is imported with the first scrape, in a worker thread (~38 ms: a sixth of the
cold start), and never by ``acp-stdio``. The values are copied on the event loop, where they
change, and rendered from the copy.

Only administrators (``adminPrincipals``) may read it, unless ``metricsPublic: true``: it shows
every principal's activity.
"""

from __future__ import annotations

from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from bridge.auth import rejection
from bridge.rpc.errors import Unauthorized
from compat.telemetry import METRICS


class MetricsEndpoint:
    """The ASGI app at ``/metrics`` (behind the bridge's token check unless ``public``)."""

    def __init__(self, admins: frozenset[str], *, public: bool) -> None:
        self._admins, self._public = admins, public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        principal = scope.get("state", {}).get("principal")
        if not self._public and principal not in self._admins:
            error = Unauthorized("only adminPrincipals may read /metrics", reason="ADMIN_REQUIRED")
            await rejection(403, error)(scope, receive, send)
            return
        if Request(scope, receive).method != "GET":
            await Response(status_code=405, headers={"allow": "GET"})(scope, receive, send)
            return
        snapshot = METRICS.snapshot()
        body, content_type = await anyio.to_thread.run_sync(render, snapshot)
        await Response(body, media_type=content_type)(scope, receive, send)


def render(snapshot: list[dict[str, Any]]) -> tuple[bytes, str]:
    """The Prometheus text exposition of ``snapshot`` plus the process collector."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    registry.register(_Snapshot(snapshot))  # type: ignore[arg-type]  # a custom collector: collect()
    return generate_latest(registry), CONTENT_TYPE_LATEST


class _Snapshot:
    """A prometheus-client custom collector over one :meth:`Telemetry.snapshot`."""

    def __init__(self, snapshot: list[dict[str, Any]]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        for entry in self.snapshot:
            name, help_text, labels = entry["name"], entry["help"], list(entry["labels"])
            if entry["kind"] == "counter":
                family: Any = CounterMetricFamily(name.removesuffix("_total"), help_text, labels=labels)
                for values, value in entry["values"].items():
                    family.add_metric(list(values), value)
            elif entry["kind"] == "gauge":
                family = GaugeMetricFamily(name, help_text, labels=labels)
                for values, value in entry["values"].items():
                    family.add_metric(list(values), value)
                if not entry["values"] and not labels:
                    family.add_metric([], 0.0)
            else:
                family = HistogramMetricFamily(name, help_text, labels=labels)
                for values, (counts, total) in entry["values"].items():
                    bounds = [*(repr(float(b)) for b in entry["buckets"]), "+Inf"]
                    cumulative, running = [], 0
                    for bound, count in zip(bounds, counts, strict=True):
                        running += count
                        cumulative.append((bound, running))
                    family.add_metric(list(values), cumulative, total)
            yield family
