"""`agentflow eval` on the search benchmarks with the real search tools against local stand-ins (issue 19).

The pages in ``tests/fixtures/search_eval/pages.jsonl`` (written for this project, see the README beside them) hold
the facts needed to answer the first 20 items of ``bamboogle.json`` and of ``hotpotqa.json``, plus distractors.
They are served two ways:

* ``wikipedia``: a local MediaWiki Action API stand-in (``tests/standins/web.py``), read by the real ``wikipedia``
  tool through ``AGENTFLOW_WIKIPEDIA_URL``;
* ``retriever``: a dense index of the same pages (``agentflow.retrieval.index.build_index``) behind the retriever
  service, read by the ``search`` tool through ``AGENTFLOW_RETRIEVER_URL``.

``--check`` needs no LLM: it sends every item's question (the benchmark's ``question`` without its answer-format
instruction) to each tool once and reports whether the item's pages come back (page recall) and whether a gold
answer string occurs in the tool's output. Without ``--check`` it runs ``agentflow eval`` as a subprocess per
(dataset, tool) and prints one JSON object: accuracy, items, mean tool calls per item, tool errors, and the eval's
output folder (its ``report.md`` / ``report.html`` have the per-item table).

    .venv/bin/python bench/search_eval.py --check
    .venv/bin/python bench/search_eval.py --out /tmp/search_eval          # tens of minutes on 2 CPU cores
    .venv/bin/python bench/search_eval.py -- --engine openai --endpoint http://host:8000/v1 --model NAME

Anything after ``--`` is passed to ``agentflow eval`` unchanged. The benchmark files are read from
``--benchmarks`` (default ``$AGENTFLOW_BENCHMARKS``, else ``../shared/benchmarks`` beside the repository); they are
not part of the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "search_eval"
PAGES = FIXTURES / "pages.jsonl"
ITEMS = FIXTURES / "items.json"
DATASETS = ("bamboogle", "hotpotqa")
MODES = ("wikipedia", "retriever")
MODE_TOOL = {"wikipedia": "wikipedia", "retriever": "search"}
# The benchmark questions end with an instruction about the answer format, not part of the question.
_FORMAT_INSTRUCTION = re.compile(r"\s*When ready, output the final answer.*\Z", re.S)

if str(REPO) not in sys.path:  # tests.standins lives in the repository, not in the installed package
    sys.path.insert(0, str(REPO))


def default_benchmarks() -> Path:
    return Path(os.environ.get("AGENTFLOW_BENCHMARKS", REPO.parent / "shared" / "benchmarks"))


def load_pages(path: Path = PAGES) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def question_of(record: dict) -> str:
    """The record's question without the answer-format instruction the benchmark appends."""
    return _FORMAT_INSTRUCTION.sub("", str(record.get("question") or record.get("query") or "")).strip()


def load_items(benchmarks: Path, datasets: list[str], limit: int) -> list[dict]:
    """The fixture's items of ``datasets`` (the first ``limit`` of each), joined with their benchmark records."""
    fixture = json.loads(ITEMS.read_text(encoding="utf-8"))
    out = []
    for name in datasets:
        path = benchmarks / f"{name}.json"
        if not path.is_file():
            raise SystemExit(f"search_eval: benchmark file not found: {path} (give --benchmarks DIR)")
        records = {str(r.get("pid")): r for r in json.loads(path.read_text(encoding="utf-8"))}
        chosen = [item for item in fixture if item["file"] == f"{name}.json"][:limit]
        for item in chosen:
            record = records[str(item["pid"])]
            out.append(dict(item, dataset=name, question=question_of(record), answer=record["answer"]))
    return out


@contextlib.contextmanager
def mediawiki(pages: list[dict]):
    """The MediaWiki stand-in over ``pages``; yields its API URL."""
    from tests.standins.web import MediaWikiStandin

    with MediaWikiStandin(pages) as wiki:
        yield wiki.api_url


@contextlib.contextmanager
def retriever(pages_path: Path = PAGES):
    """A dense index of ``pages_path`` in a temporary folder behind the retriever service; yields its search URL."""
    from agentflow.retrieval.index import DenseIndex, build_index
    from agentflow.retrieval.server import make_server, serve_in_background, server_url

    with tempfile.TemporaryDirectory(prefix="search-eval-index-") as tmp:
        build_index(str(pages_path), str(Path(tmp) / "index"))
        server = make_server(DenseIndex.load(str(Path(tmp) / "index")), "127.0.0.1", 0)
        serve_in_background(server)
        try:
            yield server_url(server)
        finally:
            server.shutdown()
            server.server_close()


