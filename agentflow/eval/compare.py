"""Paired comparison of two runs over the same items, with an exact McNemar test.

Each run is read from its ``summary.json`` (its ``scores`` map pid -> reward), its ``results.jsonl`` (one row per
item with ``pid`` and ``score``), or a run folder holding either. Items are paired by pid; only items present in
both runs count, and only if both runs are over the same data: the same ``run.data_sha256`` in their summaries, or,
for runs written before it existed, the same query under every pid they share (from ``results.jsonl``). Otherwise
the comparison is refused unless forced, and then pairs only the items whose pid and query both match.
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
    scores, run, _ = load_run(path)
    return scores, run


def load_run(path: str | Path) -> tuple[dict[str, float], dict, dict[str, str] | None]:
    """(pid -> reward value, run description, pid -> query) of one run; the queries come from ``results.jsonl`` (the
    file given, or the one beside the summary) and are None when there is none."""
    path = Path(path)
    if path.is_dir():
        for name in (SUMMARY_FILE, RESULTS_FILE):
            if (path / name).is_file():
                return load_run(path / name)
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
        return {str(k): float(v) for k, v in scores.items()}, data.get("run", {}), _queries_beside(path)
    if isinstance(data, list):
        raise InvalidInput(f"{path} is a JSON list: give an eval summary.json or results.jsonl")
    scores, queries = {}, {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            scores[str(row["pid"])] = float(row["score"]["value"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise InvalidInput(f"{path} line {number} is not an eval result row "
                               "(JSON with 'pid' and 'score')") from None
        if "query" in row:
            queries[str(row["pid"])] = row["query"]
    if not scores:
        raise InvalidInput(f"{path} holds no results")
    return scores, {}, queries if len(queries) == len(scores) else None


def _queries_beside(summary: Path) -> dict[str, str] | None:
    from agentflow.eval.items import read_results

    try:
        rows = read_results(summary.parent / RESULTS_FILE)
    except InvalidInput:  # absent or unreadable: the queries are unknown
        return None
    queries = {str(r["pid"]): r["query"] for r in rows if "query" in r}
    return queries if len(queries) == len(rows) else None


def data_mismatch(run_a: dict, run_b: dict, queries_a: dict | None, queries_b: dict | None) -> str:
    """Why two runs are not over the same data ("" when they are, or when nothing tells): their data hashes
    differ, or, when either has none, a pid they share holds different queries."""
    hash_a, hash_b = run_a.get("data_sha256"), run_b.get("data_sha256")
    if hash_a and hash_b:
        return "" if hash_a == hash_b else (f"were run on different data "
                                            f"(data_sha256 {hash_a[:12]}… ≠ {hash_b[:12]}…)")
    if queries_a is None or queries_b is None:
        return ""
    differ = sorted(pid for pid in queries_a.keys() & queries_b.keys() if queries_a[pid] != queries_b[pid])
    return f"hold different queries under {len(differ)} shared pids (pid {differ[0]!r} first)" if differ else ""


def compare_runs(a: str | Path, b: str | Path, *, force: bool = False) -> dict:
    """The paired comparison of run ``a`` and run ``b`` (a reward of at least 0.5 counts as correct).

    Refused (InvalidInput) when the runs are over different data (:func:`data_mismatch`); ``force`` compares them
    anyway over the items whose pid and query both match (by pid alone where a run's queries are unknown).
    """
    scores_a, run_a, queries_a = load_run(a)
    scores_b, run_b, queries_b = load_run(b)
    mismatch = data_mismatch(run_a, run_b, queries_a, queries_b)
    if mismatch and not force:
        raise InvalidInput(f"{a} and {b} {mismatch}: a paired test needs the same items; --force pairs only the "
                           "items whose pid and query match")
    shared = [pid for pid in scores_a if pid in scores_b]
    known = queries_a is not None and queries_b is not None
    common = [pid for pid in shared if not (mismatch and known) or queries_a[pid] == queries_b[pid]]
    if not common:
        raise InvalidInput(f"{a} and {b} have no items in common (items are paired by pid"
                           f"{' and query' if mismatch and known else ''})")
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
        "only_in_a": len(scores_a) - len(shared),
        "only_in_b": len(scores_b) - len(shared),
        "query_differs": len(shared) - n,
        "data_mismatch": mismatch,
        "difference": round(acc_b - acc_a, 6),
        "both_correct": both,
        "only_a_correct": only_a,
        "only_b_correct": only_b,
        "both_wrong": neither,
        "mcnemar_p": mcnemar_exact(only_a, only_b),
        "test": "exact McNemar (two-sided binomial test on the discordant pairs)",
    }
    if mismatch:
        result["warning"] = (f"--force: the runs {mismatch}; paired {n} items whose pid "
                             f"{'and query match' if known else 'matches (queries unknown)'}, dropped "
                             f"{len(shared) - n} whose query differs, {result['only_in_a']} only in A and "
                             f"{result['only_in_b']} only in B")
    elif not (run_a.get("data_sha256") and run_b.get("data_sha256")) and not known:
        result["warning"] = "not checked that both runs are over the same data (no data hash, no results.jsonl)"
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
