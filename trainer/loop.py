"""The Flow-GRPO trainer step and an in-process rollout driver (docs/training.md).

One step, as a short function of trajectory records (``Trainer.step``)::

    records (scored)  ->  build_batch (groups, advantages broadcast to turns, staleness filter)
                      ->  fill_old_logprobs (where the served ones are missing)
                      ->  reference log-probs (frozen copy of the starting planner)
                      ->  k inner updates: micro-batches of whole trajectories, loss / global count, summed grads,
                          grad clipping, AdamW, LR schedule
                      ->  checkpoint (safetensors + tokenizer + metadata) as the next version in the model store
                      ->  metrics

Records are plain trajectory dicts (``agentflow/domain/trajectory.schema.json``), so a Kafka consumer of
``trajectories`` can feed ``Trainer.step`` the same way the in-process driver does: ``score_records`` adds the rule
reward against each record's ``ground_truth`` where it is missing.

``InProcessRollouts`` samples G trajectories per training query with the real loop (``Agent.solve``) on an
``EmbeddedEngine`` whose weights are the planner being trained (copied in by ``sync`` after every step, with the
new version as the engine's version string, so every record says which policy produced it), under a profile
(``tiny-deterministic`` by default) for the frozen modules.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch

from agentflow.errors import InvalidInput
from agentflow.domain.trajectory import Record
from agentflow.rewards import score
from agentflow.tools.base import ToolResult
from agentflow.trainer.batch import build_batch, fill_old_logprobs, sequence_logprobs
from agentflow.trainer.checkpoint import ModelStore
from agentflow.trainer.grpo import OBJECTIVES, GRPOConfig, aggregation_count, objective

log = logging.getLogger(__name__)
TRAINER_STATE = "trainer_state.pt"  # in a checkpoint folder: optimizer and schedule state (not needed to serve)


# --- configuration ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser and bookkeeping settings around the Flow-GRPO objective (``grpo``)."""

    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    micro_batch_rows: int = 256  # gradient accumulation: planner turns per forward/backward
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0  # linear LR warm-up over optimizer updates, then constant
    max_length: int | None = 4096  # longer planner turns are dropped (counted in turns_too_long)
    keep_last: int | None = None  # checkpoints kept in the store (besides v0); None keeps every version
    save_optimizer_state: bool = True  # AdamW + schedule state beside the weights (trainer_state.pt), for resuming
    reward_kind: str = "math"  # agentflow.rewards kind that scores records against their ground truth
    objective: str = "flow_grpo"  # a name in grpo.OBJECTIVES: flow_grpo, or an ablation (last_turn, sft_success)

    def __post_init__(self) -> None:
        if self.micro_batch_rows < 1:
            raise InvalidInput(f"train.micro_batch_rows must be >= 1, got {self.micro_batch_rows}")
        if not self.max_grad_norm > 0:
            raise InvalidInput(f"train.max_grad_norm must be > 0, got {self.max_grad_norm}")
        if self.warmup_steps < 0 or self.weight_decay < 0:
            raise InvalidInput("train.warmup_steps and train.weight_decay must be >= 0")
        if self.keep_last is not None and self.keep_last < 1:
            raise InvalidInput(f"train.keep_last must be >= 1 or None, got {self.keep_last}")
        if self.objective not in OBJECTIVES:
            raise InvalidInput(f"train.objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")


# --- rewards ------------------------------------------------------------------------------------------------------


def score_records(records: Iterable[dict], kind: str = "math", *, turn_cost: float = 0.0) -> list[dict]:
    """Add a rule reward (``agentflow.rewards.score``) against ``ground_truth`` to records that have none.

    One reward per trajectory; ``build_batch`` broadcasts it to every planner turn. Records without ground truth
    are left unscored (their group waits for a reward, e.g. from ``feedback``). ``turn_cost`` > 0 shapes the
    reward of a correct answer by the turns it took: ``R = score × max(0, 1 − turn_cost × (turns − 1))`` — off
    by default (the paper's reward is the outcome alone)."""
    if not 0 <= turn_cost < 1:
        raise InvalidInput(f"turn_cost must be in [0, 1), got {turn_cost}")
    out = []
    for record in records:
        view = Record(record)
        if record.get("ground_truth") and view.reward(["rule"]) is None:
            reward = score(kind, record.get("answer", ""), {"answer": record["ground_truth"]})
            turns = len(view.turns)
            if turn_cost and reward["value"] > 0 and turns > 1:
                factor = max(0.0, 1.0 - turn_cost * (turns - 1))
                reward = {**reward, "value": reward["value"] * factor,
                          "detail": f"{reward['detail']}; x{factor:g} for {turns} turns (turn_cost {turn_cost:g})"}
            record.setdefault("rewards", []).append(reward)
        out.append(record)
    return out


