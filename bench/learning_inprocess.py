"""Flow-GRPO on the synthetic environment with the tiny planner, in one process, for a wall-clock budget.

  .venv/bin/python bench/learning_inprocess.py [--minutes 10] [--seed 0] [--out DIR] [--unlabeled] [--env hard]
      [--objective flow_grpo|decoupled_ppo|tis|...] [--staleness S] [--async] [--eval-every-versions N]
      [--model tiny|smollm2|FOLDER] [--warmup-lr LR] [--untrained-evals K] [--temperature T]

Builds a tiny random planner (``build_tiny``; ``--model`` loads a pretrained one instead), evaluates greedy held-out
success, then trains with Flow-GRPO (G trajectories per query at temperature 1 or ``--temperature``, at most 3
planner turns, the ``tiny-deterministic`` profile for the frozen modules) until the budget is spent, evaluating the
held-out set every ``--eval-every`` seconds. The budget covers everything after the model is built: the first and last
evaluations and the periodic ones included.

Writes ``learning.csv`` (one row per step and per evaluation) and ``learning.png`` (training reward and held-out
success against wall time) to ``--out``, prints one JSON object per step/evaluation, and last one JSON summary with
``heldout_before``, ``heldout_after`` (fractions), the profile and the settings.

Off-policy training (issue 31, ``bench/staleness.py``): ``--staleness S`` samples the rollouts of every step with
the weights of the version S versions behind the trainer (the bench keeps the serving weights of the last S+1
versions; ``grpo.max_staleness`` is S so the batch builder keeps them): the bounded off-policyness of an
asynchronous system at its worst, in a synchronous loop. ``--async`` makes it real: a producer thread samples the
next batches with the newest published weights while the trainer trains (at most S versions behind: it waits when
it is further ahead), handing them over through a bounded queue. ``--eval-every-versions N`` evaluates every N
versions instead of every ``--eval-every`` seconds, so curves against versions are comparable between runs. The
step rows then carry ``lag`` (versions between the sampling weights and the trained ones) and ``rl_s`` (seconds of
RL training so far, evaluations left out); the summary ``versions_to_0.8``, ``rl_s_to_0.8`` and throughputs.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import queue
import random
import shutil
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import InProcessRollouts, task_batches, tool_stats, train  # noqa: E402  (bench/_harness.py)
from agentflow.domain.trajectory import Record  # noqa: E402
from agentflow.envs.profiles import TINY_DETERMINISTIC  # noqa: E402
from agentflow.envs.synthetic import MODES, TOOLS, EnvConfig, SyntheticEnv  # noqa: E402
from agentflow.llm.embedded import EmbeddedEngine  # noqa: E402
from agentflow.llm.models import build_tiny, smollm2_dir  # noqa: E402
from agentflow.trainer.branching import branch_points  # noqa: E402
from agentflow.trainer.checkpoint import ModelStore  # noqa: E402
from agentflow.trainer.grpo import OBJECTIVES, GRPOConfig  # noqa: E402
from agentflow.trainer.lora import LoraConfig  # noqa: E402
from agentflow.trainer.loop import TrainConfig, Trainer  # noqa: E402
from agentflow.trainer.warmup import format_warmup, planner_prompts, tool_responses  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget, evaluations included")
    p.add_argument("--seed", type=int, default=0, help="model init, environment, sampling")
    p.add_argument("--out", default=None, help="output folder (default /tmp/agentflow-learning-seed<SEED>)")
    p.add_argument("--group-size", type=int, default=8, help="G: trajectories per query")
    p.add_argument("--queries", type=int, default=6, help="training queries per step")
    p.add_argument("--lr", type=float, default=None,
                   help="GRPO learning rate (default 1e-3 for the tiny planner, 1e-5 for a pretrained one)")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature of the training rollouts (grpo.temperature; --unlabeled: of the traffic "
                        "too); log-probs are always taken at 1")
    p.add_argument("--beta", type=float, default=0.02,
                   help="KL weight to the reference planner (the format warm-up: keeps forced format tokens likely)")
    p.add_argument("--updates", type=int, default=2, help="k: optimizer updates per batch")
    p.add_argument("--hidden", type=int, default=128, help="tiny model width")
    p.add_argument("--layers", type=int, default=2, help="tiny model depth")
    p.add_argument("--heldout", type=int, default=60, help="held-out tasks (a third of each kind)")
    p.add_argument("--eval-every", type=float, default=90.0, help="seconds between held-out evaluations")
    p.add_argument("--warmup-steps", type=int, default=30,
                   help="format warm-up (SFT to every tool equally on the untrained model's own prompts); 0: none")
    p.add_argument("--warmup-lr", type=float, default=None,
                   help="the warm-up's learning rate (default 3e-3 for the tiny planner, 3e-5 for a pretrained one)")
    p.add_argument("--turn-cost", type=float, default=0.0,
                   help="training reward of a correct answer x (1 - cost x (turns - 1)); evaluation is unshaped")
    p.add_argument("--full-prompt", action="store_true",
                   help="show the tiny planner the whole plan.md prompt instead of the profile's compact one")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--model", default="tiny",
                   help="planner: tiny (random, built here), smollm2 (SmolLM2-135M-Instruct) or a model folder")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: the budget decides)")
    p.add_argument("--untrained-evals", type=int, default=1,
                   help="evaluate the untrained planner this many times (the summary's heldout_untrained: how much "
                        "an evaluation varies by itself)")
    p.add_argument("--lora-rank", type=int, default=0,
                   help="train LoRA adapters of this rank on the warmed planner (0: every weight)")
    p.add_argument("--lora-alpha", type=float, default=32.0, help="LoRA alpha (the update is scaled by alpha/rank)")
    p.add_argument("--env", default="standard", choices=MODES,
                   help="the synthetic environment's mode: hard has three-hop tasks, modules that err and a deadline "
                        "of 4 turns (docs/training.md)")
    p.add_argument("--branch-groups", type=int, default=0,
                   help="per step, this many more groups of G continuations branched at a random turn of the last "
                        "batch's trajectories (trainer/branching.py; 0: whole-query groups only)")
    p.add_argument("--branch-from", default="any", choices=("any", "failed"),
                   help="which of the last batch's trajectories may be branched: any, or those that failed")
    p.add_argument("--unlabeled", action="store_true",
                   help="no ground truth in training: simulated users rate production answers, the groups are replays "
                        "of that traffic rewarded by the feedback ledger (and the vote, --reward-sources)")
    p.add_argument("--traffic-per-step", type=int, default=60,
                   help="--unlabeled: production queries answered (by the newest version, T=1) per training step")
    p.add_argument("--rated-share", type=float, default=0.3, help="--unlabeled: share of answers users rate")
    p.add_argument("--rating-noise", type=float, default=0.2, help="--unlabeled: share of ratings that are wrong")
    p.add_argument("--reward-sources", default="human,vote", help="--unlabeled: the trainer's reward sources")
    p.add_argument("--vote-min-agreement", type=float, default=0.5, help="--unlabeled: the vote's threshold")
    p.add_argument("--keep-flat-groups", action="store_true",
                   help="groups without a reward spread train on the KL penalty alone (grpo.keep_flat_groups)")
    p.add_argument("--objective", default="flow_grpo", choices=sorted(OBJECTIVES),
                   help="what the trainer minimises (grpo.OBJECTIVES)")
    p.add_argument("--staleness", type=int, default=0,
                   help="rollouts sampled by the version this many versions behind the trainer (grpo.max_staleness "
                        "is set to it); with --async, the most the producer may be behind")
    p.add_argument("--async", dest="async_rollouts", action="store_true",
                   help="a producer thread samples the next batches while the trainer trains (bounded queue, at most "
                        "--staleness versions behind; --threads applies to both sides)")
    p.add_argument("--eval-every-versions", type=int, default=0,
                   help="evaluate held-out every N versions instead of every --eval-every seconds (0: by seconds)")
    args = p.parse_args(argv)
    if args.staleness < 0 or args.eval_every_versions < 0:
        p.error("--staleness and --eval-every-versions must be >= 0")
    if args.untrained_evals < 1:
        p.error("--untrained-evals must be >= 1")
    if args.unlabeled and (args.staleness or args.async_rollouts):
        p.error("--unlabeled samples with the newest version: not with --staleness or --async")
    if args.branch_groups < 0 or (args.branch_groups and (args.unlabeled or args.async_rollouts)):
        p.error("--branch-groups must be >= 0, and branches the synchronous labelled loop only")
    tiny = args.model == "tiny"  # a random planner takes far larger steps than a pretrained one survives
    args.lr = args.lr if args.lr is not None else (1e-3 if tiny else 1e-5)
    args.warmup_lr = args.warmup_lr if args.warmup_lr is not None else (3e-3 if tiny else 3e-5)
    return args


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

    env = SyntheticEnv(EnvConfig(seed=args.seed, heldout_size=args.heldout, mode=args.env))
    grpo = GRPOConfig(group_size=args.group_size, batch_trajectories=args.group_size * args.queries, lr=args.lr,
                      beta=args.beta, updates_per_batch=args.updates, max_staleness=args.staleness,
                      keep_flat_groups=args.keep_flat_groups, temperature=args.temperature)
    if env.max_turns:  # the environment's deadline
        grpo = replace(grpo, max_planner_turns=env.max_turns)
    config = TrainConfig(grpo=grpo, keep_last=3, objective=args.objective)
    settings = {"profile": TINY_DETERMINISTIC, "seed": args.seed, "minutes": args.minutes, "G": args.group_size,
                "queries_per_step": args.queries, "turn_cost": args.turn_cost, "lr": args.lr, "beta": args.beta,
                "temperature": args.temperature,
                "updates": args.updates, "keep_flat_groups": args.keep_flat_groups, "warmup_steps": args.warmup_steps,
                "warmup_lr": args.warmup_lr,
                "lora_rank": args.lora_rank, "lora_alpha": args.lora_alpha,
                "unlabeled": args.unlabeled and {k: getattr(args, k) for k in (
                    "traffic_per_step", "rated_share", "rating_noise", "reward_sources", "vote_min_agreement")},
                "model": args.model, "hidden": args.hidden, "layers": args.layers, "max_turns": grpo.max_planner_turns,
                "tools": list(TOOLS), "planner_prompt": "full" if args.full_prompt else "compact",
                "env": env.summary(), "objective": args.objective, "staleness": args.staleness,
                "async": args.async_rollouts, "eval_every_versions": args.eval_every_versions,
                "threads": args.threads, "branch_groups": args.branch_groups, "branch_from": args.branch_from}
    lora = LoraConfig(rank=args.lora_rank, alpha=args.lora_alpha)

    def new_trainer(config: TrainConfig) -> Trainer:
        return Trainer(base, ModelStore(out / "store"), config, seed=args.seed,
                       metadata={"profile": TINY_DETERMINISTIC, "bench": "learning_inprocess"})

    trainer = new_trainer(config)  # with LoRA: full weights for the warm-up, then adapters on the warmed version
    engine = EmbeddedEngine(base, version="v0", batch_wait_s=0.0)

    def new_rollouts(engine) -> InProcessRollouts:
        return InProcessRollouts(engine, TOOLS, profile=TINY_DETERMINISTIC, tools_config=env.tools_config(out),
                                 max_turns=grpo.max_planner_turns, eval_max_turns=grpo.max_planner_turns,
                                 temperature=grpo.temperature, compact_prompt=not args.full_prompt,
                                 turn_cost=args.turn_cost, **env.rules())

    rollouts = new_rollouts(engine)
    rollouts.sync(trainer.policy, trainer.version)

    rows: list[dict] = []

    def emit(row: dict) -> None:
        row = {"t_s": round(time.monotonic() - started, 2), **row}
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)

    t0 = time.monotonic()
    before = rollouts.evaluate(env.heldout)
    eval_s = time.monotonic() - t0
    untrained = [before["success"]] + [rollouts.evaluate(env.heldout)["success"]
                                       for _ in range(args.untrained_evals - 1)]
    emit({"event": "eval", "step": 0, "version": trainer.version, "heldout": before["success"],
          "by_kind": before["by_kind"], "tool_sequence_match": before["tool_sequence_match"], "eval_s": eval_s})

    batches = task_batches(env.train, args.queries, seed=args.seed)
    warm = {}
    if args.warmup_steps:
        prompts = planner_prompts(rollouts.collect(next(batches) + next(batches), 4))
        warm = format_warmup(trainer, prompts, tool_responses(trainer.tokenizer, TOOLS), steps=args.warmup_steps,
                             lr=args.warmup_lr, seed=args.seed)
        rollouts.sync(trainer.policy, trainer.version)
        result = rollouts.evaluate(env.heldout)
        emit({"event": "eval", "step": 0, "version": trainer.version, "heldout": result["success"],
              "by_kind": result["by_kind"], "tool_sequence_match": result["tool_sequence_match"],
              "stage": "after_format_warmup", **{k: round(v, 4) for k, v in warm.items()}})
        warm["heldout_after_warmup"] = result["success"]
    if lora.enabled:
        trainer = new_trainer(replace(config, lora=lora))
        rollouts.sync(trainer.serving_weights(), trainer.version)
    first_version = trainer.version  # the first version RL trains (after the warm-up): versions count from it
    lagged = LaggedWeights(args.staleness, first_version, trainer.serving_weights())
    producer = None
    if args.async_rollouts:  # the producer samples on an engine of its own; this one only evaluates
        producer = AsyncRollouts(new_rollouts(EmbeddedEngine(base, version=f"v{first_version}", batch_wait_s=0.0)),
                                 lambda: next(batches), args.group_size, args.staleness, first_version,
                                 lagged.newest)
    last_eval = [time.monotonic(), trainer.version]  # when, and at which version, the last evaluation ran
    evals = [before]
    last_first_tools = [{}]
    clock = RLClock()
    sampled = [first_version]  # the version whose weights sampled the batch being trained

    last_batch: list[dict] = []
    branch_rng = random.Random(args.seed)

    def fetch() -> list[dict]:
        sampled[0] = lagged.serving
        records = rollouts.collect(next(batches), args.group_size)
        candidates = [r for r in last_batch if args.branch_from == "any" or not Record(r).reward()]
        points = branch_points(candidates, args.branch_groups, branch_rng) if args.branch_groups else []
        last_batch[:] = records
        return records + rollouts.collect_branches(points, args.group_size)

    if args.unlabeled:
        traffic = UnlabeledTraffic(rollouts, env, args)

        def fetch() -> list[dict]:
            sampled[0] = lagged.serving
            return traffic.fetch()

    if producer is not None:
        def fetch() -> list[dict]:
            records, sampled[0] = producer.fetch()
            return records

    def evaluate_newest() -> dict:
        """Held-out success of the trainer's newest weights (the engine may hold older ones: --staleness, --async)."""
        pause = producer.paused() if producer is not None else contextlib.nullcontext()
        with pause, clock.evaluating():
            if lagged.serving != trainer.version or producer is not None:
                rollouts.sync(lagged.newest, trainer.version)
            result = rollouts.evaluate(env.heldout)
            if lagged.serving != trainer.version and producer is None:
                rollouts.sync(lagged.weights, lagged.serving)
            return result

    def after_step(m: dict) -> None:
        lagged.push(trainer.version, trainer.serving_weights())
        if producer is not None:
            producer.publish(trainer.version, lagged.newest, steps_done=len(history_steps) + 1)
        else:
            rollouts.sync(lagged.weights, lagged.serving)
        history_steps.append(m)
        emit({"event": "step", "step": len(history_steps),
              "version": m["version"], "reward": round(m["reward"], 4), "kl": round(m.get("kl", 0.0), 5),
              "clip_frac": round(m.get("clip_frac_low", 0.0) + m.get("clip_frac_high", 0.0), 4),
              "entropy": round(m.get("entropy", 0.0), 4), "grad_norm": round(m.get("grad_norm", 0.0), 4),
              "tokens_per_s": round(m.get("tokens_per_s", 0.0), 1), "groups_kept": m["batch_groups_kept"],
              "groups_no_signal": m["batch_groups_no_signal"],
              "groups_kl_only": m["batch_groups_kl_only"], "fetch_s": round(m["fetch_s"], 2),
              "update_s": round(m.get("update_s", 0.0), 2), "rows": m.get("rows", 0),
              "unique_rows": m.get("unique_rows", 0), "skipped": m.get("skipped", False),
              **({"lag": m["lag"], "turns_stale": m.get("batch_turns_stale", 0), "rl_s": round(clock.seconds(), 2)}
                 if off_policy_settings else {}),
              **sampled_so_far, **{"first_" + k: round(v, 3) for k, v in last_first_tools[0].items()}})
        now = time.monotonic()
        if args.eval_every_versions:
            due = trainer.version - last_eval[1] >= args.eval_every_versions
        else:
            due = now - last_eval[0] >= args.eval_every
        if due and now + 2 * eval_s < deadline:
            rl_s = clock.seconds()
            result = evaluate_newest()
            last_eval[:] = [time.monotonic(), trainer.version]
            evals.append(result)
            emit({"event": "eval", "step": rows[-1]["step"], "version": trainer.version, **sampled_so_far,
                  "heldout": result["success"], "by_kind": result["by_kind"],
                  "tool_sequence_match": result["tool_sequence_match"],
                  **({"rl_s": round(rl_s, 2)} if off_policy_settings else {})})

    sampled_so_far = {"rollouts": 0, "planner_turns": 0}  # every trajectory the training steps sampled

    def fetch_and_log() -> list[dict]:
        version = trainer.version
        records = fetch()
        sampled_so_far["rollouts"] += len(records)
        sampled_so_far["planner_turns"] += sum(len(r["turns"]) for r in records)
        lags.append(version - sampled[0])
        last_first_tools[0] = tool_stats(records)["first_tool"]
        return records

    def step_metrics(m: dict) -> None:
        after_step({**m, "lag": lags[-1]})

    off_policy_settings = bool(args.staleness or args.async_rollouts or args.eval_every_versions
                               or args.objective != "flow_grpo")
    history_steps: list[dict] = []
    lags: list[int] = []
    budget = max(0.0, deadline - time.monotonic() - 1.2 * eval_s)
    clock.start()
    if producer is not None:
        producer.start()
    try:
        history = train(trainer, fetch_and_log, budget_s=budget, max_steps=args.max_steps or None,
                        after_step=step_metrics)
        rl_s, rl_cpu_s = clock.seconds(), clock.cpu_seconds()
    finally:
        if producer is not None:
            producer.close()
    after = evaluate_newest()
    emit({"event": "eval", "step": len(history), "version": trainer.version, **sampled_so_far,
          "heldout": after["success"],
          "by_kind": after["by_kind"], "tool_sequence_match": after["tool_sequence_match"],
          **({"rl_s": round(rl_s, 2)} if off_policy_settings else {})})
    wall_s = time.monotonic() - started
    engine.close()

    write_csv(out / "learning.csv", rows)
    plot(out / "learning.png", rows, settings)
    summary = {"event": "summary", "profile": TINY_DETERMINISTIC, "seed": args.seed,
               "heldout_before": before["success"], "heldout_after": after["success"], "heldout_untrained": untrained,
               "heldout_best": max(e["success"] for e in evals + [after]),
               "by_kind_before": before["by_kind"], "by_kind_after": after["by_kind"],
               "tool_sequence_match_after": after["tool_sequence_match"],
               "time_to_0.8_s": next((r["t_s"] for r in rows if r["event"] == "eval" and r["heldout"] >= 0.8), None),
               "rollouts_to_0.8": next((r["rollouts"] for r in rows if r["event"] == "eval" and r["heldout"] >= 0.8
                                        and "rollouts" in r), None), **sampled_so_far,
               "steps": len(history), "updates": sum(not m.get("skipped") for m in history),
               "wall_s": round(wall_s, 1), "model_build_s": round(build_s, 1),
               "train_reward_first": history[0]["reward"] if history else None,
               "train_reward_last": history[-1]["reward"] if history else None,
               "final_version": trainer.version, "warmup": warm, "out": str(out), "settings": settings}
    if off_policy_settings:
        summary.update(off_policy_summary(rows, history, lags, first_version, rl_s, rl_cpu_s))
    print(json.dumps(summary, default=str), flush=True)
    return summary