@contextlib.contextmanager
def backend(mode: str):
    """Start the mode's service; yields the environment (variable -> URL) that points its tool at it."""
    if mode == "wikipedia":
        with mediawiki(load_pages()) as url:
            yield {"AGENTFLOW_WIKIPEDIA_URL": url}
    else:
        with retriever() as url:
            yield {"AGENTFLOW_RETRIEVER_URL": url}


@contextlib.contextmanager
def environment(values: dict):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def returned_titles(result) -> list[str]:
    """Titles the tool returned: the pages it read (wikipedia) and the passages' titles, in order, once each."""
    meta = result.meta or {}
    titles = list(meta.get("pages") or []) + list(meta.get("titles") or [])
    if not titles:  # an HTTP tool without titles in meta: the "[n] Title" lines of its output
        titles = re.findall(r"^\[\d+\] (.+?)(?: \(http[^)]*\))?$", result.output or "", re.M)
    return list(dict.fromkeys(titles))


def check_mode(mode: str, items: list[dict], top: int = 3) -> dict:
    """Each item's question through the mode's real tool: page recall in the top ``top`` titles, gold in output."""
    from agentflow.rewards.text import any_normalised_in
    from agentflow.tools.registry import build_tools

    rows = []
    with backend(mode) as env, environment(env):
        tool = build_tools([MODE_TOOL[mode]])[MODE_TOOL[mode]]
        for item in items:
            started = time.monotonic()
            result = tool.run(item["question"], 60.0)
            titles = returned_titles(result)[:top] if result.ok else []
            found = [p for p in item["pages"] if p in titles]
            rows.append({"dataset": item["dataset"], "pid": item["pid"], "ok": result.ok, "error": result.error,
                         "needed": item["pages"], "returned": titles, "found": found,
                         "page_recall": len(found) / len(item["pages"]),
                         "gold_in_output": bool(result.ok and any_normalised_in(result.output, item["answer"])),
                         "seconds": round(time.monotonic() - started, 2)})
    return {"mode": mode, "tool": MODE_TOOL[mode], "top": top, **_check_totals(rows), "rows": rows}


def _check_totals(rows: list[dict], *, split: bool = True) -> dict:
    n = len(rows) or 1
    totals = {"items": len(rows),
              "page_recall": round(sum(r["page_recall"] for r in rows) / n, 3),
              "any_page_rate": round(sum(bool(r["found"]) for r in rows) / n, 3),
              "all_pages_rate": round(sum(r["page_recall"] == 1 for r in rows) / n, 3),
              "gold_in_output_rate": round(sum(r["gold_in_output"] for r in rows) / n, 3),
              "tool_errors": sum(not r["ok"] for r in rows)}
    names = list(dict.fromkeys(r["dataset"] for r in rows))
    if split and len(names) > 1:
        totals["by_dataset"] = {name: _check_totals([r for r in rows if r["dataset"] == name], split=False)
                                for name in names}
    return totals


def print_check(report: dict) -> None:
    print(f"--- {report['mode']} ({report['tool']} tool), top {report['top']} ---", file=sys.stderr)
    for r in report["rows"]:
        mark = "ok " if r["page_recall"] == 1 else ("1+ " if r["found"] else "-- ")
        gold = "gold" if r["gold_in_output"] else "    "
        missing = [p for p in r["needed"] if p not in r["found"]]
        note = f"missing {missing} got {r['returned']}" if missing else ""
        print(f"  {mark}{gold} {r['dataset']}:{r['pid']:>3} {r['error'] or note}", file=sys.stderr)


def eval_command() -> list[str]:
    exe = REPO / ".venv" / "bin" / "agentflow"
    return [str(exe), "eval"] if exe.exists() else [sys.executable, "-m", "agentflow.eval.cli", "eval"]