# --- the trainer --------------------------------------------------------------------------------------------------


class Trainer:
    """Owns the planner being trained, its frozen reference, the optimizer and the model store.

    On start it resumes from the store's latest version; an empty store gets the starting model as version 0.
    """

    def __init__(self, model_dir: str | Path, store: ModelStore, config: TrainConfig = TrainConfig(), *,
                 metadata: dict | None = None, seed: int = 0):
        from transformers import AutoTokenizer

        from agentflow.llm.models import load_causal_lm

        torch.manual_seed(seed)
        self.config, self.store, self.metadata = config, store, dict(metadata or {})
        latest = store.latest()
        source = latest.path if latest else Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(source)
        self.policy = load_causal_lm(source)
        self.policy.eval()  # no dropout: log-probs must match what the engine served
        if latest is None:
            latest = store.save(self.policy, self.tokenizer, parent=None,
                                extra={**self.metadata, "base_model": str(model_dir)})
        self.version = latest.version
        # the reference is where RL started: the format warm-up's version if there was one, else version 0
        warmed = [v for v in store.versions() if store.get(v).metadata.get("stage") == "format_warmup"]
        self.reference_version = warmed[-1] if warmed else 0
        self.reference = None
        if config.grpo.beta > 0:
            base = store.get(self.reference_version).path
            self.reference = load_causal_lm(base).eval()
            for p in self.reference.parameters():
                p.requires_grad_(False)
        g = config.grpo
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=g.lr, betas=config.adam_betas,
                                           weight_decay=config.weight_decay)
        warm = config.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda n: min(1.0, (n + 1) / warm) if warm else 1.0)
        state = latest.path / TRAINER_STATE
        if state.is_file():  # resuming: the optimizer continues where the checkpointed step left it
            saved = torch.load(state, weights_only=True)
            self.optimizer.load_state_dict(saved["optimizer"])
            self.scheduler.load_state_dict(saved["scheduler"])
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def step(self, records: Sequence[dict], *, checkpoint_extra: dict | None = None) -> dict:
        """One Flow-GRPO step on scored records; returns its metrics (``skipped`` when nothing was trainable).
        ``checkpoint_extra`` goes into the new version's metadata (a consumer's offsets, for resuming)."""
        g, started = self.config.grpo, time.perf_counter()
        batch = build_batch(records, pad_id=self.pad_id, current_version=self.version,
                            max_staleness=g.max_staleness, adv_eps=g.adv_eps, max_length=self.config.max_length,
                            credit=objective(self.config.objective).credit, min_version=self.reference_version)
        metrics: dict = {"version": self.version, "reward": batch.stats.reward_mean,
                         **{f"batch_{k}": v for k, v in batch.stats.as_dict().items()}}
        if len(batch) == 0:  # every group without signal (or unscored, or stale): nothing to learn from
            return {**metrics, "skipped": True, "step_s": time.perf_counter() - started}
        batch = fill_old_logprobs(batch, self.policy)
        metrics.update(self._updates(batch))
        metrics["update_s"] = time.perf_counter() - started
        metrics["tokens_per_s"] = float(batch.attention_mask.sum()) * g.updates_per_batch / metrics["update_s"]
        self.version += 1
        metrics["version"] = self.version
        metrics["checkpoint"] = str(self._checkpoint(metrics, checkpoint_extra).path)
        metrics["step_s"] = time.perf_counter() - started
        return metrics

    def _updates(self, batch) -> dict:
        """k optimizer updates on ``batch``: micro-batches of whole trajectories, each divided by the whole batch's
        count so that their summed gradients are the batch's gradient; clipping; AdamW; the schedule."""
        g = self.config.grpo
        shards = batch.micro_batches(self.config.micro_batch_rows)
        target = objective(self.config.objective)
        denominator = aggregation_count(batch.response_mask, batch.traj_index, target.aggregation or g.aggregation)
        with torch.no_grad():
            refs = [unique_row_logprobs(self.reference, s)[0] if self.reference is not None else None
                    for s in shards]
        sums: dict[str, float] = {"loss": 0.0, "tokens": 0.0}
        grad_norms: list[float] = []
        nonfinite = 0
        for _ in range(g.updates_per_batch):
            self.optimizer.zero_grad(set_to_none=True)
            for shard, ref in zip(shards, refs):
                logp, entropy = unique_row_logprobs(self.policy, shard)
                loss, m = target.loss(logp, shard.old_logp, ref, shard.advantages, shard.response_mask, g,
                                      traj_index=shard.traj_index, denominator=denominator, entropy=entropy)
                loss.backward()
                for k in ("pg_loss", "kl", "ratio_mean", "clip_frac_low", "clip_frac_high", "log_ratio_clamped",
                          "entropy"):
                    if k in m:  # token-weighted means over shards and updates
                        sums[k] = sums.get(k, 0.0) + m[k] * m["tokens"]
                sums["loss"] += m["loss"]  # each shard's loss is its share of the batch's
                sums["tokens"] += m["tokens"]
            norm = float(torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.config.max_grad_norm))
            if not math.isfinite(norm):
                # a non-finite loss or gradient (e.g. an importance ratio exp(logp - old_logp) that overflowed):
                # skip this update rather than write NaN into the weights and Adam's moments
                self.optimizer.zero_grad(set_to_none=True)
                nonfinite += 1
                continue
            grad_norms.append(norm)
            self.optimizer.step()
            self.scheduler.step()
        tokens = max(sums.pop("tokens"), 1.0)
        out = {k: v / tokens for k, v in sums.items() if k != "loss"}
        finite = grad_norms or [float("nan")]
        out.update(loss=sums["loss"] / g.updates_per_batch, grad_norm=sum(finite) / len(finite),
                   grad_norm_max=max(finite), nonfinite_updates=nonfinite, lr=self.scheduler.get_last_lr()[0],
                   rows=len(batch),
                   unique_rows=sum(_distinct(s) for s in shards), trajectories=batch.num_trajectories,
                   response_tokens=batch.num_tokens)
        return out

    def _checkpoint(self, metrics: dict, extra: dict | None = None):
        """The weights as the next version (with the optimizer's state, for resuming), then old versions pruned."""
        def trainer_state(folder: Path) -> None:
            if self.config.save_optimizer_state:
                torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                            "version": self.version}, folder / TRAINER_STATE)

        checkpoint = self.store.save(self.policy, self.tokenizer, parent=self.version - 1, metrics=_clean(metrics),
                                     extra={**self.metadata, **(extra or {})}, version=self.version,
                                     write_extra=trainer_state)
        if self.config.keep_last:
            self.store.prune(self.config.keep_last, keep=(0, self.reference_version))
        return checkpoint


