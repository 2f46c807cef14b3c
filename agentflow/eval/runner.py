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
from typing import Callable, Protocol, Sequence, TextIO

from agentflow.errors import AgentFlowError, EngineError, InvalidInput
from agentflow.eval.data import Item, data_hash
from agentflow.eval.progress import DEFAULT_EVERY, DEFAULT_INTERVAL_S, make_progress
from agentflow.eval.summary import summarize
from agentflow.rewards import Judge, ground_truth_text, score

log = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"
RUN_FILE = "run.json"  # the settings a resumed run reuses (agentflow.eval.resume)


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
              progress_every: int = DEFAULT_EVERY, progress_interval_s: float = DEFAULT_INTERVAL_S,
              previous: Sequence[dict] = (), wall_s_before: float = 0.0) -> RunOutcome:
    """Evaluate ``items`` with ``concurrency`` worker threads and write ``results.jsonl`` and ``summary.json`` into
    ``out_dir`` (reports are the caller's: see ``agentflow.eval.report``).

    ``run`` describes the run for the summary (data, kind, engine, limits); ``started_at``, ``wall_s`` and
    ``interrupted`` are added, and ``data_sha256`` (of ``items``) unless it is there. On KeyboardInterrupt the workers
    stop taking items, the finished ones are summarised, and the outcome says ``interrupted`` (items still in flight
    are abandoned: their threads are daemons).

    A resumed run passes the rows it finished before as ``previous`` (they are in ``results.jsonl`` already: the new
    rows are appended), the time they took as ``wall_s_before``, and the hash of all its items in ``run``; the
    summary covers both.

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
    events: queue.Queue[tuple[int, dict | None]] = queue.Queue()  # (index, None) at a start, (index, row) at the end
    stop = threading.Event()
    run_id = run.get("run_id", "")

    def worker() -> None:
        while not stop.is_set():
            try:
                item = todo.get_nowait()
            except queue.Empty:
                return
            events.put((item.index, None))
            events.put((item.index, evaluate_item(agent, item, kind, judge, run_id)))

    workers = min(concurrency, len(items))
    bar = make_progress(len(previous) + len(items), kind, enabled=progress, stream=progress_stream,
                        every=progress_every, interval_s=progress_interval_s, workers=workers)
    for row in previous:
        bar.carry(row)
    started_unix, t0 = time.time(), time.monotonic()
    threads = [threading.Thread(target=worker, name=f"eval-{i}", daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    rows: list[dict] = []
    interrupted = False
    if previous:
        _drop_torn_line(results_path)
    with results_path.open("a" if previous else "w", encoding="utf-8") as sink, bar:

        def keep(row: dict) -> None:
            rows.append(row)
            sink.write(json.dumps(row, ensure_ascii=False) + "\n")
            sink.flush()
            bar.advance(row)

        def next_row(timeout: float | None) -> dict:
            """The next finished row, passing starts to the bar on the way; queue.Empty when none came in time."""
            while True:
                index, row = events.get(timeout=timeout) if timeout else events.get_nowait()
                if row is not None:
                    return row
                bar.start(index)

        try:
            while len(rows) < len(items):
                try:
                    row = next_row(0.2)
                except queue.Empty:
                    bar.tick()
                    if not any(t.is_alive() for t in threads) and events.empty():
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
                    keep(next_row(None))
                except queue.Empty:
                    break
    wall = wall_s_before + time.monotonic() - t0
    run = {"data_sha256": data_hash(items), **run, "started_at_unix": round(started_unix, 3),
           "wall_s": round(wall, 3), "interrupted": interrupted}
    rows = [*previous, *rows]
    summary = summarize(rows, run, selected=len(previous) + len(items))
    summary_path = out_dir / SUMMARY_FILE
    summary_path.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return RunOutcome(summary, out_dir, interrupted, {"results": results_path, "summary": summary_path})


def _drop_torn_line(path: Path) -> None:
    """Cut a last line without its newline (a run killed while writing it; ``read_results`` skipped it), so that
    appended rows start on a line of their own."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)

