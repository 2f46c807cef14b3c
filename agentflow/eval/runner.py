"""Running an agent over benchmark items on a pool of threads, scoring each answer and writing results as they come.

Each finished item is appended to ``results.jsonl`` at once (a crash or Ctrl-C keeps everything finished so far);
``summary.json`` and the reports are written at the end, or on Ctrl-C for the finished items. An item whose engine
fails is recorded with status ``error`` and scores 0; it never stops the run.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol, TextIO

from agentflow.errors import AgentFlowError, EngineError, InvalidInput
from agentflow.eval.data import Item
from agentflow.eval.progress import DEFAULT_EVERY, DEFAULT_INTERVAL_S, make_progress
from agentflow.eval.summary import summarize
from agentflow.rewards import Judge, ground_truth_text, score

log = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"


class Solver(Protocol):
    def solve(self, query: str, *, ground_truth: str = "", source: str = "traffic", group_id: str = "",
              trajectory_id: str = "", on_event=None) -> dict: ...


@dataclass
class RunOutcome:
    summary: dict
    out_dir: Path
    interrupted: bool = False
    files: dict[str, Path] = field(default_factory=dict)


def evaluate_item(agent: Solver, item: Item, kind: str, judge: Judge | None = None, run_id: str = "") -> dict:
    """Solve and score one item; never raises for the item's own failures (they become status ``error``)."""
    started = time.monotonic()
    record, error, status = None, "", ""
    try:
        record = agent.solve(item.query, ground_truth=ground_truth_text(kind, item.record), source="eval",
                             trajectory_id=f"{run_id}-{item.pid}" if run_id else "")
        status = record.get("status", "")
    except EngineError as e:
        record = getattr(e, "record", None)
        error, status = f"{e.reason}: {e}", "error"
    except InvalidInput as e:
        error, status = f"{e.reason}: {e}", "invalid"
    except Exception as e:  # a bug on one item must not lose the run; the traceback goes to the log
        log.exception("item %s failed", item.pid)
        error, status = f"internal: {type(e).__name__}: {e}", "error"
    prediction = (record or {}).get("answer", "") or ""
    try:
        reward = score(kind, prediction, item.record, judge=judge)
    except AgentFlowError as e:
        reward = {"value": 0.0, "source": "rule", "detail": f"scoring failed: {e}"}
    if record is not None:
        record["rewards"] = [reward]
    wall = time.monotonic() - started
    latency = (record or {}).get("totals", {}).get("latency_s")
    return {
        "index": item.index, "pid": item.pid, "kind": kind, "query": item.query, "answer": item.record.get("answer"),
        "prediction": prediction, "score": reward, "correct": reward["value"] >= 0.5, "status": status,
        "error": error or (record or {}).get("error", ""), "wall_s": round(wall, 6),
        "latency_s": round(latency if latency is not None else wall, 6), "record": record,
    }


def run_items(agent: Solver, items: list[Item], kind: str, out_dir: Path, *, run: dict, concurrency: int = 4,
              judge: Judge | None = None, progress: bool = True,
              on_row: Callable[[dict], None] | None = None, progress_stream: TextIO | None = None,
              progress_every: int = DEFAULT_EVERY, progress_interval_s: float = DEFAULT_INTERVAL_S) -> RunOutcome:
    """Evaluate ``items`` with ``concurrency`` worker threads and write ``results.jsonl`` and ``summary.json`` into
    ``out_dir`` (reports are the caller's: see ``agentflow.eval.report``).

    ``run`` describes the run for the summary (data, kind, engine, limits); ``started_at``, ``wall_s`` and
    ``interrupted`` are added. On KeyboardInterrupt the workers stop taking items, the finished ones are summarised,
    and the outcome says ``interrupted`` (items still in flight are abandoned: their threads are daemons).

    ``progress`` goes to ``progress_stream`` (stderr): a bar on a terminal, else a plain line every
    ``progress_every`` items or ``progress_interval_s`` seconds, whichever first (``agentflow.eval.progress``).
    """
    if concurrency < 1:
        raise InvalidInput(f"--concurrency must be at least 1, got {concurrency}")
    out_dir.mkdir(parents=True, exist_ok=True)
    results_path = out_dir / RESULTS_FILE
    todo: queue.Queue[Item] = queue.Queue()
    for item in items:
        todo.put(item)
    done: queue.Queue[dict] = queue.Queue()
    stop = threading.Event()
    run_id = run.get("run_id", "")

    def worker() -> None:
        while not stop.is_set():
            try:
                item = todo.get_nowait()
            except queue.Empty:
                return
            done.put(evaluate_item(agent, item, kind, judge, run_id))

    started_unix, t0 = time.time(), time.monotonic()
    threads = [threading.Thread(target=worker, name=f"eval-{i}", daemon=True)
               for i in range(min(concurrency, len(items)))]
    for t in threads:
        t.start()
    rows: list[dict] = []
    interrupted = False
    bar = make_progress(len(items), kind, enabled=progress, stream=progress_stream, every=progress_every,
                        interval_s=progress_interval_s)
    with results_path.open("w", encoding="utf-8") as sink, bar:

        def keep(row: dict) -> None:
            rows.append(row)
            sink.write(json.dumps(row, ensure_ascii=False) + "\n")
            sink.flush()
            bar.advance(row)

        try:
            while len(rows) < len(items):
                try:
                    row = done.get(timeout=0.2)
                except queue.Empty:
                    bar.tick()
                    if not any(t.is_alive() for t in threads) and done.empty():
                        break  # a worker died without reporting: should not happen, but never hang
                    continue
                keep(row)
                if on_row:
                    on_row(row)
        except KeyboardInterrupt:
            interrupted = True
            stop.set()
            while True:  # items that finished while we were interrupted still count
                try:
                    keep(done.get_nowait())
                except queue.Empty:
                    break
    run = {**run, "started_at_unix": round(started_unix, 3), "wall_s": round(time.monotonic() - t0, 3),
           "interrupted": interrupted}
    summary = summarize(rows, run, selected=len(items))
    summary_path = out_dir / SUMMARY_FILE
    summary_path.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return RunOutcome(summary, out_dir, interrupted, {"results": results_path, "summary": summary_path})