# --- format warm-up -----------------------------------------------------------------------------------------------


def tool_responses(tokenizer, tools: Sequence[str]) -> list[list[int]]:
    """The planner's response tokens for each tool under the tiny-deterministic profile: what structured decoding
    of ``{"tool": <name>}`` returns (the JSON text, then EOS)."""
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token) if tokenizer.eos_token else None
    return [tokenizer.encode(json.dumps({"tool": t}), add_special_tokens=False) + ([eos] if eos is not None else [])
            for t in tools]


def planner_prompts(records: Iterable[dict]) -> list[list[int]]:
    """The distinct planner prompts (token ids) of some records, in order of appearance."""
    seen: dict[tuple, None] = {}
    for record in records:
        for call in Record(record).planner_calls():
            ids = call.get("prompt_token_ids")
            if ids:
                seen.setdefault(tuple(ids), None)
    return [list(p) for p in seen]


def format_warmup(trainer: Trainer, prompts: Sequence[list[int]], responses: Sequence[list[int]], *,
                  steps: int = 30, lr: float = 3e-3, seed: int = 0, checkpoint_extra: dict | None = None) -> dict:
    """Supervised warm-up on correct-format planner outputs, every prompt paired with *every* response equally.

    The loss is the mean cross-entropy of the response tokens, so the shared format tokens become near-certain and
    the choice between responses becomes uniform for every prompt: the warm-up teaches the format and no
    preference (a random initialisation can favour one tool strongly, which starves the others of samples).
    It runs on its own optimizer, is checkpointed as the next version, and becomes the KL reference.
    """
    if not prompts or not responses:
        raise InvalidInput("format_warmup needs prompts and responses")
    started = time.perf_counter()
    rows = [(p, r) for p in prompts for r in responses]
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), width), trainer.pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    resp = torch.zeros_like(ids, dtype=torch.bool)
    for b, (p, r) in enumerate(rows):
        ids[b, : len(p) + len(r)] = torch.tensor(p + r)
        attn[b, : len(p) + len(r)] = 1
        resp[b, len(p): len(p) + len(r)] = True
    optimizer = torch.optim.AdamW(trainer.policy.parameters(), lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        pick = torch.randperm(len(rows), generator=generator)[: min(len(rows), 96)]
        logp = sequence_logprobs(trainer.policy, ids[pick], attn[pick], resp[pick])
        loss = -(logp * resp[pick]).sum() / resp[pick].sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainer.policy.parameters(), trainer.config.max_grad_norm)
        optimizer.step()
        losses.append(float(loss.detach()))
    trainer.version += 1
    metrics = {"warmup_loss_first": losses[0], "warmup_loss_last": losses[-1], "warmup_steps": steps,
               "warmup_prompts": len(prompts), "warmup_s": time.perf_counter() - started}
    trainer.store.save(trainer.policy, trainer.tokenizer, parent=trainer.version - 1, metrics=_clean(metrics),
                       extra={**trainer.metadata, **(checkpoint_extra or {}), "stage": "format_warmup"},
                       version=trainer.version)
    trainer.reference_version = trainer.version
    if trainer.reference is not None:
        trainer.reference.load_state_dict(trainer.policy.state_dict())
    return metrics


