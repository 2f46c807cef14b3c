"""Flow-GRPO on the synthetic environment with the tiny planner, in one process, for a wall-clock budget.

  .venv/bin/python bench/learning_inprocess.py [--minutes 10] [--seed 0] [--out DIR] [--unlabeled]

Builds a tiny random planner (``build_tiny``), evaluates greedy held-out success, then trains with Flow-GRPO
(G trajectories per query at temperature 1, at most 3 planner turns, the ``tiny-deterministic`` profile for the
frozen modules) until the budget is spent, evaluating the held-out set every ``--eval-every`` seconds. The budget
covers everything after the model is built: the first and last evaluations and the periodic ones included.

Writes ``learning.csv`` (one row per step and per evaluation) and ``learning.png`` (training reward and held-out
success against wall time) to ``--out``, prints one JSON object per step/evaluation, and last one JSON summary with
``heldout_before``, ``heldout_after`` (fractions), the profile and the settings.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from agentflow.envs.profiles import TINY_DETERMINISTIC
from agentflow.envs.synthetic import TOOLS, EnvConfig, SyntheticEnv
from agentflow.llm.embedded import EmbeddedEngine
from agentflow.llm.models import build_tiny, smollm2_dir
from agentflow.trainer.checkpoint import ModelStore
from agentflow.trainer.grpo import GRPOConfig
from agentflow.trainer.lora import LoraConfig
from agentflow.trainer.loop import (InProcessRollouts, TrainConfig, Trainer, format_warmup, planner_prompts,
                                    task_batches, tool_responses, tool_stats, train)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget, evaluations included")
    p.add_argument("--seed", type=int, default=0, help="model init, environment, sampling")
    p.add_argument("--out", default=None, help="output folder (default /tmp/agentflow-learning-seed<SEED>)")
    p.add_argument("--group-size", type=int, default=8, help="G: trajectories per query")
    p.add_argument("--queries", type=int, default=6, help="training queries per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta", type=float, default=0.02,
                   help="KL weight to the reference planner (the format warm-up: keeps forced format tokens likely)")
    p.add_argument("--updates", type=int, default=2, help="k: optimizer updates per batch")
    p.add_argument("--hidden", type=int, default=128, help="tiny model width")
    p.add_argument("--layers", type=int, default=2, help="tiny model depth")
    p.add_argument("--heldout", type=int, default=60, help="held-out tasks (a third of each kind)")
    p.add_argument("--eval-every", type=float, default=90.0, help="seconds between held-out evaluations")
    p.add_argument("--warmup-steps", type=int, default=30,
                   help="format warm-up (SFT to every tool equally on the untrained model's own prompts); 0: none")
    p.add_argument("--turn-cost", type=float, default=0.0,
                   help="training reward of a correct answer x (1 - cost x (turns - 1)); evaluation is unshaped")
    p.add_argument("--full-prompt", action="store_true",
                   help="show the tiny planner the whole plan.md prompt instead of the profile's compact one")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--model", default="tiny",
                   help="planner: tiny (random, built here), smollm2 (SmolLM2-135M-Instruct) or a model folder")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: the budget decides)")
    p.add_argument("--lora-rank", type=int, default=0,
                   help="train LoRA adapters of this rank on the warmed planner (0: every weight)")
    p.add_argument("--lora-alpha", type=float, default=32.0, help="LoRA alpha (the update is scaled by alpha/rank)")
    p.add_argument("--unlabeled", action="store_true",
                   help="no ground truth in training: simulated users rate production answers, the groups are replays "
                        "of that traffic rewarded by the feedback ledger (and the vote, --reward-sources)")
    p.add_argument("--traffic-per-step", type=int, default=60,
                   help="--unlabeled: production queries answered (by the newest version, T=1) per training step")
    p.add_argument("--rated-share", type=float, default=0.3, help="--unlabeled: share of answers users rate")
    p.add_argument("--rating-noise", type=float, default=0.2, help="--unlabeled: share of ratings that are wrong")
    p.add_argument("--reward-sources", default="human,vote", help="--unlabeled: the trainer's reward sources")
    p.add_argument("--vote-min-agreement", type=float, default=0.5, help="--unlabeled: the vote's threshold")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    out = Path(args.out or f"/tmp/agentflow-learning-seed{args.seed}")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    t_build = time.monotonic()
    if args.model == "tiny":
        base = build_tiny(out / "base", seed=args.seed, hidden=args.hidden, layers=args.layers)
    else:
        base = smollm2_dir() if args.model == "smollm2" else Path(args.model)
    build_s = time.monotonic() - t_build
    started = time.monotonic()
    deadline = started + args.minutes * 60

    env = SyntheticEnv(EnvConfig(seed=args.seed, heldout_size=args.heldout))
    grpo = GRPOConfig(group_size=args.group_size, batch_trajectories=args.group_size * args.queries, lr=args.lr,
                      beta=args.beta, updates_per_batch=args.updates, max_staleness=0)
    config = TrainConfig(grpo=grpo, keep_last=3)
    settings = {"profile": TINY_DETERMINISTIC, "seed": args.seed, "minutes": args.minutes, "G": args.group_size,
                "queries_per_step": args.queries, "turn_cost": args.turn_cost, "lr": args.lr, "beta": args.beta,
                "updates": args.updates, "warmup_steps": args.warmup_steps, "lora_rank": args.lora_rank,
                "lora_alpha": args.lora_alpha,
                "unlabeled": args.unlabeled and {k: getattr(args, k) for k in (
                    "traffic_per_step", "rated_share", "rating_noise", "reward_sources", "vote_min_agreement")},
                "model": args.model, "hidden": args.hidden, "layers": args.layers, "max_turns": grpo.max_planner_turns,
                "tools": list(TOOLS), "planner_prompt": "full" if args.full_prompt else "compact",
                "env": env.summary()}
    lora = LoraConfig(rank=args.lora_rank, alpha=args.lora_alpha)

    def new_trainer(config: TrainConfig) -> Trainer:
        return Trainer(base, ModelStore(out / "store"), config, seed=args.seed,
                       metadata={"profile": TINY_DETERMINISTIC, "bench": "learning_inprocess"})

    trainer = new_trainer(config)  # with LoRA: full weights for the warm-up, then adapters on the warmed version
    engine = EmbeddedEngine(base, version="v0", batch_wait_s=0.0)
    rollouts = InProcessRollouts(engine, TOOLS, profile=TINY_DETERMINISTIC, tools_config=env.tools_config(out),
                                 max_turns=grpo.max_planner_turns, eval_max_turns=grpo.max_planner_turns,
                                 temperature=grpo.temperature, compact_prompt=not args.full_prompt,
                                 turn_cost=args.turn_cost, knowledge=env.knowledge())
    rollouts.sync(trainer.policy, trainer.version)

    rows: list[dict] = []

    def emit(row: dict) -> None:
        row = {"t_s": round(time.monotonic() - started, 2), **row}
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)

    t0 = time.monotonic()
    before = rollouts.evaluate(env.heldout)
    eval_s = time.monotonic() - t0
    emit({"event": "eval", "step": 0, "version": trainer.version, "heldout": before["success"],
          "by_kind": before["by_kind"], "tool_sequence_match": before["tool_sequence_match"], "eval_s": eval_s})

    batches = task_batches(env.train, args.queries, seed=args.seed)
    warm = {}
    if args.warmup_steps:
        prompts = planner_prompts(rollouts.collect(next(batches) + next(batches), 4))
        warm = format_warmup(trainer, prompts, tool_responses(trainer.tokenizer, TOOLS), steps=args.warmup_steps,
                             seed=args.seed)
        rollouts.sync(trainer.policy, trainer.version)
        result = rollouts.evaluate(env.heldout)
        emit({"event": "eval", "step": 0, "version": trainer.version, "heldout": result["success"],
              "by_kind": result["by_kind"], "tool_sequence_match": result["tool_sequence_match"],
              "stage": "after_format_warmup", **{k: round(v, 4) for k, v in warm.items()}})
        warm["heldout_after_warmup"] = result["success"]
    if lora.enabled:
        trainer = new_trainer(replace(config, lora=lora))
        rollouts.sync(trainer.serving_weights(), trainer.version)
    last_eval = [time.monotonic()]
    evals = [before]
    last_first_tools = [{}]

    def fetch() -> list[dict]:
        return rollouts.collect(next(batches), args.group_size)

    if args.unlabeled:
        fetch = UnlabeledTraffic(rollouts, env, args).fetch

    def after_step(m: dict) -> None:
        rollouts.sync(trainer.serving_weights(), trainer.version)
        emit({"event": "step", "step": len([r for r in rows if r["event"] == "step"]) + 1,
              "version": m["version"], "reward": round(m["reward"], 4), "kl": round(m.get("kl", 0.0), 5),
              "clip_frac": round(m.get("clip_frac_low", 0.0) + m.get("clip_frac_high", 0.0), 4),
              "entropy": round(m.get("entropy", 0.0), 4), "grad_norm": round(m.get("grad_norm", 0.0), 4),
              "tokens_per_s": round(m.get("tokens_per_s", 0.0), 1), "groups_kept": m["batch_groups_kept"],
              "groups_no_signal": m["batch_groups_no_signal"], "fetch_s": round(m["fetch_s"], 2),
              "update_s": round(m.get("update_s", 0.0), 2), "rows": m.get("rows", 0),
              "unique_rows": m.get("unique_rows", 0), "skipped": m.get("skipped", False),
              **{"first_" + k: round(v, 3) for k, v in last_first_tools[0].items()}})
        now = time.monotonic()
        if now - last_eval[0] >= args.eval_every and now + 2 * eval_s < deadline:
            result = rollouts.evaluate(env.heldout)
            last_eval[0] = time.monotonic()
            evals.append(result)
            emit({"event": "eval", "step": rows[-1]["step"], "version": trainer.version,
                  "heldout": result["success"], "by_kind": result["by_kind"],
                  "tool_sequence_match": result["tool_sequence_match"]})

    def fetch_and_log() -> list[dict]:
        records = fetch()
        last_first_tools[0] = tool_stats(records)["first_tool"]
        return records

    budget = max(0.0, deadline - time.monotonic() - 1.2 * eval_s)
    history = train(trainer, fetch_and_log, budget_s=budget, max_steps=args.max_steps or None, after_step=after_step)
    after = rollouts.evaluate(env.heldout)
    emit({"event": "eval", "step": len(history), "version": trainer.version, "heldout": after["success"],
          "by_kind": after["by_kind"], "tool_sequence_match": after["tool_sequence_match"]})
    wall_s = time.monotonic() - started
    engine.close()

    write_csv(out / "learning.csv", rows)
    plot(out / "learning.png", rows, settings)
    summary = {"event": "summary", "profile": TINY_DETERMINISTIC, "seed": args.seed,
               "heldout_before": before["success"], "heldout_after": after["success"],
               "heldout_best": max(e["success"] for e in evals + [after]),
               "by_kind_before": before["by_kind"], "by_kind_after": after["by_kind"],
               "tool_sequence_match_after": after["tool_sequence_match"],
               "time_to_0.8_s": next((r["t_s"] for r in rows if r["event"] == "eval" and r["heldout"] >= 0.8), None),
               "steps": len(history), "updates": sum(not m.get("skipped") for m in history),
               "wall_s": round(wall_s, 1), "model_build_s": round(build_s, 1),
               "train_reward_first": history[0]["reward"] if history else None,
               "train_reward_last": history[-1]["reward"] if history else None,
               "final_version": trainer.version, "warmup": warm, "out": str(out), "settings": settings}
    print(json.dumps(summary, default=str), flush=True)
    return summary


class UnlabeledTraffic:
    """--unlabeled: the demo's production-rewards loop in one process. Each step, ``--traffic-per-step`` production
    queries (train-split tasks, 10 % of texts opted out) are answered by the newest version at T=1 and a simulated
    user rates a share of the answers (some wrongly); the training groups are replays of train_ok queries (least
    replayed first, rated ones first among those, as ``drive --from-traffic`` picks) rewarded by the trainer's
    ``GroupRewards`` (ledger, vote); unrewarded records are left out, and a group with fewer than two rewarded
    records is dropped (as the trainer service does after its wait)."""

    def __init__(self, rollouts, env, args):
        import random

        from agentflow.trainer.rewarding import GroupRewards, parse_sources

        self.rollouts, self.args = rollouts, args
        self.rng = random.Random(args.seed + 1)
        self.queries = env.train[:90]
        self.private = {t.query for t in self.queries if self.rng.random() < 0.1}
        self.rewards = GroupRewards("math", parse_sources(args.reward_sources), args.vote_min_agreement)
        self.replays: dict[str, list] = {}  # train_ok query -> [times replayed, not rated] (drive --from-traffic)

    def fetch(self) -> list[dict]:
        self._serve([self.rng.choice(self.queries) for _ in range(self.args.traffic_per_step)])
        order = sorted(self.replays, key=lambda q: (*self.replays[q], self.rng.random()))[: self.args.queries]
        tasks = [t for t in self.queries if t.query in order]
        kept = []
        for task in tasks:
            self.replays[task.query][0] += 1
            group = [_unlabeled(r) for r in self.rollouts.collect([task], self.args.group_size)]
            rewarded = [r for r in self.rewards.apply(group) if self.rewards.reward(r) is not None]
            kept += rewarded if len(rewarded) >= 2 else []
        return kept

    def _serve(self, tasks) -> None:
        for task, record in zip(tasks, self.rollouts.collect(tasks, 1, source="traffic")):
            correct = (record.get("rewards") or [{}])[0].get("value") == 1.0
            record = _unlabeled(record)
            record["train_ok"] = task.query not in self.private
            if record["train_ok"]:
                self.replays.setdefault(task.query, [0, True])
            if self.rng.random() < self.args.rated_share:
                right = self.rng.random() >= self.args.rating_noise
                record["rewards"] = [{"value": float(correct == right), "source": "human", "author": "user"}]
                if self.rewards.observe(record):
                    self.replays[task.query][1] = False


def _unlabeled(record: dict) -> dict:
    return {**record, "ground_truth": "", "rewards": []}


def write_csv(path: Path, rows: list[dict]) -> None:
    keys = sorted({k for r in rows for k in r if not isinstance(r[k], dict)}, key=lambda k: (k != "t_s", k))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow(r)


def plot(path: Path, rows: list[dict], settings: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r for r in rows if r["event"] == "step"]
    evals = [r for r in rows if r["event"] == "eval"]
    fig, ax = plt.subplots(figsize=(7, 4))
    if steps:
        ax.plot([r["t_s"] / 60 for r in steps], [r["reward"] for r in steps], ".-", alpha=0.6,
                label="training reward (T=1, batch mean)")
    ax.plot([r["t_s"] / 60 for r in evals], [r["heldout"] for r in evals], "o-", lw=2,
            label="held-out success (greedy)")
    ax.axhline(0.8, color="grey", ls=":", lw=1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("wall time (min)")
    ax.set_ylabel("success / reward")
    ax.set_title(f"Flow-GRPO, planner {settings['model']}, profile {settings['profile']}, seed {settings['seed']}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main(sys.argv[1:])