# --- off-policy bookkeeping (--staleness, --async) ------------------------------------------------------------------


def serving_version(trainer_version: int, staleness: int, first_version: int) -> int:
    """The version whose weights sample the rollouts that the trainer at ``trainer_version`` trains on, with a lag of
    ``staleness`` versions: S behind, but never before ``first_version`` (the first version RL trains: at the start
    its weights are all there is). A step that writes no version (nothing trainable) keeps the serving version.
    With every step writing one, step k (1-based) trains ``first + k - 1`` on rollouts of
    ``max(first, first + k - 1 - S)``."""
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {staleness}")
    return max(first_version, trainer_version - staleness)


def may_sample(batch_index: int, steps_done: int, staleness: int) -> bool:
    """--async: whether the producer may start sampling batch ``batch_index`` (0-based; step ``batch_index + 1``
    trains it) once ``steps_done`` steps have finished. A step writes at most one version, so the newest weights at
    that moment are at most ``staleness`` versions behind the ones that train the batch; staleness 0 is the
    synchronous loop (batch i is sampled after step i)."""
    return steps_done >= batch_index - staleness


def _snapshot(weights: dict) -> dict:
    """A copy that later optimizer steps cannot change (on a CPU ``serving_weights`` are the live parameters)."""
    return {k: v.detach().clone() for k, v in weights.items()}


