"""``agentflow eval``: evaluate the agent on a benchmark file (``run``, the default) or compare two runs.

Registered by ``agentflow/cli.py`` through :func:`add_eval_parser`. As in the rest of the CLI, user mistakes raise
InvalidInput (one line, exit 2) and nothing heavy is imported until a handler runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

from agentflow import cli_args
from agentflow.errors import InvalidInput
from agentflow.tools import tool_names

EXIT_INTERRUPTED = 130


def add_eval_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``eval`` (with ``run`` and ``compare``) to the ``agentflow`` subcommands; returns the ``eval`` parser."""
    ev = subparsers.add_parser(
        "eval", help="evaluate the agent on a benchmark file, or compare two runs",
        description="Run the agent over a benchmark file and score it (the default; also 'eval run'), "
                    "or compare two runs item by item ('eval compare A B').")
    _run_options(ev, suppress=False)
    ev.set_defaults(handler=_eval_run)
    which = ev.add_subparsers(dest="eval_command", metavar="{run,compare}")
    run = which.add_parser("run", help="evaluate the agent on a benchmark file (the default)")
    _run_options(run, suppress=True)
    run.set_defaults(handler=_eval_run)
    compare = which.add_parser("compare", help="paired comparison of two runs with an exact McNemar test")
    compare.add_argument("a", type=cli_args.existing_path,
                         help="run A: summary.json, results.jsonl, or the run's folder")
    compare.add_argument("b", type=cli_args.existing_path,
                         help="run B: summary.json, results.jsonl, or the run's folder")
    compare.add_argument("--json", action="store_true", help="print the comparison as JSON")
    compare.add_argument("--force", action="store_true",
                         help="compare runs over different data: only the items whose pid and query match")
    compare.set_defaults(handler=_eval_compare)
    return ev


def _kinds() -> list[str]:
    from agentflow.rewards import kind_names

    return kind_names()


def _run_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """The run options; on the ``run`` subcommand their defaults are suppressed so they do not undo options given
    before it (``agentflow eval --limit 3 run …``)."""

    def add(*names, **kw):
        if suppress:
            kw["default"] = argparse.SUPPRESS
        parser.add_argument(*names, **kw)

    add("--data", type=cli_args.readable_file, metavar="FILE",
        help="benchmark file: a JSON list of records with 'query' and 'answer'")
    add("--kind", type=cli_args.names(_kinds, one=True), metavar="{search,math,mcq,gameof24}",
        help="how answers are scored: search, math, mcq or gameof24")
    add("--limit", type=cli_args.integer(1), metavar="N", help="evaluate only the first N items")
    add("--concurrency", type=cli_args.integer(1), metavar="C", default=4,
        help="items solved at once (default 4; the embedded engine batches)")
    add("--out", type=cli_args.out_folder, metavar="DIR",
        help="output folder (default eval_runs/<data>-<kind>-<time>); must not hold a run")
    add("--resume", type=Path, metavar="DIR",
        help="continue the interrupted run in DIR with its own settings: run the items not in its results.jsonl")
    add("--max-steps", type=cli_args.integer(1), metavar="N", help="planner turns at most per item (default 5)")
    add("--max-time", type=cli_args.number(0, lo_open=True), metavar="SECONDS",
        help="seconds per item, answer included (default 120)")
    add("--engine", choices=["embedded", "openai"], help="LLM engine for every module (default: embedded)")
    add("--model", type=cli_args.text(),
        help="embedded: model folder or 'smollm2' (default); openai: served model name")
    add("--endpoint", type=cli_args.url, metavar="URL", help="openai: base URL including /v1")
    add("--api-key", type=cli_args.text(), help="openai: bearer token")
    add("--planner-endpoint", type=cli_args.url, metavar="URL", help="openai: a separate server for the planner")
    add("--planner-model", type=cli_args.text(), help="the planner's model, when it differs")
    add("--tools", type=cli_args.names(tool_names),
        help="comma-separated tool names (default python,search,generalist)")
    add("--corpus", type=cli_args.jsonl_file, metavar="FILE",
        help="JSONL corpus for the search tool (default: the bundled one)")
    add("--retriever", type=cli_args.url, metavar="URL",
        help="the search tool queries this dense retriever (`agentflow serve retriever`) instead of BM25")
    add("--temperature", type=cli_args.number(0), default=0.0, help="planner sampling temperature (default 0)")
    add("--gateway", type=cli_args.address, metavar="HOST:PORT",
        help="evaluate a running deployment through its gateway: its engines, tools and versions answer, the items "
             "go as opted-out traffic (never trained on), and the answers are scored here")
    add("--gateway-api-key", type=cli_args.text(), metavar="KEY", help="sent to the gateway as x-api-key (scope solve)")
    add("--judge-endpoint", type=cli_args.url, metavar="URL",
        help="OpenAI-compatible base URL (with /v1) of an LLM judge for answers the rules reject")
    add("--judge-model", type=cli_args.text(), help="the judge's served model name (default: the server's first)")
    add("--judge-api-key", type=cli_args.text(), help="the judge's bearer token")
    add("--json", action="store_true", default=False, help="print summary.json on stdout")
    add("--no-progress", action="store_true", default=False, help="no progress bar")
    add("--progress-every", type=cli_args.integer(0), metavar="N", default=10,
        help="when stderr is not a terminal: a progress line every N items (default 10; 0: only by time)")
    add("--progress-seconds", type=cli_args.number(0), metavar="S", default=30.0,
        help="when stderr is not a terminal: a progress line at least every S seconds (default 30; 0: only by count)")
    add("--tensorboard-dir", type=cli_args.text(), metavar="DIR",
        help="without MLFLOW_TRACKING_URI: write the run's params and metrics as TensorBoard events under DIR "
             "(default AGENTFLOW_TENSORBOARD_DIR; docs/evaluation.md)")


