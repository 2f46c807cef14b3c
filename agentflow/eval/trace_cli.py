"""``agentflow trace show ID [--results FILE]``: one recorded trajectory, step by step or as its raw record: an
eval run's item, or a query ``agentflow run`` answered (it keeps each record in ``RUNS_DIR``, where ``show`` looks
when no ``--results`` is given).

Registered by ``agentflow/cli.py`` through :func:`add_trace_parser`. An unknown id or an unreadable file raises
InvalidInput (one ``agentflow: error:`` line, exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agentflow import cli_args
from agentflow.errors import InvalidInput

RUNS_DIR = Path(".agentflow/runs")  # `agentflow run` keeps each trajectory record here, as ID.json


def save_run(record: dict, folder: Path = RUNS_DIR) -> Path:
    """Keep a record `agentflow run` produced where `trace show` finds it; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{record['trajectory_id']}.json"
    path.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
    return path


def add_trace_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``trace`` (with ``show``) to the ``agentflow`` subcommands; returns the ``trace`` parser."""
    trace = subparsers.add_parser("trace", help="show a recorded trajectory",
                                  description="Show one recorded trajectory readably, or as its raw JSON record.")
    which = trace.add_subparsers(dest="trace_command", metavar="{show}", required=True)
    show = which.add_parser("show", help="print one trajectory, found by its trajectory id")
    show.add_argument("trajectory_id", metavar="ID", type=cli_args.text(), help="the trajectory id (an eval item's is RUN_ID-PID)")
    show.add_argument("--results", type=cli_args.existing_path, metavar="FILE",
                      help="an eval results.jsonl (or the run's folder), or a record `agentflow run --json` printed "
                           f"(default: the records `agentflow run` kept in {RUNS_DIR})")
    show.add_argument("--json", action="store_true", help="print the raw trajectory record as JSON")
    show.set_defaults(handler=_show)
    return trace


def _results_file(given: Path | None, trajectory_id: str) -> Path:
    from agentflow.eval.runner import RESULTS_FILE

    if given is None:
        kept = RUNS_DIR / f"{Path(trajectory_id).name}.json"
        if not kept.is_file():
            raise InvalidInput(f"no record {kept} (`agentflow run` keeps its records there): give the file that "
                               "holds the trajectory with --results")
        return kept
    return given / RESULTS_FILE if given.is_dir() else given


def _run_record(path: Path) -> dict | None:
    """The trajectory record in ``path`` when it holds one JSON record (`agentflow run`'s), else None."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and "turns" in data and "trajectory_id" in data else None


def _show(args) -> int:
    from agentflow.eval.items import find_row, read_results

    path = _results_file(args.results, args.trajectory_id)
    record = _run_record(path)
    if record is not None:
        if record["trajectory_id"] != args.trajectory_id:
            raise InvalidInput(f"{path} holds trajectory {record['trajectory_id']!r}, not {args.trajectory_id!r}")
        row = {"record": record}
    else:
        row = find_row(read_results(path), args.trajectory_id)
        if row is None:
            raise InvalidInput(f"no trajectory with id {args.trajectory_id!r} in {path}")
    if args.json:
        print(json.dumps(row["record"], ensure_ascii=False, indent=2))
    elif "pid" in row:
        print_eval_trajectory(row, sys.stdout)
    else:
        from agentflow.trace_view import TracePrinter

        TracePrinter(stream=sys.stdout).record(record)
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