def _distinct(batch) -> int:
    return len({tuple(r[m.bool()].tolist()) for r, m in zip(batch.input_ids, batch.attention_mask)})


def unique_row_logprobs(model, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """``sequence_logprobs`` (with entropy) computed once per distinct row and gathered back: ``[B, L]`` each.

    Exact: a row's log-probs depend only on its tokens, and the gather sums the gradients of repeated rows.
    Rows repeat a lot here — the G trajectories of a group share their first prompt, and with deterministic frozen
    modules the same tool choices lead to the same later prompts — so this often halves the work or better.
    """
    ids, attn, resp = batch.input_ids, batch.attention_mask, batch.response_mask
    index: dict[tuple, int] = {}
    firsts, inverse = [], []
    for b in range(ids.shape[0]):
        n = int(attn[b].sum())
        key = (tuple(ids[b, :n].tolist()), tuple(resp[b, :n].nonzero().squeeze(-1).tolist()))
        if key not in index:
            index[key] = len(firsts)
            firsts.append(b)
        inverse.append(index[key])
    rows, back = torch.tensor(firsts), torch.tensor(inverse)
    logp, entropy = sequence_logprobs(model, ids[rows], attn[rows], resp[rows], with_entropy=True)
    return logp[back], entropy[back]


def _clean(metrics: dict) -> dict:
    return {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v) for k, v in metrics.items()}


# --- the in-process rollout driver -------------------------------------------------------------------------------


class MemoTool:
    """A tool whose results are memoised by command: for deterministic tools only (the profile's python programs
    are pure arithmetic). Saves the sandbox's process start (~0.1 s) when a group repeats a command."""

    def __init__(self, inner):
        self.inner, self.spec = inner, inner.spec
        self._cache: dict[str, ToolResult] = {}
        self.hits = self.misses = 0

    def run(self, command: str, timeout: float) -> ToolResult:
        cached = self._cache.get(command)
        if cached is not None:
            self.hits += 1
            return ToolResult(output=cached.output, error=cached.error, duration_s=0.0, meta=dict(cached.meta))
        self.misses += 1
        result = self.inner.run(command, timeout)
        if not result.error.startswith(("timeout", "unavailable")):  # only outcomes of the program itself
            self._cache[command] = result
        return result


