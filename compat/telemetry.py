"""The bridge's own counters, histograms and gauges (docs/api.md "Metrics"), kept in plain Python.

Every layer counts here (the dispatcher its requests, turns their ends, the process layer its
spawns, …) and ``GET /metrics`` renders these values with the official ``prometheus-client``
(``bridge.metrics``: its exposition format, metric families and process collector). The values
live here rather than in prometheus-client's own ``Counter`` / ``Histogram`` objects because
importing prometheus-client costs ~38 ms, a sixth of the bridge's cold start (bench case 6), and
``acp-stdio`` never serves metrics: it is imported with the first scrape instead.

Label values are bounded sets: method names from the registry (others count as ``other``),
provider ids from the configuration, outcomes and limit names from the code. Never a prompt, a
token, a principal or a path.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Labels = tuple[str, ...]
REQUEST_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
TURN_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
MAX_SERIES = 1000
"""Label combinations one metric keeps at most; more are counted under ``other`` values."""


class Counter:
    """A monotonic count per label combination."""

    kind = "counter"

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        self.name, self.help, self.labels = name, help, tuple(labels)
        self.values: dict[Labels, float] = {}

    def inc(self, *labels: str, by: float = 1.0) -> None:
        key = _key(self.values, labels)
        self.values[key] = self.values.get(key, 0.0) + by

    def value(self, *labels: str) -> float:
        return self.values.get(tuple(labels), 0.0)


class Histogram:
    """Observations per label combination in fixed buckets (upper bounds, seconds)."""

    kind = "histogram"

    def __init__(self, name: str, help: str, labels: Sequence[str] = (), buckets: Sequence[float] = REQUEST_BUCKETS):
        self.name, self.help, self.labels, self.buckets = name, help, tuple(labels), tuple(buckets)
        self.values: dict[Labels, tuple[list[int], list[float]]] = {}  # labels -> (bucket counts, [sum])

    def observe(self, value: float, *labels: str) -> None:
        key = _key(self.values, labels)
        entry = self.values.get(key)
        if entry is None:
            entry = self.values[key] = ([0] * (len(self.buckets) + 1), [0.0])
        entry[0][bisect.bisect_left(self.buckets, value)] += 1
        entry[1][0] += value

    def count(self, *labels: str) -> int:
        entry = self.values.get(tuple(labels))
        return sum(entry[0]) if entry else 0


class Gauge:
    """A value per label combination: set as it changes, or read from ``function`` at scrape."""

    kind = "gauge"

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        self.name, self.help, self.labels = name, help, tuple(labels)
        self.values: dict[Labels, float] = {}
        self.functions: dict[Labels, Callable[[], float]] = {}

    def add(self, by: float, *labels: str) -> None:
        key = _key(self.values, labels)
        self.values[key] = self.values.get(key, 0.0) + by

    def set_function(self, function: Callable[[], float], *labels: str) -> None:
        self.functions[tuple(labels)] = function

    def read(self) -> dict[Labels, float]:
        out = dict(self.values)
        for labels, function in list(self.functions.items()):
            try:
                out[labels] = float(function())
            except Exception:  # a source that went away: not this scrape's concern
                continue
        return out


def _key(values: Mapping[Labels, object], labels: Sequence[str]) -> Labels:
    key = tuple(labels)
    if key not in values and len(values) >= MAX_SERIES:
        return tuple("other" for _ in key)
    return key


class Telemetry:
    """Every metric the bridge keeps (one instance per process: :data:`METRICS`)."""

    def __init__(self) -> None:
        self.requests = Counter("xworkmate_requests_total", "JSON-RPC requests answered", ("method", "outcome"))
        self.request_seconds = Histogram(
            "xworkmate_request_duration_seconds", "Time to answer a JSON-RPC request", ("method",)
        )
        self.connections = Gauge("xworkmate_connections", "Open client connections", ("transport",))
        self.sessions = Gauge("xworkmate_sessions", "Sessions in memory, and those with a running turn", ("state",))
        self.turns = Counter("xworkmate_turns_total", "Turns ended", ("provider", "status"))
        self.turn_seconds = Histogram(
            "xworkmate_turn_duration_seconds", "A turn's time from start to end", ("provider",), TURN_BUCKETS
        )
        self.first_delta_seconds = Histogram(
            "xworkmate_turn_first_delta_seconds",
            "A turn's time from start to its first streamed text",
            ("provider",),
            TURN_BUCKETS,
        )
        self.agents_started = Counter("xworkmate_agent_processes_started_total", "Agent and profile processes started")
        self.agents_live = Gauge("xworkmate_agent_processes", "Agent and profile processes alive")
        self.permissions = Counter(
            "xworkmate_permission_requests_total", "Agents' permission requests, by how they ended", ("outcome",)
        )
        self.updates_sent = Counter("xworkmate_updates_sent_total", "session.update notifications queued to clients")
        self.outbound_dropped = Counter(
            "xworkmate_outbound_dropped_total",
            "Envelopes (updates, replies) not queued because their client was too far behind (it is dropped)",
        )
        self.outbound_bytes = Gauge("xworkmate_outbound_queue_bytes", "Bytes waiting in connections' outbound queues")
        self.source_calls = Counter(
            "xworkmate_knowledge_source_calls_total", "Knowledge source calls", ("source_type", "outcome")
        )
        self.model_calls = Counter("xworkmate_model_calls_total", "Model runtime calls", ("runtime", "outcome"))
        self.model_tokens = Counter(
            "xworkmate_model_tokens_total", "Tokens model runtimes reported", ("runtime", "direction")
        )
        self.limit_refusals = Counter("xworkmate_limit_refusals_total", "Requests refused by a limit", ("limit",))

    @property
    def all(self) -> list[Counter | Histogram | Gauge]:
        return [m for m in vars(self).values() if isinstance(m, Counter | Histogram | Gauge)]

    def snapshot(self) -> list[dict[str, Any]]:
        """Every metric's values, copied (call it on the event loop, where they change; render
        the copy anywhere): ``{kind, name, help, labels, values, buckets?}``."""
        out = []
        for metric in self.all:
            entry: dict[str, Any] = {"kind": metric.kind, "name": metric.name, "help": metric.help}
            entry["labels"] = metric.labels
            if isinstance(metric, Gauge):
                entry["values"] = metric.read()
            elif isinstance(metric, Histogram):
                entry["values"] = {k: (list(c), s[0]) for k, (c, s) in metric.values.items()}
                entry["buckets"] = metric.buckets
            else:
                entry["values"] = dict(metric.values)
            out.append(entry)
        return out

    def tokens(self, runtime: str, usage: Mapping[str, object]) -> None:
        """Count a model reply's ``inputTokens`` / ``outputTokens``."""
        for key, direction in (("inputTokens", "input"), ("outputTokens", "output")):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                self.model_tokens.inc(runtime, direction, by=value)


METRICS = Telemetry()
"""The process's metrics."""
