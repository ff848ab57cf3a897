"""Medians, ratios and verdicts from the runner's records; the table and the JSON document.

A ratio is bridge ÷ baseline of one metric in one round (both measured minutes apart on fresh
servers); a case's ratio is the median over its rounds. Cases without a baseline are judged on
the bridge's median against an absolute limit.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

# (case prefix, metric, "ratio" | "abs", operator, limit); the first matching prefix wins.
TARGETS: tuple[tuple[str, str, str, str, Any], ...] = (
    ("1 ws", "rate", "ratio", ">=", 0.8),
    ("1 ws", "p99_ms", "ratio", "<=", 1.5),
    ("2 http", "rate", "ratio", ">=", 0.8),
    ("3 stream", "rate", "ratio", ">=", 0.6),
    ("4 paced", "p99_ms", "ratio", "<=", 2.0),
    ("4 paced", "all_complete", "abs", "==", True),
    ("5 idle ws", "kib_per_conn", "ratio", "<=", 2.0),
    ("5 idle sessions", "kib_per_session", "abs", "<=", 256),
    ("6 cold start", "seconds", "ratio", "<=", 1.5),
    ("7 knowledge local-wiki", "p50_ms", "abs", "<=", 50),
    ("7 knowledge llmwiki", "added_p50_ms", "abs", "<=", 10),
)
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
    "spawn_p50_ms",
    "spawn_p99_ms",
    "probe_idle_p50_ms",
    "probe_load_p99_ms",
    "added_p50_ms",
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
    """``{case: {bridge: {metric: median}, baseline: {...}, ratio: {...}, targets: [...], errors}}``."""
    by_case: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_case[record["case"]].append(record)
    return {case: _summarize_case(case, rows) for case, rows in sorted(by_case.items())}


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
    out["ratio"] = {m: _median(v) for m, v in ratios.items()}
    out["targets"] = []
    for prefix, metric, kind, op, limit in TARGETS:
        if case.startswith(prefix):
            value = out["ratio"].get(metric) if kind == "ratio" else out.get("bridge", {}).get(metric)
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


def table(summary: dict[str, Any]) -> str:
    """A plain-text table: one line per target, then the case's other absolute medians."""
    lines = [f"{'case':<24} {'metric':<16} {'bridge':>10} {'baseline':>10} {'ratio':>7}  {'target':<12} verdict"]
    for case, data in summary.items():
        bridge, baseline, ratio = data.get("bridge", {}), data.get("baseline", {}), data["ratio"]
        targeted = {t["metric"] for t in data["targets"]}
        for target in data["targets"]:
            m = target["metric"]
            verdict = {True: "PASS", False: "FAIL", None: "n/a"}[target["ok"]]
            goal = f"{'ratio' if target['kind'] == 'ratio' else ''}{target['op']}{target['limit']}"
            lines.append(
                f"{case:<24} {m:<16} {_fmt(bridge.get(m)):>10} {_fmt(baseline.get(m)):>10} "
                f"{_fmt(ratio.get(m)):>7}  {goal:<12} {verdict}"
            )
        label = "" if data["targets"] else case
        for m in SHOWN:
            if m not in targeted and (m in bridge or m in baseline):
                lines.append(
                    f"{label:<24} {m:<16} {_fmt(bridge.get(m)):>10} "
                    f"{_fmt(baseline.get(m)):>10} {_fmt(ratio.get(m)):>7}  {'reported':<12}"
                )
                label = ""
        for error in data["errors"][:3]:
            lines.append(f"{'':<24} error: {error}")
    return "\n".join(lines)