class InProcessRollouts:
    """G trajectories per query through the real loop, planner on an EmbeddedEngine, frozen modules by profile."""

    def __init__(self, engine, tools: Sequence[str], *, profile: str = "tiny-deterministic", tools_config=None,
                 max_turns: int = 3, eval_max_turns: int = 3, temperature: float = 1.0, reward_kind: str = "math",
                 memoise: Sequence[str] = ("python",), max_time_s: float = 120.0, compact_prompt: bool = True,
                 turn_cost: float = 0.0, knowledge: Sequence[str] = ()):
        from agentflow.flow.loop import LoopConfig
        from agentflow.envs.profiles import get_profile

        self.engine, self.profile, self.reward_kind = engine, get_profile(profile), reward_kind
        self.turn_cost = turn_cost  # training rewards only: evaluation always scores the outcome alone

        def agent(turns: int, temp: float):
            return self.profile.build_agent(engine, tools, LoopConfig(max_steps=turns, max_time_s=max_time_s),
                                            planner_temperature=temp, tools_config=tools_config,
                                            compact=compact_prompt, knowledge=knowledge)

        self.train_agent = agent(max_turns, temperature)
        self.eval_agent = agent(eval_max_turns, 0.0)
        for name in memoise:  # one cache shared by both agents
            if name in self.train_agent.executor.tools:
                memo = MemoTool(self.train_agent.executor.tools[name])
                self.train_agent.executor.tools[name] = memo
                self.eval_agent.executor.tools[name] = memo

    def sync(self, model, version: int) -> None:
        """Put the trained weights into the engine and name the version its completions report."""
        with torch.no_grad():
            self.engine.model.load_state_dict(model.state_dict())
        self.engine.version = f"v{version}"

    def collect(self, tasks: Sequence, group_size: int, *, source: str = "training") -> list[dict]:
        """``group_size`` scored trajectories per task (``task.query``, ``task.answer``, ``task.id``)."""
        records = []
        for task in tasks:
            group = f"{task.id}/{uuid.uuid4().hex[:8]}"
            for _ in range(group_size):
                record = self.train_agent.solve(task.query, ground_truth=task.answer, source=source, group_id=group)
                records.append(record)
        return score_records(records, self.reward_kind, turn_cost=self.turn_cost)

    def evaluate(self, tasks: Sequence) -> dict:
        """Greedy (temperature 0) success on ``tasks``: overall, per kind, and how often the tool sequence was the
        expected one (``task.tools``)."""
        by_kind: dict[str, list[float]] = {}
        exact_tools, turns = 0, 0
        for task in tasks:
            record = score_records([self.eval_agent.solve(task.query, ground_truth=task.answer, source="eval")],
                                   self.reward_kind)[0]
            view = Record(record)
            by_kind.setdefault(task.kind, []).append(view.reward() or 0.0)  # unscored counts as a failure
            exact_tools += tuple(view.tools()) == tuple(task.tools)
            turns += len(view.turns)
        values = [v for vs in by_kind.values() for v in vs]
        return {"success": sum(values) / max(len(values), 1),
                "by_kind": {k: sum(v) / len(v) for k, v in sorted(by_kind.items())},
                "tool_sequence_match": exact_tools / max(len(tasks), 1), "turns_mean": turns / max(len(tasks), 1)}


def tool_stats(records: Sequence[dict]) -> dict:
    """Share of trajectories that used each tool first, and the mean number of turns: a cheap policy readout."""
    first: dict[str, int] = {}
    for r in records:
        tool = (Record(r).tools() or [""])[0]
        first[tool or "none"] = first.get(tool or "none", 0) + 1
    n = max(len(records), 1)
    return {"first_tool": {k: v / n for k, v in sorted(first.items())},
            "turns_mean": sum(len(Record(r).turns) for r in records) / n}


def task_batches(tasks: Sequence, per_batch: int, seed: int = 0):
    """Endless batches of ``per_batch`` tasks: shuffled passes over ``tasks``."""
    rng = random.Random(seed)
    order: list = []
    while True:
        batch = []
        while len(batch) < per_batch:
            if not order:
                order = list(tasks)
                rng.shuffle(order)
            batch.append(order.pop())
        yield batch


# --- the loop -----------------------------------------------------------------------------------------------------


def train(trainer: Trainer, fetch: Callable[[], list[dict]], *, budget_s: float | None = None,
          max_steps: int | None = None, after_step: Callable[[dict], None] | None = None) -> list[dict]:
    """Repeat ``fetch`` (scored records: an in-process driver, or a consumer) -> ``trainer.step`` -> ``after_step``
    until the wall-clock ``budget_s`` or ``max_steps`` is reached. Returns the per-step metrics."""
    if budget_s is None and max_steps is None:
        raise InvalidInput("train needs budget_s or max_steps")
    started, history = time.monotonic(), []
    while (max_steps is None or len(history) < max_steps) and (budget_s is None
                                                                or time.monotonic() - started < budget_s):
        t0 = time.monotonic()
        records = fetch()
        fetch_s = time.monotonic() - t0
        metrics = trainer.step(records)
        metrics.update(fetch_s=fetch_s, elapsed_s=time.monotonic() - started, records=len(records))
        history.append(metrics)
        if after_step:
            after_step(metrics)
    return history


def config_dict(config: TrainConfig) -> dict:
    return asdict(config)


__all__ = ["InProcessRollouts", "MemoTool", "TrainConfig", "Trainer", "config_dict", "format_warmup",
           "planner_prompts", "score_records", "task_batches", "tool_responses", "tool_stats", "train"]
