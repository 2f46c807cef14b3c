"""Issue 31: how the off-policy objectives learn from stale rollouts, and what asynchronous sampling buys.

Every run is one subprocess of ``bench/learning_inprocess.py`` (tiny planner, synthetic environment, the format
warm-up, held-out evaluated every ``--eval-every-versions`` versions) on a fixed budget. Two modes::

    .venv/bin/python bench/staleness.py [--staleness 0,2,4,8] [--objectives flow_grpo,decoupled_ppo,tis] \\
        [--seeds 0,1,2] [--minutes 3] [--parallel 2] [--threads 1] [--out DIR]
    .venv/bin/python bench/staleness.py --compare-async --objective tis --async-staleness 2 [--seeds 0,1,2] \\
        [--minutes 4] [--sync-threads 2] [--threads 1] [--out DIR]

The grid (default) trains every objective with rollouts sampled S versions behind the trainer (``--staleness S``
of the bench: the lag of an asynchronous system at its bound, every step). ``--compare-async`` runs, per seed, the
synchronous loop (on-policy, ``--sync-threads`` torch threads) and the asynchronous one (``--async``: a producer
thread samples while the trainer trains, at most ``--async-staleness`` versions behind, ``--threads`` per side),
one at a time so that each has the machine's cores.

Prints one JSON line per run (the bench's summary, less its settings, with the run's CPU seconds and the load
average) and last one JSON summary: per (objective, staleness) — or per mode — the median over seeds of versions
and RL seconds (evaluations left out) to held-out >= 0.8 and of the final held-out, with the per-seed values; a run
that never reaches 0.8 counts as infinitely slow for the median (null when it is the median). Each run's folder in
``--out`` keeps its curve (``learning.csv``, ``learning.png``), its stdout (``run.jsonl``: every step and
evaluation) and stderr (``run.log``); the model files are deleted unless ``--keep-models``. A run that outlives
its budget by ``--grace-s`` is killed with everything it started.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _proc import kill_tree  # noqa: E402  (bench/_proc.py)
from agentflow.children import spawn_tied  # noqa: E402

BENCH = Path(__file__).resolve().parent / "learning_inprocess.py"
OBJECTIVES = ("flow_grpo", "decoupled_ppo", "tis")  # the on-policy default and the two off-policy corrections
RATIOS = ("trajectories_per_min", "trained_trajectories_per_min", "trajectories_per_cpu_min", "rl_cores",
          "rl_s_to_0.8")  # --compare-async: async / sync, per seed and of the medians


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compare-async", action="store_true", help="synchronous against asynchronous, instead of the grid")
    p.add_argument("--staleness", default="0,2,4,8", help="grid: comma-separated lags in versions")
    p.add_argument("--objectives", default=",".join(OBJECTIVES), help="grid: comma-separated grpo.OBJECTIVES")
    p.add_argument("--objective", default="tis", help="--compare-async: the objective of both modes")
    p.add_argument("--async-staleness", type=int, default=2, help="--compare-async: the producer's bound")
    p.add_argument("--sync-threads", type=int, default=2,
                   help="--compare-async: torch threads of the synchronous run (its share of the cores)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    p.add_argument("--minutes", type=float, default=3.0, help="budget per run (the bench's --minutes)")
    p.add_argument("--max-steps", type=int, default=0, help="the bench's --max-steps (0: the budget decides)")
    p.add_argument("--eval-every-versions", type=int, default=5, help="held-out evaluation every N versions")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (with --async: per side)")
    p.add_argument("--parallel", type=int, default=0, help="runs at a time (default: 2 for the grid, 1 to compare)")
    p.add_argument("--grace-s", type=float, default=240.0,
                   help="a run still alive this long after its budget is killed (start-up and the last evaluation "
                        "are outside the budget)")
    p.add_argument("--out", default="/tmp/agentflow-staleness", help="results folder (replaced)")
    p.add_argument("--keep-models", action="store_true", help="keep each run's model store")
    p.add_argument("--at-version", type=int, default=30,
                   help="also compare the runs at this many versions: held-out there and its mean up to there "
                        "(every run of a short budget gets that far; 'versions to 0.8' may be censored by the budget)")
    p.add_argument("--summarize", default=None,
                   help="start nothing: aggregate the run lines of an earlier invocation's stdout (a file)")
    p.add_argument("bench_args", nargs="*", help="more flags for the bench, after --")
    args = p.parse_args(argv)
    args.parallel = args.parallel or (1 if args.compare_async else 2)
    return args


@dataclass
class Run:
    """One subprocess of the bench: its name, flags and, once started, the process and its clock."""

    name: str
    group: tuple  # what the summary aggregates over seeds: (objective, staleness) or (mode,)
    seed: int
    flags: list[str]
    threads: int
    process: subprocess.Popen | None = None
    started: float = 0.0
    load_before: float = 0.0
    result: dict = field(default_factory=dict)


def grid_runs(args) -> list[Run]:
    """Seed-major (a grid cut short still has whole seeds), staleness, then objective."""
    runs = []
    for seed in _ints(args.seeds):
        for lag in _ints(args.staleness):
            for name in args.objectives.split(","):
                runs.append(Run(f"{name}-s{lag}-seed{seed}", (name, lag), seed,
                                ["--objective", name, "--staleness", str(lag)], args.threads))
    return runs


def compare_runs(args) -> list[Run]:
    runs = []
    for seed in _ints(args.seeds):
        runs.append(Run(f"sync-{args.objective}-seed{seed}", ("sync",), seed,
                        ["--objective", args.objective, "--staleness", "0"], args.sync_threads))
        runs.append(Run(f"async-{args.objective}-s{args.async_staleness}-seed{seed}", ("async",), seed,
                        ["--objective", args.objective, "--staleness", str(args.async_staleness), "--async"],
                        args.threads))
    return runs


def command(run: Run, args, out: Path) -> list[str]:
    flags = ["--seed", str(run.seed), "--minutes", str(args.minutes), "--threads", str(run.threads),
             "--eval-every-versions", str(args.eval_every_versions), "--out", str(out / run.name)]
    if args.max_steps:
        flags += ["--max-steps", str(args.max_steps)]
    return [sys.executable, str(BENCH), *flags, *run.flags, *args.bench_args]


def start(run: Run, args, out: Path) -> None:
    (out / run.name).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(run.threads),
           "MKL_NUM_THREADS": str(run.threads), "TOKENIZERS_PARALLELISM": "false"}
    logs = out / f"{run.name}.jsonl", out / f"{run.name}.log"  # the bench replaces its --out folder: kept beside it
    with logs[0].open("w") as stdout, logs[1].open("w") as stderr:
        run.process = spawn_tied(command(run, args, out), stdout=stdout, stderr=stderr, env=env, cwd=BENCH.parents[1])
    run.started, run.load_before = time.monotonic(), os.getloadavg()[0]


def finished(run: Run, args, out: Path) -> bool:
    """Whether ``run`` is over (exited, or killed for running past its budget); fills ``run.result``."""
    pid, status, usage = os.wait4(run.process.pid, os.WNOHANG)
    wall = time.monotonic() - run.started
    if pid == 0 and wall < args.minutes * 60 + args.grace_s:
        return False
    if pid == 0:
        kill_tree(run.process)
        code, cpu = "killed", None
    else:
        run.process.returncode = code = os.waitstatus_to_exitcode(status)
        cpu = usage.ru_utime + usage.ru_stime  # the bench's and its reaped children's
    run.result = {"run": run.name, "seed": run.seed, **_group_fields(run.group), "exit": code,
                  "run_wall_s": round(wall, 1), "cpu_s": None if cpu is None else round(cpu, 1),
                  "cores_used": None if cpu is None else round(cpu / wall, 2),
                  "load_before": round(run.load_before, 2), "load_after": round(os.getloadavg()[0], 2),
                  **_bench_summary(out / f"{run.name}.jsonl")}
    folder = out / run.name
    for name in (f"{run.name}.jsonl", f"{run.name}.log"):
        if folder.is_dir():
            shutil.move(out / name, folder / ("run.jsonl" if name.endswith("jsonl") else "run.log"))
    if not args.keep_models:
        for models in ("store", "base"):
            shutil.rmtree(folder / models, ignore_errors=True)
    return True


def _bench_summary(path: Path) -> dict:
    """The bench's last summary line, without its settings; the last evaluation if it printed none."""
    rows = _rows(path)
    summary = next((r for r in reversed(rows) if r.get("event") == "summary"), None)
    if summary is None:
        return {"error": "no summary", "last_eval": next((r for r in reversed(rows) if r.get("event") == "eval"), None)}
    keep = ("heldout_before", "heldout_after", "heldout_best", "versions_to_0.8", "rl_s_to_0.8", "time_to_0.8_s",
            "rl_s", "rl_versions", "steps", "updates", "trajectories_per_min", "trained_trajectories_per_min",
            "rl_cpu_s", "rl_cores", "trajectories_per_cpu_min", "lag_mean", "lag_max", "turns_stale", "curve",
            "wall_s")
    return {k: summary.get(k) for k in keep} | {"heldout_after_warmup": summary.get("warmup", {}).get(
        "heldout_after_warmup")} | step_stats(rows)


