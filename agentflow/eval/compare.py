"""Paired comparison of two runs over the same items, with an exact McNemar test.

Each run is read from its ``summary.json`` (its ``scores`` map pid -> reward), its ``results.jsonl`` (one row per
item with ``pid`` and ``score``), or a run folder holding either. Items are paired by pid; only items present in
both runs count.
"""

from __future__ import annotations

import json
from math import comb
from pathlib import Path

from agentflow.errors import InvalidInput
from agentflow.eval.runner import RESULTS_FILE, SUMMARY_FILE


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for ``b`` and ``c`` discordant pairs (A right/B wrong, A wrong/B right).

    Under the null hypothesis each discordant pair is equally likely to go either way, so min(b, c) follows
    Binomial(b + c, 1/2); the p-value is twice its lower tail, capped at 1 (and 1 when there are no discordant
    pairs). Computed exactly with integers: sum_{k<=min(b,c)} C(n, k) / 2^(n-1).
    """
    if b < 0 or c < 0:
        raise ValueError("counts must be non-negative")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(comb(n, k) for k in range(min(b, c) + 1))
    return min(1.0, tail / 2 ** (n - 1))


def load_scores(path: str | Path) -> tuple[dict[str, float], dict]:
    """(pid -> reward value, run description) of one run; InvalidInput when the file cannot be read as a run."""
    path = Path(path)
    if path.is_dir():
        for name in (SUMMARY_FILE, RESULTS_FILE):
            if (path / name).is_file():
                return load_scores(path / name)
        raise InvalidInput(f"{path} holds neither {SUMMARY_FILE} nor {RESULTS_FILE}")
    if not path.is_file():
        raise InvalidInput(f"run file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidInput(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        scores = data.get("scores")
        if not isinstance(scores, dict):
            raise InvalidInput(f"{path} is a JSON object without 'scores': not an eval summary")
        return {str(k): float(v) for k, v in scores.items()}, data.get("run", {})
    if isinstance(data, list):
        raise InvalidInput(f"{path} is a JSON list: give an eval summary.json or results.jsonl")
    scores = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            scores[str(row["pid"])] = float(row["score"]["value"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise InvalidInput(f"{path} line {number} is not an eval result row "
                               "(JSON with 'pid' and 'score')") from None
    if not scores:
        raise InvalidInput(f"{path} holds no results")
    return scores, {}


def compare_runs(a: str | Path, b: str | Path) -> dict:
    """The paired comparison of run ``a`` and run ``b`` (a reward of at least 0.5 counts as correct)."""
    scores_a, run_a = load_scores(a)
    scores_b, run_b = load_scores(b)
    common = [pid for pid in scores_a if pid in scores_b]
    if not common:
        raise InvalidInput(f"{a} and {b} have no items in common (items are paired by pid)")
    both = only_a = only_b = neither = 0
    for pid in common:
        right_a, right_b = scores_a[pid] >= 0.5, scores_b[pid] >= 0.5
        both += right_a and right_b
        only_a += right_a and not right_b
        only_b += right_b and not right_a
        neither += not right_a and not right_b
    n = len(common)
    acc_a, acc_b = (both + only_a) / n, (both + only_b) / n
    result = {
        "a": {"path": str(a), "data": run_a.get("data", ""), "kind": run_a.get("kind", ""), "items": len(scores_a),
              "accuracy": round(acc_a, 6)},
        "b": {"path": str(b), "data": run_b.get("data", ""), "kind": run_b.get("kind", ""), "items": len(scores_b),
              "accuracy": round(acc_b, 6)},
        "paired_items": n,
        "only_in_a": len(scores_a) - n,
        "only_in_b": len(scores_b) - n,
        "difference": round(acc_b - acc_a, 6),
        "both_correct": both,
        "only_a_correct": only_a,
        "only_b_correct": only_b,
        "both_wrong": neither,
        "mcnemar_p": mcnemar_exact(only_a, only_b),
        "test": "exact McNemar (two-sided binomial test on the discordant pairs)",
    }
    if run_a.get("data") and run_b.get("data") and Path(run_a["data"]).name != Path(run_b["data"]).name:
        result["warning"] = f"the runs are over different data files ({run_a['data']} vs {run_b['data']})"
    return result


def print_comparison(result: dict, stream=None) -> None:
    """The comparison as a table (rich)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=stream, highlight=False)
    table = Table(title=f"paired comparison over {result['paired_items']} items")
    table.add_column("")
    table.add_column("A", justify="right")
    table.add_column("B", justify="right")
    table.add_row("run", Path(result["a"]["path"]).as_posix(), Path(result["b"]["path"]).as_posix())
    table.add_row("items in the run", str(result["a"]["items"]), str(result["b"]["items"]))
    table.add_row("accuracy (paired items)", f"{result['a']['accuracy'] * 100:.1f}%",
                  f"{result['b']['accuracy'] * 100:.1f}%")
    table.add_row("correct only here", str(result["only_a_correct"]), str(result["only_b_correct"]))
    console.print(table)
    console.print(f"difference B − A: {result['difference'] * 100:+.1f} points · both correct {result['both_correct']}"
                  f" · both wrong {result['both_wrong']}")
    console.print(f"exact McNemar p = {result['mcnemar_p']:.4g}"
                  f"{'' if result['mcnemar_p'] < 0.05 else ' (not significant at 0.05)'}")
    if result.get("warning"):
        console.print(f"[yellow]warning: {result['warning']}[/yellow]")
