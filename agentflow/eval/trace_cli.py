"""``agentflow trace show ID --results FILE``: one trajectory of an eval run, step by step or as its raw record.

Registered by ``agentflow/cli.py`` through :func:`add_trace_parser`. An unknown id or an unreadable file raises
InvalidInput (one ``agentflow: error:`` line, exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agentflow.errors import InvalidInput


def add_trace_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``trace`` (with ``show``) to the ``agentflow`` subcommands; returns the ``trace`` parser."""
    trace = subparsers.add_parser("trace", help="show a recorded trajectory",
                                  description="Show one recorded trajectory readably, or as its raw JSON record.")
    which = trace.add_subparsers(dest="trace_command", metavar="{show}", required=True)
    show = which.add_parser("show", help="print one trajectory, found by its trajectory id")
    show.add_argument("trajectory_id", metavar="ID", help="the trajectory id (an eval item's is RUN_ID-PID)")
    show.add_argument("--results", type=Path, metavar="FILE",
                      help="an eval results.jsonl (or the run's folder) holding the trajectory")
    show.add_argument("--json", action="store_true", help="print the raw trajectory record as JSON")
    show.set_defaults(handler=_show)
    return trace


def _results_file(given: Path | None) -> Path:
    from agentflow.eval.runner import RESULTS_FILE

    if given is None:
        raise InvalidInput("no trajectory source given (agentflow trace show ID --results results.jsonl)")
    return given / RESULTS_FILE if given.is_dir() else given


def _show(args) -> int:
    from agentflow.eval.items import find_row, read_results

    path = _results_file(args.results)
    row = find_row(read_results(path), args.trajectory_id)
    if row is None:
        raise InvalidInput(f"no trajectory with id {args.trajectory_id!r} in {path}")
    record = row["record"]
    if args.json:
        print(json.dumps(record, ensure_ascii=False, indent=2))
        return 0
    print_eval_trajectory(row, sys.stdout)
    return 0


def print_eval_trajectory(row: dict, stream) -> None:
    """The row's trajectory step by step, then how the eval scored it."""
    from agentflow.eval.items import gold_text
    from agentflow.trace_view import TracePrinter

    printer = TracePrinter(stream=stream)
    printer.record(row["record"])
    score = row.get("score") or {}
    how = ": ".join(part for part in (score.get("source", ""), score.get("detail", "")) if part)
    verdict = "correct" if row.get("correct") else "wrong"
    printer.status(f"item {row.get('index')} (pid {row.get('pid')}) · gold: {gold_text(row.get('answer'))} · "
                   f"{verdict}, score {score.get('value')}" + (f" ({how})" if how else ""))