class LaggedWeights:
    """The serving weights of the last S+1 versions: the newest one (for evaluation, and for the --async producer)
    and the one S behind it (what samples, ``serving_version``). ``push`` after every step."""

    def __init__(self, staleness: int, first_version: int, weights: dict):
        self.staleness, self.first_version, self.newest_version = staleness, first_version, first_version
        self._kept = {first_version: _snapshot(weights)}

    def push(self, version: int, weights: dict) -> None:
        if version == self.newest_version:  # a skipped step: no new weights
            return
        if version != self.newest_version + 1:
            raise ValueError(f"versions must come one at a time: v{self.newest_version} then v{version}")
        self._kept[version] = _snapshot(weights)
        self.newest_version = version
        self._kept = {v: w for v, w in self._kept.items() if v >= self.serving}

    @property
    def serving(self) -> int:
        return serving_version(self.newest_version, self.staleness, self.first_version)

    @property
    def weights(self) -> dict:
        return self._kept[self.serving]

    @property
    def newest(self) -> dict:
        return self._kept[self.newest_version]

    def versions(self) -> list[int]:
        return sorted(self._kept)


class AsyncRollouts:
    """--async: a producer thread samples batches (``next_tasks()`` x G trajectories, on ``rollouts``' own engine)
    with the newest published weights while the trainer trains, and hands them over through a bounded queue. It
    starts batch i only when ``may_sample(i, steps done, staleness)``: no global barrier, at most ``staleness``
    versions behind. ``paused()`` holds it between two groups (the evaluation, which is not training time)."""

    def __init__(self, rollouts: InProcessRollouts, next_tasks, group_size: int, staleness: int, version: int,
                 weights: dict):
        self.rollouts, self.next_tasks, self.group_size, self.staleness = rollouts, next_tasks, group_size, staleness
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, staleness))
        self._cond = threading.Condition()
        self._latest = (version, weights)
        self._steps_done, self._pauses, self._stop = 0, 0, False
        self._group = threading.Lock()  # held while a group is sampled
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def publish(self, version: int, weights: dict, *, steps_done: int) -> None:
        """After every step: the newest version's weights (a snapshot nobody changes) and the steps finished."""
        with self._cond:
            self._latest, self._steps_done = (version, weights), steps_done
            self._cond.notify_all()

    def fetch(self) -> tuple[list[dict], int]:
        """The next batch's scored records and the version that sampled them (waits for them)."""
        while True:
            try:
                return self._queue.get(timeout=1.0)
            except queue.Empty:
                if self._error is not None:
                    raise RuntimeError("the rollout producer failed") from self._error
                if not self._thread.is_alive():
                    raise RuntimeError("the rollout producer stopped")

    @contextlib.contextmanager
    def paused(self):
        with self._cond:
            self._pauses += 1
        try:
            with self._group:  # the group in flight ends first
                yield
        finally:
            with self._cond:
                self._pauses -= 1
                self._cond.notify_all()

    def close(self, timeout_s: float = 120.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self.rollouts.engine.close(cancel=True)

    def _run(self) -> None:
        try:
            synced = None
            for index in range(sys.maxsize):
                with self._cond:
                    self._cond.wait_for(lambda: self._stop or may_sample(index, self._steps_done, self.staleness))
                    if self._stop:
                        return
                    version, weights = self._latest
                if version != synced:
                    self.rollouts.sync(weights, version)
                    synced = version
                records = []
                for task in self.next_tasks():
                    with self._cond:
                        self._cond.wait_for(lambda: self._stop or not self._pauses)
                        if self._stop:
                            return
                    with self._group:
                        records += self.rollouts.collect([task], self.group_size)
                while True:
                    try:
                        self._queue.put((records, version), timeout=0.5)
                        break
                    except queue.Full:
                        if self._stop:
                            return
        except BaseException as exc:  # handed to the trainer by fetch
            self._error = exc


class RLClock:
    """Seconds of RL training: wall time since ``start`` less the time spent in evaluations; and the same in CPU
    seconds of this process (all its threads: on a shared machine, what the run got of it)."""

    def __init__(self):
        self._started: tuple[float, float] | None = None
        self._evaluating = [0.0, 0.0]

    def start(self) -> None:
        self._started = (time.monotonic(), time.process_time())

    @contextlib.contextmanager
    def evaluating(self):
        t0, c0 = time.monotonic(), time.process_time()
        try:
            yield
        finally:
            self._evaluating[0] += time.monotonic() - t0
            self._evaluating[1] += time.process_time() - c0

    def seconds(self) -> float:
        return 0.0 if self._started is None else time.monotonic() - self._started[0] - self._evaluating[0]

    def cpu_seconds(self) -> float:
        return 0.0 if self._started is None else time.process_time() - self._started[1] - self._evaluating[1]


def off_policy_summary(rows: list[dict], history: list[dict], lags: list[int], first_version: int,
                       rl_s: float, rl_cpu_s: float) -> dict:
    """The staleness study's numbers of one run: versions and RL seconds to the first held-out evaluation >= 0.8
    (None if none), the held-out curve against versions, the trajectories per minute of RL training (handed to the
    trainer; trained, i.e. in a batch after the filters; per CPU minute of this process) and the batches' lags."""
    curve = [r for r in rows if r["event"] == "eval" and "rl_s" in r]
    reached = next((r for r in curve if r["heldout"] >= 0.8), None)
    minutes = max(rl_s, 1e-9) / 60
    trained = [m for m in history if not m.get("skipped")]
    return {"versions_to_0.8": None if reached is None else reached["version"] - first_version,
            "rl_s_to_0.8": None if reached is None else reached["rl_s"],
            "rl_s": round(rl_s, 1), "rl_versions": (curve[-1]["version"] - first_version) if curve else 0,
            "first_rl_version": first_version,
            "curve": [[r["version"] - first_version, round(r["heldout"], 4), r["rl_s"]] for r in curve],
            "trajectories_per_min": round(sum(m.get("records", 0) for m in history) / minutes, 1),
            "trained_trajectories_per_min": round(sum(m.get("trajectories", 0) for m in trained) / minutes, 1),
            "rl_cpu_s": round(rl_cpu_s, 1), "rl_cores": round(rl_cpu_s / max(rl_s, 1e-9), 2),
            "trajectories_per_cpu_min": round(sum(m.get("records", 0) for m in history) / max(rl_cpu_s / 60, 1e-9),
                                              1),
            "lag_mean": round(sum(lags) / len(lags), 3) if lags else None, "lag_max": max(lags, default=None),
            "turns_stale": sum(m.get("batch_turns_stale", 0) for m in history)}


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
