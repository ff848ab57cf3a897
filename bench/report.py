"""Medians, ratios and verdicts from the runner's records; the table and the JSON document.

A ratio is bridge ÷ baseline of one metric in one round (both measured minutes apart on fresh
servers); a case's ratio is the median over its rounds. An added figure is bridge − baseline of
one metric in one round (case 8: the milliseconds the bridge adds to what a user waits for), and
a case's is again the median over its rounds. Cases without a baseline are judged on the bridge's
median against an absolute limit.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

# (case prefix, metric, kind, operator, limit); a case is judged on every entry whose prefix it
# starts with. kind: "ratio" judges the median per-round bridge ÷ baseline, "added" the median
# per-round bridge − baseline (in the metric's unit), "abs" the bridge's median.
TARGETS: tuple[tuple[str, str, str, str, Any], ...] = (
    ("1 ws", "rate", "ratio", ">=", 0.5),
    ("1 ws", "p99_ms", "ratio", "<=", 2.0),
    ("2 http", "rate", "ratio", ">=", 0.5),
    ("3 stream", "rate", "ratio", ">=", 0.4),
    ("4 paced", "p99_ms", "ratio", "<=", 2.0),
    ("4 paced", "all_complete", "abs", "==", True),
    ("5 idle ws", "kib_per_conn", "ratio", "<=", 2.0),
    ("5 idle sessions", "kib_per_session", "abs", "<=", 256),
    ("6 cold start", "seconds", "ratio", "<=", 1.5),
    ("6 cold acp-stdio", "seconds", "ratio", "<=", 1.5),
    ("7 knowledge local-wiki", "p50_ms", "abs", "<=", 50),
    ("7 knowledge llmwiki", "added_p50_ms", "abs", "<=", 10),
    ("7 knowledge delegated", "added_p50_ms", "abs", "<=", 10),
    ("7 knowledge delegated", "cpu_vs_evidence", "abs", "<=", 2),
    ("8 wait cold", "result_p50_ms", "added", "<=", 25),
    ("8 wait warm", "result_p50_ms", "added", "<=", 5),
)
BASELINE_FROM: dict[str, tuple[str, tuple[str, ...]]] = {
    "6 cold acp-stdio": ("6 cold start", ("seconds",)),
}
"""Cases whose baseline rows are another case's, metric by metric, round by round: ``acp-stdio``
has no baseline of its own, so its first answer is judged against the baseline server's cold start
measured in the same round."""
ADDED = ("first_p50_ms", "result_p50_ms")
"""Metrics whose per-round difference bridge − baseline is summarized (and shown instead of the
ratio), where both sides have them."""
SHOWN = (
    "rate",
    "p50_ms",
    "p99_ms",
    "server_cpu_us",
    "server_cpu_pct",
    "client_cpu_pct",
    "rss_mib",
    "kib_per_conn",
    "kib_per_session",
    "seconds",
    "steady_p50_ms",  # case 4 once every session streams: the relay without the start storm
    "steady_p99_ms",
    "spawn_p50_ms",
    "spawn_p99_ms",
    "probe_idle_p50_ms",  # case 4's event-loop lag: /api/ping round trips, idle and under load
    "probe_load_p50_ms",
    "probe_load_p99_ms",
    "first_p50_ms",
    "first_p99_ms",
    "result_p50_ms",
    "result_p99_ms",
    "added_p50_ms",
    "cpu_ms_per_turn",  # case 7: the bridge's CPU per knowledge turn
    "cpu_vs_evidence",  # case 7: CPU per delegated turn ÷ per evidence-only turn, same run
    "turn_p50_ms",
    "frames",
    "completed",
    "all_complete",
    "dropped",
)


def _median(values: list[Any]) -> Any:
    values = [v for v in values if v is not None]
    if not values:
        return None
    if all(isinstance(v, bool) for v in values):
        return all(values)  # a verdict holds only if it held in every round
    return statistics.median(values)


def _check(value: Any, op: str, limit: Any) -> bool | None:
    if value is None:
        return None
    return {">=": value >= limit, "<=": value <= limit, "==": value == limit}[op]


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """``{case: {bridge: {metric: median}, baseline: {...}, ratio: {...}, added: {...}, targets: [...],
    errors}}``; a case in ``BASELINE_FROM`` also says ``baseline_from``."""
    by_case: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_case[record["case"]].append(record)
    for case, (source, metrics) in BASELINE_FROM.items():
        if case in by_case:
            by_case[case] += [
                {"case": case, "server": "baseline", "round": r["round"], **{m: r[m] for m in metrics if m in r}}
                for r in by_case.get(source, [])
                if r["server"] == "baseline" and "error" not in r
            ]
    summary = {case: _summarize_case(case, rows) for case, rows in sorted(by_case.items())}
    for case, (source, _) in BASELINE_FROM.items():
        if case in summary:
            summary[case]["baseline_from"] = source
    return summary


def _summarize_case(case: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "rounds": len({r["round"] for r in rows}),
        "errors": [r["error"] for r in rows if "error" in r],
    }
    for kind in ("bridge", "baseline"):
        mine = [r for r in rows if r["server"] == kind and "error" not in r]
        if mine:
            out[kind] = {m: _median([r.get(m) for r in mine]) for m in SHOWN if any(m in r for r in mine)}
    ratios: dict[str, list[float]] = defaultdict(list)
    added: dict[str, list[float]] = defaultdict(list)
    for round_ in {r["round"] for r in rows}:
        pair = {r["server"]: r for r in rows if r["round"] == round_}
        bridge, baseline = pair.get("bridge"), pair.get("baseline")
        if bridge is None or baseline is None:
            continue
        for metric in SHOWN:
            b, a = bridge.get(metric), baseline.get(metric)
            if isinstance(b, (int, float)) and isinstance(a, (int, float)) and not isinstance(b, bool) and a:
                ratios[metric].append(b / a)
            elif metric == "rate" and "error" in bridge and isinstance(a, (int, float)):
                ratios[metric].append(0.0)  # a bridge run that failed counts as no throughput
        for metric in ADDED:
            b, a = bridge.get(metric), baseline.get(metric)
            if isinstance(b, (int, float)) and isinstance(a, (int, float)):
                added[metric].append(b - a)
            elif "error" in bridge and isinstance(a, (int, float)):
                added[metric].append(math.inf)  # a bridge run that failed: the user waits for ever
    out["ratio"] = {m: _median(v) for m, v in ratios.items()}
    out["added"] = {m: _median(v) for m, v in added.items()}
    out["targets"] = []
    for prefix, metric, kind, op, limit in TARGETS:
        if case.startswith(prefix):
            value = out[kind].get(metric) if kind in ("ratio", "added") else out.get("bridge", {}).get(metric)
            out["targets"].append(
                {
                    "metric": metric,
                    "kind": kind,
                    "op": op,
                    "limit": limit,
                    "value": value,
                    "ok": _check(value, op, limit),
                }
            )
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def _compared(data: dict[str, Any], metric: str) -> str:
    """The ratio column: the added figure (signed) where there is one, else the ratio."""
    if metric in data["added"]:
        value = data["added"][metric]
        return "-" if value is None else f"{value:+.3g}"
    return _fmt(data["ratio"].get(metric))


def table(summary: dict[str, Any]) -> str:
    """A plain-text table: one line per target, then the case's other absolute medians.

    The ratio column holds bridge ÷ baseline, or for the ``ADDED`` metrics bridge − baseline with
    its sign (e.g. ``+3.2``, in the metric's unit).
    """
    lines = [f"{'case':<24} {'metric':<16} {'bridge':>10} {'baseline':>10} {'ratio':>7}  {'target':<12} verdict"]
    for case, data in summary.items():
        bridge, baseline = data.get("bridge", {}), data.get("baseline", {})
        targeted = {t["metric"] for t in data["targets"]}
        for target in data["targets"]:
            m = target["metric"]
            verdict = {True: "PASS", False: "FAIL", None: "n/a"}[target["ok"]]
            goal = f"{'' if target['kind'] == 'abs' else target['kind']}{target['op']}{target['limit']}"
            lines.append(
                f"{case:<24} {m:<16} {_fmt(bridge.get(m)):>10} {_fmt(baseline.get(m)):>10} "
                f"{_compared(data, m):>7}  {goal:<12} {verdict}"
            )
        label = "" if data["targets"] else case
        for m in SHOWN:
            if m not in targeted and (m in bridge or m in baseline):
                lines.append(
                    f"{label:<24} {m:<16} {_fmt(bridge.get(m)):>10} "
                    f"{_fmt(baseline.get(m)):>10} {_compared(data, m):>7}  {'reported':<12}"
                )
                label = ""
        if "baseline_from" in data:
            lines.append(f"{'':<24} baseline: the baseline's {data['baseline_from']!r}, round by round")
        for error in data["errors"][:3]:
            lines.append(f"{'':<24} error: {error}")
    return "\n".join(lines)
