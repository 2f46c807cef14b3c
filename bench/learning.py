"""Online Flow-GRPO through the real topology: held-out success against wall-clock time, with two ablations.

For each variant (``flow_grpo``, ``sft_success``, ``last_turn``) and seed, on the same budget:

    tansu broker, `serve-llm --follow-versions` (the tiny random planner), the six services under the
    tiny-deterministic profile on the synthetic environment, `agentflow train`, `agentflow drive`
    — all separate processes, as `agentflow up` starts them.

The bench itself only measures: it evaluates held-out success through the gateway (greedy, ``source="eval"``)
before the driver starts and then every ``--eval-every`` seconds, reads the trainer's per-step metrics file, and
writes ``learning.csv`` and ``learning.png`` in ``--out``. The budget runs from the driver's start; the last
evaluation is made right after it, with the driver stopped. Run::

    .venv/bin/python bench/learning.py [--minutes 10] [--seeds 0] [--variants flow_grpo,sft_success,last_turn]

The last output line is one JSON object: ``heldout_before`` / ``heldout_after`` of the Flow-GRPO run (means over
seeds), per-seed results, and each ablation's numbers beside it. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentflow.children import spawn_tied  # noqa: E402
from agentflow.services.cluster import start_cluster  # noqa: E402
from agentflow.envs.profiles import TINY_DETERMINISTIC  # noqa: E402
from agentflow.envs.synthetic import EnvConfig, SyntheticEnv  # noqa: E402
from agentflow.llm.models import build_tiny  # noqa: E402
from agentflow.trainer.drive import Item, evaluate  # noqa: E402
from agentflow.trainer.gateway_client import Gateway  # noqa: E402

VARIANTS = {  # objective, KL weight
    "flow_grpo": ("flow_grpo", 0.02),
    "sft_success": ("sft_success", 0.0),
    "last_turn": ("last_turn", 0.02),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="training budget per run, from the driver's start")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (model init and environment)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: " + ", ".join(VARIANTS))
    p.add_argument("--out", default="/tmp/agentflow-learning", help="results folder (replaced)")
    p.add_argument("--eval-every", type=float, default=60.0, help="seconds between held-out evaluations")
    p.add_argument("--heldout", type=int, default=60, help="held-out tasks")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--batch-queries", type=int, default=6, help="groups per training step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--updates", type=int, default=2, help="optimizer updates per batch")
    p.add_argument("--max-staleness", type=int, default=2)
    p.add_argument("--warmup-steps", type=int, default=30, help="format warm-up SFT steps (0: none)")
    p.add_argument("--concurrency", type=int, default=16, help="rollouts in flight")
    p.add_argument("--max-turns", type=int, default=3)
    return p.parse_args(argv)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Run:
    """One variant x seed: the processes, the evaluations, the trainer's metrics."""

    def __init__(self, args, variant: str, seed: int, out: Path):
        self.args, self.variant, self.seed, self.out = args, variant, seed, out
        self.rows: list[dict] = []
        self.env = SyntheticEnv(EnvConfig(seed=seed, heldout_size=args.heldout))
        self.heldout = [Item(t.query, t.answer, t.id) for t in self.env.heldout]

    def execute(self) -> dict:
        args, out = self.args, self.out
        objective, beta = VARIANTS[self.variant]
        base = build_tiny(out / "base", seed=self.seed)
        env = {"AGENTFLOW_PROFILE": TINY_DETERMINISTIC, "AGENTFLOW_ENVIRONMENT": f"synthetic:{self.seed}",
               "AGENTFLOW_LOOP_MAX_STEPS": str(args.max_turns),
               "OMP_NUM_THREADS": "1",  # ten processes on a few cores: torch's spinning threads would fight
               "AGENTFLOW_GATEWAY_ANONYMOUS_SCOPES": "solve,train"}  # loopback: the driver sends rollouts
        t0 = time.monotonic()
        cluster = start_cluster(log_dir=out / "logs", model=str(base), env=env, progress=log,
                                llm_args=("--follow-versions", "--version", "v000000", "--max-batch", "16",
                                          "--model-store", str(out / "store")))
        processes: list[subprocess.Popen] = []
        try:
            log(f"{self.variant} seed {self.seed}: cluster up in {time.monotonic() - t0:.0f} s")
            trainer = self._spawn(cluster, "trainer", [
                "train", "--bootstrap", cluster.bootstrap, "--model-store", str(out / "store"),
                "--base-model", str(base), "--grpo-group-size", str(args.group_size),
                "--grpo-batch-trajectories", str(args.batch_queries * args.group_size), "--grpo-lr", str(args.lr),
                "--grpo-beta", str(beta), "--grpo-updates-per-batch", str(args.updates),
                "--grpo-max-staleness", str(args.max_staleness),
                "--format-warmup-steps", str(args.warmup_steps), "--objective", objective,
                "--profile", TINY_DETERMINISTIC, "--keep-last", "4", "--seed", str(self.seed),
                "--metrics-file", str(out / "trainer-metrics.jsonl")])
            processes.append(trainer)
            gateway = Gateway(cluster.endpoint("gateway"))
            started = time.monotonic()
            self._eval(gateway, started, "before")
            started = time.monotonic()  # the budget starts with the driver
            self.started_unix = time.time()
            processes.append(self._spawn(cluster, "drive", [
                "drive", "--gateway", cluster.endpoint("gateway"), "--dataset", f"synthetic:{self.seed}",
                "--group-size", str(args.group_size), "--concurrency", str(args.concurrency),
                "--temperature", "1.0", "--max-steps", str(args.max_turns), "--seed", str(self.seed)]))
            deadline = started + args.minutes * 60
            while time.monotonic() < deadline:
                time.sleep(min(args.eval_every, max(0.0, deadline - time.monotonic())))
                for p in processes:
                    if p.poll() is not None:
                        raise RuntimeError(f"a process exited early ({p.args[3]}); see {out / 'logs'}")
                if time.monotonic() < deadline:
                    self._eval(gateway, started, "during")
            for p in reversed(processes):  # the driver first: the final evaluation sees no training traffic
                p.send_signal(signal.SIGTERM)
                p.wait(60)
            self._eval(gateway, started, "after")
            gateway.close()
        finally:
            for p in processes:
                if p.poll() is None:
                    p.kill()
            cluster.stop()
        return self._summary()

    def _spawn(self, cluster, name: str, argv: list[str]) -> subprocess.Popen:
        log_file = (self.out / "logs" / f"{name}.log").open("ab")
        return spawn_tied([sys.executable, "-m", "agentflow.cli", *argv], stdout=log_file, stderr=log_file,
                          env={**os.environ, **cluster.env})

    def _eval(self, gateway: Gateway, started: float, phase: str) -> None:
        t = time.monotonic()
        result = evaluate(gateway, self.heldout, max_steps=self.args.max_turns, concurrency=16)
        row = {"event": "eval", "phase": phase, "t_s": round(t - started, 1), "heldout": round(result["success"], 4),
               "failed": result["failed"], "eval_s": round(time.monotonic() - t, 1),
               "version": self._latest_version(), "tool_sequences": json.dumps(result["tool_sequences"])}
        self.rows.append(row)
        log(f"{self.variant} seed {self.seed}: held-out {row['heldout']:.3f} at {row['t_s']:.0f} s "
            f"(version {row['version']}, {row['failed']} failed, eval {row['eval_s']:.0f} s)")

    def _latest_version(self):
        metrics = self._trainer_metrics()
        return metrics[-1]["version"] if metrics else 0

    def _trainer_metrics(self) -> list[dict]:
        path = self.out / "trainer-metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def _summary(self) -> dict:
        steps = self._trainer_metrics()
        for m in steps:
            self.rows.append({"event": "step", "t_s": round(m["t_unix"] - self.started_unix, 1),
                              "version": m.get("version"), "reward": m.get("reward"), "kl": m.get("kl"),
                              "skipped": m.get("skipped", False), "stage": m.get("stage", "")})
        evals = [r for r in self.rows if r["event"] == "eval"]
        reach = next((r["t_s"] for r in evals if r["phase"] != "before" and r["heldout"] >= 0.8), None)
        return {"variant": self.variant, "seed": self.seed, "heldout_before": evals[0]["heldout"],
                "heldout_after": evals[-1]["heldout"], "heldout_best": max(r["heldout"] for r in evals),
                "time_to_0.8_s": reach, "versions": steps[-1]["version"] if steps else 0, "steps": len(steps),
                "failed_eval_queries": sum(r["failed"] for r in evals),
                "train_reward_last": next((m["reward"] for m in reversed(steps) if "reward" in m), None)}