def _eval_run(args) -> int:
    """Validate everything (files, kind, limits, tools, engine settings, output folder) before loading a model. With
    --resume the settings come from the run's folder (``agentflow.eval.resume``)."""
    from agentflow.eval import resume
    from agentflow.eval.data import data_hash, load_items
    from agentflow.eval.report import write_reports
    from agentflow.eval.runner import RESULTS_FILE, RUN_FILE, SUMMARY_FILE, run_items
    from agentflow.flow.loop import LoopConfig
    from agentflow.rewards import get_kind, kind_names

    stored = None
    if getattr(args, "resume", None) is not None:
        stored = resume.read_run_file(args.resume)
        args = resume.resumed_args(args, stored, _run_defaults())
    if getattr(args, "data", None) is None:
        raise InvalidInput("no data file given (agentflow eval --data FILE.json --kind KIND)")
    if not getattr(args, "kind", None):
        raise InvalidInput(f"no --kind given; one of {', '.join(kind_names())}")
    get_kind(args.kind)
    concurrency = getattr(args, "concurrency", 4)
    if concurrency < 1:
        raise InvalidInput(f"--concurrency must be at least 1, got {concurrency}")
    every, seconds = getattr(args, "progress_every", 10), getattr(args, "progress_seconds", 30.0)
    if every < 0 or seconds < 0:
        raise InvalidInput("--progress-every and --progress-seconds must not be negative")
    limit = getattr(args, "limit", None)
    items, records = load_items(args.data, args.kind, limit)
    loop = LoopConfig(**{k: v for k, v in {"max_steps": getattr(args, "max_steps", None),
                                           "max_time_s": getattr(args, "max_time", None)}.items() if v is not None})
    tool_names, tools_config = _tools(args)
    shared, planner = _engine_settings(args, loop.max_time_s)
    judge = _judge(args, shared.timeout_s)
    digest, selected = data_hash(items), len(items)
    if stored is None:
        out_dir = _out_dir(getattr(args, "out", None), args.data, args.kind, (RESULTS_FILE, SUMMARY_FILE, RUN_FILE))
        run_id, previous, wall_before = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6], [], 0.0
    else:
        out_dir, run_id = args.resume, stored["run_id"]
        previous, items, wall_before = resume.resume_point(out_dir, stored, items, digest)
        print(f"resuming {out_dir}: {len(previous)} of {selected} items done, {len(items)} to run", file=sys.stderr)
    resume.write_run_file(out_dir, run_id=run_id, data_sha256=digest, wall_s_before=wall_before,
                          settings=resume.run_settings(args, limit=limit, concurrency=concurrency, loop=loop,
                                                       tool_names=tool_names, shared=shared, planner=planner))
    run = {
        "run_id": run_id, "data": str(args.data), "data_sha256": digest, "data_records": records, "kind": args.kind,
        "limit": limit,
        "engine": shared.engine, "model": shared.model or ("smollm2" if shared.engine == "embedded" else ""),
        **({"engine": "gateway", "model": "", "gateway": args.gateway} if getattr(args, "gateway", None) else {}),
        "planner_model": planner.model if planner != shared else "", "endpoint": shared.endpoint,
        "tools": ",".join(tool_names), "max_steps": loop.max_steps, "max_time_s": loop.max_time_s,
        "concurrency": concurrency, "temperature": getattr(args, "temperature", 0.0),
        "judge": (f"{judge.name} @ {args.judge_endpoint}" if judge else ""),
    }
    from agentflow import __version__
    from agentflow.flow.build import build_agent
    from agentflow.llm import build_engine

    run["agentflow_version"] = __version__
    engines = []
    try:
        agent = None
        if items and getattr(args, "gateway", None):
            from agentflow.eval.gateway import GatewaySolver

            agent = GatewaySolver(args.gateway, max_steps=getattr(args, "max_steps", None) or 0,
                                  max_time_s=getattr(args, "max_time", None) or 0.0,
                                  api_key=getattr(args, "gateway_api_key", None) or "")
            engines.append(agent)
        elif items:  # a resumed run with nothing left only rewrites its summary and reports
            print(f"loading the {shared.engine} engine …", file=sys.stderr)
            engines.append(build_engine(shared))
            engines.append(engines[0] if planner == shared else build_engine(planner))
            agent = build_agent(engines[0], tool_names, loop, planner_engine=engines[1],
                                planner_temperature=getattr(args, "temperature", 0.0),
                                call_timeout_s=shared.timeout_s, tools_config=tools_config)
        outcome = run_items(agent, items, args.kind, out_dir, run=run, concurrency=concurrency, judge=judge,
                            progress=not getattr(args, "no_progress", False), progress_every=every,
                            progress_interval_s=seconds, previous=previous, wall_s_before=wall_before)
    finally:
        for e in {id(e): e for e in engines + [judge.engine if judge else None]}.values():
            if getattr(e, "close", None):
                e.close()
    paths = write_reports(outcome.summary, out_dir)
    _track(outcome.summary, {**outcome.files, **paths}, getattr(args, "tensorboard_dir", None), outcome.interrupted)
    if getattr(args, "json", False):
        print(json.dumps(outcome.summary, ensure_ascii=False, indent=2))
    else:
        _print_summary(outcome.summary, {**outcome.files, **paths})
    if outcome.interrupted:
        finished = outcome.summary["items"]["finished"]
        print(f"agentflow: interrupted: {finished} of {selected} items finished; their results are in {out_dir} "
              f"(agentflow eval --resume {out_dir} runs the rest)", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def _run_defaults() -> dict:
    """Every run option's default, from a scratch parser (``--resume`` tells a given flag from a default)."""
    scratch = argparse.ArgumentParser(add_help=False)
    _run_options(scratch, suppress=False)
    return vars(scratch.parse_args([]))


def _track(summary: dict, files: dict, tensorboard_dir: str | None, interrupted: bool) -> None:
    """The run on MLflow (MLFLOW_TRACKING_URI) or TensorBoard: its settings as params, the summary's numbers as
    metrics (step 0; not the per-item scores or the histograms), and its output files as artifacts."""
    from agentflow.trainer.tracking import open_tracker

    tracker = open_tracker(f"eval-{summary['run'].get('run_id', '')}", summary["run"],
                           tensorboard_dir=tensorboard_dir, tags={"agentflow.command": "agentflow eval"})
    if tracker.backend == "none":
        return
    tracker.log_metrics(0, {k: {n: x for n, x in v.items() if n != "histogram"} if isinstance(v, dict) else v
                            for k, v in summary.items() if k not in ("run", "scores")})
    for path in files.values():
        tracker.log_artifact(path)
    tracker.close("KILLED" if interrupted else "FINISHED")
    print(f"tracking: {tracker.backend} run {tracker.run_id} ({tracker.run_url})", file=sys.stderr)


def _tools(args):
    """(tool names, ToolsConfig) from --tools, --corpus and --retriever, as ``agentflow run`` reads them."""
    from agentflow.tools.registry import select_tools

    return select_tools(getattr(args, "tools", None), corpus=getattr(args, "corpus", None),
                        retriever=getattr(args, "retriever", None))


def _engine_settings(args, max_time_s: float):
    """(shared, planner) EngineSettings: the AGENTFLOW_* environment overridden by the flags, as for ``agentflow run``;
    a call may take the item's whole ``max_time_s`` (the item's deadline cuts it; a shorter per-call timeout turned
    slow batched calls into errors before the deadline)."""
    from dataclasses import replace

    from agentflow.config import EngineSettings, from_env

    flags = {"engine": getattr(args, "engine", None), "model": getattr(args, "model", None),
             "endpoint": getattr(args, "endpoint", None), "api_key": getattr(args, "api_key", None)}
    shared = from_env(EngineSettings, flags=flags)
    shared = replace(shared, timeout_s=max(shared.timeout_s, max_time_s))
    planner_flags = {"endpoint": getattr(args, "planner_endpoint", None), "model": getattr(args, "planner_model", None)}
    planner = from_env(EngineSettings, "PLANNER_", shared, flags=planner_flags)
    return shared, replace(planner, timeout_s=max(planner.timeout_s, max_time_s))


def _out_dir(given: Path | None, data: Path, kind: str, run_files: tuple[str, ...]) -> Path:
    out = given or Path("eval_runs") / f"{data.stem}-{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists() and not out.is_dir():
        raise InvalidInput(f"--out {out} is a file, not a folder")
    held = [name for name in run_files if (out / name).exists()]
    if held:
        raise InvalidInput(f"--out {out} already holds a run ({held[0]}); choose another folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InvalidInput(f"cannot create --out {out}: {e.strerror}") from None
    return out


def _judge(args, timeout_s: float):
    endpoint = getattr(args, "judge_endpoint", None)
    if not endpoint:
        return None
    from agentflow.llm.openai_engine import OpenAIEngine, OpenAIEngineConfig
    from agentflow.rewards import Judge

    engine = OpenAIEngine(OpenAIEngineConfig(endpoint=endpoint, model=getattr(args, "judge_model", None) or "",
                                             api_key=getattr(args, "judge_api_key", None) or "", timeout_s=timeout_s,
                                             token_details=False))
    return Judge(engine, timeout_s=timeout_s)


def _print_summary(summary: dict, files: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from agentflow.eval.report import fmt

    console = Console(highlight=False)
    table = Table(title=f"{Path(summary['run']['data']).name} ({summary['run']['kind']})", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("accuracy", fmt(summary["accuracy"], "pct") + f"  ({summary['correct']}/{summary['items']['finished']})"),
        ("status", ", ".join(f"{k} {v}" for k, v in summary["status_counts"].items()) or "—"),
        ("turns mean / median", f"{fmt(summary['turns']['mean'])} / {fmt(summary['turns']['median'])}"),
        ("latency p50 / p95", f"{fmt(summary['latency_s']['p50'], 's')} / {fmt(summary['latency_s']['p95'], 's')}"),
        ("tokens (prompt + completion)", f"{fmt(summary['tokens']['prompt'], 'int')} + "
                                         f"{fmt(summary['tokens']['completion'], 'int')}"),
        ("tool calls / error rate", f"{summary['tools']['calls']} / {fmt(summary['tools']['error_rate'], 'pct')}"),
        ("planner parse-error rate", fmt(summary["parse_errors"]["planner_rate"], "pct")),
        ("wall time", fmt(summary["run"]["wall_s"], "s")),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    for name in ("results", "summary", "markdown", "html"):
        if name in files:
            console.print(f"{name}: {files[name]}")


def _eval_compare(args) -> int:
    from agentflow.eval.compare import compare_runs, print_comparison

    result = compare_runs(args.a, args.b, force=args.force)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_comparison(result)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m agentflow.eval.cli eval …``: the same command outside ``agentflow`` (same exit conventions)."""
    from agentflow.errors import AgentFlowError

    parser = cli_args.ArgumentParser(prog="agentflow")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress (model loading, retries)")
    add_eval_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    from agentflow.telemetry.logs import configure_logging

    configure_logging(args.verbose)
    try:
        return args.handler(args)
    except AgentFlowError as e:
        print(f"agentflow: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("agentflow: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
