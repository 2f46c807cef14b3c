"""The run summary: every number the reports show, computed once from the per-item rows.

The Markdown and HTML reports and their plots are drawn from this dict alone (``summary.json``), so a report can be
rebuilt from the summary and always agrees with it.
"""

from __future__ import annotations

import math
from collections import Counter

SUMMARY_SCHEMA = "agentflow.eval.summary/1"
LATENCY_BINS = 12


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between the closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> list[float] | None:
    """95 % Wilson score interval for a proportion; None for n = 0."""
    if n == 0:
        return None
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 6), round(min(1.0, centre + half), 6)]


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 6) if whole else None


def _r(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def _histogram(values: list[float], bins: int) -> dict:
    if not values:
        return {"edges": [], "counts": []}
    low, high = min(values), max(values)
    if high == low:
        high = low + 1.0
    width = (high - low) / bins
    counts = [0] * bins
    for v in values:
        counts[min(int((v - low) / width), bins - 1)] += 1
    return {"edges": [round(low + i * width, 6) for i in range(bins + 1)], "counts": counts}


def tool_usage(records: list[dict]) -> dict:
    """Tool calls and failures over the turns of ``records``.

    A turn is a call of the tool its planner chose (turns whose plan could not be parsed make no call); a call
    fails when the turn has a ``tool_error`` — the tool's own error, a timeout, or an executor command that could
    not be parsed (``parse_error: …``; also counted in ``command_parse_errors``).
    """
    per_tool: dict[str, dict] = {}
    command_errors = 0
    for record in records:
        for turn in record.get("turns", []):
            tool = (turn.get("decision") or {}).get("tool", "")
            if turn.get("parse_error") or not tool:
                continue
            stats = per_tool.setdefault(tool, {"calls": 0, "errors": 0})
            stats["calls"] += 1
            error = turn.get("tool_error", "")
            if error:
                stats["errors"] += 1
                command_errors += error.startswith("parse_error")
    for stats in per_tool.values():
        stats["error_rate"] = _rate(stats["errors"], stats["calls"])
    calls = sum(s["calls"] for s in per_tool.values())
    errors = sum(s["errors"] for s in per_tool.values())
    return {"calls": calls, "errors": errors, "error_rate": _rate(errors, calls),
            "command_parse_errors": command_errors,
            "per_tool": dict(sorted(per_tool.items(), key=lambda kv: (-kv[1]["calls"], kv[0])))}


def summarize(rows: list[dict], run: dict, *, selected: int) -> dict:
    """The summary of ``rows`` (one per finished item, as the runner writes them) for a run over ``selected`` items.

    ``run`` describes the run (data file, kind, engine, limits, timing); it is copied in as ``run``.
    """
    n = len(rows)
    records = [r["record"] for r in rows if r.get("record")]
    correct = sum(1 for r in rows if r["score"]["value"] >= 0.5)
    statuses = Counter(r["status"] for r in rows)
    turns = [len(rec.get("turns", [])) for rec in records]
    latencies = [r["latency_s"] for r in rows if r.get("latency_s") is not None]
    all_turns = [t for rec in records for t in rec.get("turns", [])]
    planner_errors = sum(1 for t in all_turns if t.get("parse_error"))
    verdicts = Counter(t.get("verdict") or "none" for t in all_turns)
    prompt_tokens = sum(rec.get("totals", {}).get("prompt_tokens", 0) for rec in records)
    completion_tokens = sum(rec.get("totals", {}).get("completion_tokens", 0) for rec in records)
    by_turns: dict[str, dict] = {}
    for r in rows:
        count = len((r.get("record") or {}).get("turns", []))
        cell = by_turns.setdefault(str(count), {"items": 0, "correct": 0})
        cell["items"] += 1
        cell["correct"] += r["score"]["value"] >= 0.5
    judged = sum(1 for r in rows if r["score"].get("source") == "judge")
    wall = run.get("wall_s") or 0.0
    errors = statuses.get("error", 0) + statuses.get("invalid", 0)
    return {
        "schema": SUMMARY_SCHEMA,
        "run": run,
        "items": {"selected": selected, "finished": n, "not_run": selected - n, "errors": errors,
                  "error_rate": _rate(errors, n), "judged": judged},
        "accuracy": _rate(correct, n),
        "correct": correct,
        "accuracy_ci95": wilson_interval(correct, n),
        "status_counts": dict(sorted(statuses.items())),
        "turns": {
            "mean": _r(sum(turns) / len(turns)) if turns else None,
            "median": _r(percentile(turns, 50)),
            "max": max(turns) if turns else None,
            "total": len(all_turns),
            "histogram": dict(sorted(by_turns.items(), key=lambda kv: int(kv[0]))),
        },
        "latency_s": {
            "mean": _r(sum(latencies) / len(latencies)) if latencies else None,
            "p50": _r(percentile(latencies, 50)),
            "p95": _r(percentile(latencies, 95)),
            "max": _r(max(latencies)) if latencies else None,
            "histogram": _histogram(latencies, LATENCY_BINS),
        },
        "tokens": {
            "prompt": prompt_tokens,
            "completion": completion_tokens,
            "total": prompt_tokens + completion_tokens,
            "mean_per_item": _r((prompt_tokens + completion_tokens) / n, 2) if n else None,
        },
        "tools": tool_usage(records),
        "parse_errors": {"planner": planner_errors, "planner_rate": _rate(planner_errors, len(all_turns)),
                         "turns": len(all_turns)},
        "verdicts": dict(sorted(verdicts.items())),
        "throughput_items_per_min": _r(n / wall * 60, 3) if wall > 0 else None,
        "scores": {r["pid"]: r["score"]["value"] for r in sorted(rows, key=lambda r: r["index"])},
    }