def write_outputs(out: Path, runs: list[Run]) -> None:
    keys = ["variant", "seed", "event", "phase", "t_s", "version", "heldout", "reward", "kl", "skipped", "stage",
            "failed", "eval_s", "tool_sequences"]
    with (out / "learning.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        for run in runs:
            for row in sorted(run.rows, key=lambda r: r["t_s"]):
                writer.writerow({"variant": run.variant, "seed": run.seed, **row})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    colours = {"flow_grpo": "tab:blue", "sft_success": "tab:orange", "last_turn": "tab:green"}
    for run in runs:
        evals = [r for r in run.rows if r["event"] == "eval"]
        steps = [r for r in run.rows if r["event"] == "step" and r.get("reward") is not None]
        label = f"{run.variant} seed {run.seed}"
        top.plot([r["t_s"] / 60 for r in evals], [r["heldout"] for r in evals], "o-", label=label,
                 color=colours.get(run.variant), alpha=0.5 + 0.5 * (run.seed == runs[0].seed))
        bottom.plot([r["t_s"] / 60 for r in steps], [r["reward"] for r in steps], ".", markersize=3,
                    color=colours.get(run.variant), alpha=0.6)
    top.axhline(0.8, color="grey", linestyle=":")
    top.set_ylabel("held-out success (greedy)")
    top.set_ylim(0, 1.02)
    top.legend(fontsize=7)
    bottom.set_ylabel("training reward (batch mean)")
    bottom.set_xlabel("minutes since the driver started")
    fig.suptitle("Flow-GRPO through the real topology (tiny planner, tiny-deterministic profile)")
    fig.tight_layout()
    fig.savefig(out / "learning.png", dpi=120)


def main(argv=None) -> dict:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that every started process is stopped
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variant(s) {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    runs, results = [], []
    for seed in [int(s) for s in args.seeds.split(",") if s]:
        for variant in variants:
            run = Run(args, variant, seed, out / f"{variant}-seed{seed}")
            run.out.mkdir(parents=True)
            results.append(run.execute())
            runs.append(run)
            print(json.dumps({"event": "run", **results[-1]}), flush=True)
            write_outputs(out, runs)
    summary = {"profile": TINY_DETERMINISTIC, "topology": "broker, serve-llm, 6 services, trainer, driver: "
                                                          "separate processes", "minutes": args.minutes,
               "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
               "settings": {k: v for k, v in vars(args).items() if k not in ("out",)}, "runs": results,
               "csv": str(out / "learning.csv"), "png": str(out / "learning.png")}
    for variant in variants:
        mine = [r for r in results if r["variant"] == variant]
        summary[variant] = {"heldout_before": _mean(r["heldout_before"] for r in mine),
                            "heldout_after": _mean(r["heldout_after"] for r in mine),
                            "seeds_reaching_0.8": sum(r["time_to_0.8_s"] is not None for r in mine),
                            "seeds": len(mine)}
    main_variant = summary.get("flow_grpo") or summary[variants[0]]
    summary.update(heldout_before=main_variant["heldout_before"], heldout_after=main_variant["heldout_after"])
    print(json.dumps(summary), flush=True)
    return summary


def _mean(values) -> float:
    values = list(values)
    return round(sum(values) / len(values), 4) if values else float("nan")


if __name__ == "__main__":
    main()