def step_stats(rows: list[dict], last: int = 10) -> dict:
    """How far the policy went from where it was sampled and from the reference: the mean clipped share of tokens
    and KL to the reference over the last ``last`` steps."""
    steps = [r for r in rows if r.get("event") == "step"][-last:]
    return {f"{k}_last{last}": round(sum(r.get(k, 0.0) for r in steps) / len(steps), 4) if steps else None
            for k in ("clip_frac", "kl")}


def _rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def run_all(runs: list[Run], args, out: Path) -> list[dict]:
    """Start up to ``--parallel`` runs at a time; print each one's JSON line as it ends."""
    pending, running, done = list(runs), [], []
    try:
        while pending or running:
            while pending and len(running) < args.parallel:
                run = pending.pop(0)
                start(run, args, out)
                running.append(run)
                print(json.dumps({"event": "start", "run": run.name, "command": command(run, args, out)[1:]}),
                      file=sys.stderr, flush=True)
            for run in [r for r in running if finished(r, args, out)]:
                running.remove(run)
                done.append(run.result)
                print(json.dumps({"event": "run", **run.result}), flush=True)
            time.sleep(1.0)
    finally:
        for run in running:  # interrupted: nothing of ours is left behind
            kill_tree(run.process)
    return done


def at_version(curve: list, version: int) -> dict:
    """From a run's held-out curve (``[versions since RL started, held-out, RL seconds]`` per evaluation): the held-out
    of the last evaluation at or before ``version``, and the mean of the evaluations after version 0 up to it."""
    upto = [c for c in curve or [] if 0 < c[0] <= version]
    return {f"heldout_at_v{version}": upto[-1][1] if upto else None,
            f"heldout_mean_to_v{version}": round(sum(c[1] for c in upto) / len(upto), 4) if upto else None}


