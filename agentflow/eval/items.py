"""The per-item view of a run: ``results.jsonl`` read back, one table row per item, and each item's trajectory as
readable steps (plan, tool input and output, the verifier's verdict, the answer).

The HTML report (``agentflow.eval.items_report``) and ``agentflow trace show`` draw from these. Texts are clipped
here, with a note of how much was cut, so a page of a large run stays bounded.
"""

from __future__ import annotations

import json
from pathlib import Path

from agentflow.errors import InvalidInput

TABLE_TEXT_LIMIT = 300  # characters of a question, answer, prediction or error in a table cell
STEP_TEXT_LIMIT = 2000  # characters of each text in a trajectory (tool input and output, analyses, answer)


def clip(text, limit: int) -> str:
    """``text`` as a string of at most ``limit`` characters plus a note saying how many were cut."""
    text = "" if text is None else str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]} … [{len(text) - limit:,} more characters]"


def read_results(path: str | Path) -> list[dict]:
    """The rows of an eval ``results.jsonl``; InvalidInput when it cannot be read. A torn last line (a run killed
    while writing) is skipped."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"results file {path} does not exist")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidInput(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise InvalidInput(f"{path}: line {number} is not JSON: not an eval results file") from None
        if not isinstance(row, dict) or "pid" not in row:
            raise InvalidInput(f"{path}: line {number} is not an eval result row")
        rows.append(row)
    return rows


def gold_text(answer) -> str:
    """A gold answer as one line: a list of accepted answers joined with `` | ``."""
    if isinstance(answer, list):
        return " | ".join(str(a) for a in answer)
    return "" if answer is None else str(answer)


def tools_used(record: dict | None) -> list[str]:
    """The tools the planner chose, in order of first use."""
    seen: dict[str, None] = {}
    for turn in (record or {}).get("turns", []):
        tool = (turn.get("decision") or {}).get("tool", "")
        if tool and not turn.get("parse_error"):
            seen.setdefault(tool)
    return list(seen)


def trajectory_id(row: dict) -> str:
    return (row.get("record") or {}).get("trajectory_id", "") or ""


def item_row(row: dict) -> dict:
    """One table row of a result row: the columns the report shows, texts clipped to TABLE_TEXT_LIMIT."""
    record = row.get("record") or {}
    return {
        "index": row.get("index"),
        "pid": str(row.get("pid", "")),
        "trajectory_id": trajectory_id(row),
        "question": clip(row.get("query", ""), TABLE_TEXT_LIMIT),
        "gold": clip(gold_text(row.get("answer")), TABLE_TEXT_LIMIT),
        "prediction": clip(row.get("prediction", ""), TABLE_TEXT_LIMIT),
        "correct": bool(row.get("correct")),
        "status": row.get("status", "") or "",
        "turns": len(record.get("turns", [])),
        "tools": tools_used(record),
        "error": clip(row.get("error", ""), TABLE_TEXT_LIMIT),
        "latency_s": row.get("latency_s"),
    }


def item_rows(rows: list[dict]) -> list[dict]:
    """The table rows of ``rows``, in item order (``results.jsonl`` is in order of completion)."""
    return [item_row(r) for r in sorted(rows, key=lambda r: (r.get("index") is None, r.get("index") or 0))]


def trajectory_steps(record: dict | None, limit: int = STEP_TEXT_LIMIT) -> list[dict]:
    """Each planner turn of ``record`` as a step: the plan (sub-goal, tool, context) or why it could not be read,
    the tool's input and output or error, the verifier's verdict and analysis; texts clipped to ``limit``."""
    steps = []
    for turn in (record or {}).get("turns", []):
        decision = turn.get("decision") or {}
        steps.append({
            "step": turn.get("step", len(steps)) + 1,
            "sub_goal": clip(decision.get("sub_goal", ""), limit),
            "tool": decision.get("tool", "") or "",
            "context": clip(decision.get("context", ""), limit),
            "parse_error": clip(turn.get("parse_error", ""), limit),
            "command": clip(turn.get("command", ""), limit),
            "result": clip(turn.get("result", ""), limit),
            "tool_error": clip(turn.get("tool_error", ""), limit),
            "verdict": turn.get("verdict", "") or "",
            "verifier_analysis": clip(turn.get("verifier_analysis", ""), limit),
            "seconds": (turn.get("timings") or {}).get("total_s"),
        })
    return steps


def find_row(rows: list[dict], wanted_id: str) -> dict | None:
    """The row whose trajectory id is ``wanted_id``, or None (also for an empty id)."""
    if not wanted_id:
        return None
    return next((r for r in rows if trajectory_id(r) == wanted_id), None)