def run_eval(mode: str, dataset: str, args, out_dir: Path, env: dict) -> dict:
    """One `agentflow eval` subprocess; its summary's numbers and output folder."""
    command = eval_command() + [
        "--data", str(args.benchmarks / f"{dataset}.json"), "--kind", "search", "--limit", str(args.limit),
        "--tools", MODE_TOOL[mode], "--out", str(out_dir), "--json", "--concurrency", str(args.concurrency)]
    for flag, value in (("--max-steps", args.max_steps), ("--max-time", args.max_time), ("--model", args.model)):
        if value is not None:
            command += [flag, str(value)]
    command += args.eval_args
    print(f"search_eval: {dataset} with {mode}: {' '.join(command)}", file=sys.stderr, flush=True)
    started = time.monotonic()
    proc = subprocess.run(command, cwd=REPO, env={**os.environ, **env}, stdout=subprocess.PIPE, text=True)
    row = {"dataset": dataset, "mode": mode, "tool": MODE_TOOL[mode], "exit_code": proc.returncode,
           "out": str(out_dir), "wall_s": round(time.monotonic() - started, 1)}
    try:
        summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    except ValueError:
        return dict(row, error="agentflow eval printed no summary (see its stderr above)")
    finished = summary["items"]["finished"]
    tools = summary.get("tools") or {}
    return dict(row, accuracy=summary["accuracy"], correct=summary.get("correct"), items=finished,
                item_errors=summary["items"].get("errors"),
                mean_tool_calls=round(tools.get("calls", 0) / finished, 2) if finished else None,
                tool_calls=tools.get("calls", 0), tool_errors=tools.get("errors", 0),
                per_tool=tools.get("per_tool"), report=str(out_dir / "report.md"))


def parse_args(argv: list[str] | None = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    eval_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="arguments after -- go to agentflow eval unchanged")
    p.add_argument("--check", action="store_true", help="no LLM: page recall and gold-in-output of each tool")
    p.add_argument("--benchmarks", type=Path, default=default_benchmarks(),
                   help="folder with bamboogle.json and hotpotqa.json (default $AGENTFLOW_BENCHMARKS, else "
                        "../shared/benchmarks beside the repository)")
    p.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated (default bamboogle,hotpotqa)")
    p.add_argument("--tools-modes", default=",".join(MODES), help="comma-separated: wikipedia, retriever (both)")
    p.add_argument("--limit", type=int, default=20, help="first N items of each file (default 20, the most the "
                                                         "pages cover)")
    p.add_argument("--max-steps", type=int, help="agentflow eval --max-steps (its default: 5)")
    p.add_argument("--max-time", type=float, help="agentflow eval --max-time in seconds (its default: 120)")
    p.add_argument("--model", help="agentflow eval --model (default: the embedded SmolLM2)")
    p.add_argument("--concurrency", type=int, default=4, help="agentflow eval --concurrency (default 4)")
    p.add_argument("--top", type=int, default=3, help="--check: titles counted as returned (default 3)")
    p.add_argument("--out", type=Path, help="folder for the eval runs (default eval_runs/search-eval-<time>)")
    args = p.parse_args(argv)
    args.eval_args = eval_args
    args.datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    args.modes = [m.strip() for m in args.tools_modes.split(",") if m.strip()]
    bad = [d for d in args.datasets if d not in DATASETS] + [m for m in args.modes if m not in MODES]
    if bad or not args.datasets or not args.modes:
        p.error(f"unknown or missing dataset/tool mode {bad}; datasets: {', '.join(DATASETS)}; "
                f"modes: {', '.join(MODES)}")
    if not 1 <= args.limit <= 20:
        p.error("--limit must be 1 to 20: the pages cover the first 20 items of each file")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    items = load_items(args.benchmarks, args.datasets, args.limit)
    if args.check:
        reports = []
        for mode in args.modes:
            report = check_mode(mode, items, args.top)
            print_check(report)
            reports.append(report)
        print(json.dumps({"check": [{k: v for k, v in r.items() if k != "rows"} for r in reports],
                          "rows": {r["mode"]: r["rows"] for r in reports}}, ensure_ascii=False, indent=2))
        return 0
    out_root = args.out or REPO / "eval_runs" / f"search-eval-{time.strftime('%Y%m%d-%H%M%S')}"
    runs = []
    for mode in args.modes:
        with backend(mode) as env:
            for dataset in args.datasets:
                runs.append(run_eval(mode, dataset, args, out_root / f"{dataset}-{mode}", env))
    print(json.dumps({"out": str(out_root), "limit": args.limit, "runs": runs}, ensure_ascii=False, indent=2))
    return 0 if all(r["exit_code"] == 0 and "error" not in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