def _median(values: list) -> float | None:
    """Median where None (never reached) is +inf; None again if that is where the median falls."""
    finite = [math.inf if v is None else v for v in values]
    if not finite:
        return None
    m = statistics.median(finite)
    return None if math.isinf(m) else round(m, 4)


def aggregate(results: list[dict], keys: tuple[str, ...], version: int = 30) -> list[dict]:
    """Per group (the values of ``keys``): medians over seeds and the per-seed values."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault(tuple(r[k] for k in keys), []).append({**r, **at_version(r.get("curve"), version)})
    out = []
    for group, rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["seed"])
        row = dict(zip(keys, group))
        row["seeds"] = [r["seed"] for r in rs]
        row["reached"] = f"{sum(r.get('versions_to_0.8') is not None for r in rs)}/{len(rs)}"
        for metric in ("versions_to_0.8", "rl_s_to_0.8", "heldout_after", f"heldout_at_v{version}",
                       f"heldout_mean_to_v{version}", "trajectories_per_min",
                       "trained_trajectories_per_min", "trajectories_per_cpu_min", "rl_cores", "rl_versions",
                       "lag_mean", "clip_frac_last10", "kl_last10"):
            values = [r.get(metric) for r in rs]
            row[f"median_{metric}"] = _median(values)
            row[metric] = values
        out.append(row)
    return out


def compare(rows: list[dict], results: list[dict]) -> dict:
    """async / sync: the ratio of the medians, and the per-seed ratios."""
    by = {r["mode"]: r for r in rows}
    if set(by) != {"sync", "async"}:
        return {}

    def ratio(a, b):
        return None if a is None or b is None or b == 0 else round(a / b, 3)

    per_seed = {}
    for seed in sorted({r["seed"] for r in results}):
        pair = {r["mode"]: r for r in results if r["seed"] == seed}
        if set(pair) == {"sync", "async"}:
            per_seed[seed] = {m: ratio(pair["async"].get(m), pair["sync"].get(m)) for m in RATIOS}
    return {"async_over_sync": {m: ratio(by["async"][f"median_{m}"], by["sync"][f"median_{m}"])
                                for m in (*RATIOS, "versions_to_0.8")},
            "per_seed": per_seed}


def main(argv=None) -> dict:
    args = parse_args(argv)
    load, t0 = os.getloadavg(), time.monotonic()
    if args.summarize:
        results = [row for line in Path(args.summarize).read_text().splitlines() if line.startswith("{")
                   and (row := json.loads(line)).get("event") == "run"]
        args.compare_async = any("mode" in r for r in results)
        for r in results:  # the per-step statistics of runs from before they were reported, where the folder is
            if "kl_last10" not in r and (Path(args.out) / r["run"] / "run.jsonl").is_file():
                r.update(step_stats(_rows(Path(args.out) / r["run"] / "run.jsonl")))
    else:
        out = Path(args.out)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run_all's finally kills what is running
        results = run_all(compare_runs(args) if args.compare_async else grid_runs(args), args, out)
    keys = ("mode",) if args.compare_async else ("objective", "staleness")
    rows = aggregate(results, keys, args.at_version)
    summary = {"event": "summary", "mode": "compare_async" if args.compare_async else "grid", "groups": rows,
               "wall_s": round(time.monotonic() - t0, 1), "load_start": [round(x, 2) for x in load],
               "load_end": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
               "settings": {k: v for k, v in vars(args).items() if k != "bench_args"} | {"bench_args": args.bench_args}}
    if args.compare_async:
        summary.update(compare(rows, results))
    if not args.summarize:
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary), flush=True)
    return summary


def _group_fields(group: tuple) -> dict:
    return {"mode": group[0]} if len(group) == 1 else {"objective": group[0], "staleness": group[1]}


def _ints(text: str) -> list[int]:
    return [int(x) for x in str(text).split(",") if x.strip()]


if __name__ == "__main__":
    main(sys.argv[1:])
