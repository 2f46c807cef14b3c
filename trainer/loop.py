"""The Flow-GRPO trainer step (docs/training.md).

One step, as a short function of trajectory records (``Trainer.step``)::

    records (scored)  ->  build_batch (groups, advantages broadcast to turns, staleness filter)
                      ->  fill_old_logprobs (where the served ones are missing)
                      ->  reference log-probs (frozen copy of the starting planner)
                      ->  k inner updates: micro-batches of whole trajectories, loss / global count, summed grads,
                          grad clipping, AdamW, LR schedule
                      ->  checkpoint (safetensors + tokenizer + metadata) as the next version in the model store
                      ->  metrics

Records are plain trajectory dicts (``agentflow/domain/trajectory.schema.json``), so a Kafka consumer of
``trajectories`` can feed ``Trainer.step`` the same way the in-process driver does: ``score_records``
(``agentflow.rewards``) adds the rule reward against each record's ``ground_truth`` where it is missing.

The benches' in-process rollout driver and training loop are ``bench/_harness.py``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import torch

from agentflow.errors import InvalidInput
from agentflow.domain.trajectory import REWARD_PRECEDENCE
from agentflow.trainer import behaviour
from agentflow.trainer.batch import TrainBatch, build_batch, fill_old_logprobs, sequence_logprobs
from agentflow.trainer.checkpoint import ModelStore
from agentflow.trainer.distributed import shard_trajectories
from agentflow.trainer.grpo import OBJECTIVES, GRPOConfig, aggregation_count, objective
from agentflow.trainer.logprobs import distinct_rows, unique_row_logprobs
from agentflow.trainer.lora import EXPORTS, LoraConfig
from agentflow.trainer.metrics import flops_per_token, mfu
from agentflow.trainer.init import load_placement
from agentflow.trainer.placement import Placement, World, join_world, peak_memory, resolve_device, resolve_dtype
from agentflow.versions import version_name

log = logging.getLogger(__name__)
RESUME = "resume"  # in a version folder: torch.distributed.checkpoint of trainable weights, optimizer, schedule
LEGACY_TRAINER_STATE = "trainer_state.pt"  # the optimizer state of versions written before RESUME (read only)


# --- configuration ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser and bookkeeping settings around the Flow-GRPO objective (``grpo``)."""

    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    micro_batch_rows: int = 256  # gradient accumulation: planner turns per forward/backward
    micro_batch_tokens: int = 0  # ... and at most this many padded tokens per forward/backward (0: no limit)
    device: str = ""  # "" = cuda when available, else cpu
    dtype: str = ""  # "" = bfloat16 on cuda, float32 on cpu (placement.py: the mixed-precision scheme)
    gradient_checkpointing: bool = False  # recompute decoder layers in backward instead of keeping activations
    peak_tflops: float = 0.0  # one device's peak (TFLOP/s, e.g. 989 for an H100/H200 in bf16): the mfu metric; 0: none
    # sharded: only rank 0 reads the checkpoint, the others get their shards by broadcast (trainer/init.py); False
    # makes every rank load the whole model before sharding (the old path: bench/lean_init.py's baseline)
    lean_init: bool = True
    lora: LoraConfig = field(default_factory=LoraConfig)  # rank 0 = full-parameter
    export: str = "adapter"  # with LoRA, what a version holds: the adapter folder, or merged weights
    logit_chunk_tokens: int = 512  # response tokens per chunk through the LM head (batch.ResponseLogProbs)
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0  # linear LR warm-up over optimizer updates, then constant
    max_length: int | None = 4096  # longer planner turns are dropped (counted in turns_too_long)
    keep_last: int | None = None  # checkpoints kept in the store (besides v0); None keeps every version
    save_optimizer_state: bool = True  # each version's resume/: trainable weights, AdamW and schedule state
    keep_resume: int = 2  # versions that keep their resume/ (the newest; 0: all): a restart needs only the newest
    reward_kind: str = "math"  # agentflow.rewards kind that scores records against their ground truth
    # a name in grpo.OBJECTIVES: tis (off-policy corrected; flow_grpo's loss on on-policy rows), flow_grpo,
    # decoupled_ppo, or an ablation (last_turn, sft_success); docs/training.md "The default objective"
    objective: str = "tis"
    reward_sources: tuple[str, ...] | None = None  # Record.reward's sources (None: all, by precedence)
    reward_precedence: tuple[str, ...] = REWARD_PRECEDENCE  # RATINGS_FIRST: ratings outrank the rule
    # the served log-probs against the trainer's own (trainer/behaviour.py): a group whose mean |delta| per token is
    # over this many nats is quarantined; 0 measures only; None skips the check (and its forward pass)
    behaviour_bound: float | None = 0.2

    def __post_init__(self) -> None:
        if self.micro_batch_rows < 1:
            raise InvalidInput(f"train.micro_batch_rows must be >= 1, got {self.micro_batch_rows}")
        if not self.max_grad_norm > 0:
            raise InvalidInput(f"train.max_grad_norm must be > 0, got {self.max_grad_norm}")
        if self.warmup_steps < 0 or self.weight_decay < 0:
            raise InvalidInput("train.warmup_steps and train.weight_decay must be >= 0")
        if self.keep_last is not None and self.keep_last < 1:
            raise InvalidInput(f"train.keep_last must be >= 1 or None, got {self.keep_last}")
        if self.keep_resume < 0:
            raise InvalidInput(f"train.keep_resume must be >= 0, got {self.keep_resume}")
        if self.objective not in OBJECTIVES:
            raise InvalidInput(f"train.objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.export not in EXPORTS:
            raise InvalidInput(f"train.export must be one of {', '.join(EXPORTS)}, got {self.export!r}")
        if self.micro_batch_tokens < 0 or self.logit_chunk_tokens < 1:
            raise InvalidInput("train.micro_batch_tokens must be >= 0 and train.logit_chunk_tokens >= 1")


# --- the trainer --------------------------------------------------------------------------------------------------


class Trainer:
    """Owns the planner being trained (``placement``), its frozen reference, the optimizer and the model store.

    On start it resumes from the store's newest version (weights, and the optimizer from its ``resume`` state); an
    empty store gets the starting model as version 0. Under torchrun every rank builds one (``world``): all of them
    call ``step`` with the same records, each trains on its share of the trajectories, rank 0 writes the versions.
    """

    def __init__(self, model_dir: str | Path, store: ModelStore, config: TrainConfig = TrainConfig(), *,
                 metadata: dict | None = None, seed: int = 0, world: World | None = None):
        from transformers import AutoTokenizer

        from agentflow.llm.models import load_causal_lm

        torch.manual_seed(seed)
        self.config, self.store, self.metadata = config, store, dict(metadata or {})
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.world = world if world is not None else join_world(self.device)
        if self.world.sharded and store.fs is not None and os.environ.get("LOCAL_WORLD_SIZE") != str(self.world.size):
            raise InvalidInput(f"training across nodes needs a model store on a filesystem that every node mounts "
                               f"(a ReadWriteMany volume), not {store.uri}: each rank writes its share of a version")
        lora = config.lora
        latest = store.latest()
        if latest is None:
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
            if self.world.main:
                dtype = _dtype_name(self.dtype)  # the versions' serving dtype: bfloat16 on GPUs, half of float32
                latest = store.save(load_causal_lm(model_dir, dtype=dtype), self.tokenizer, parent=None,
                                    extra={**self.metadata, "base_model": str(model_dir), "export": "full",
                                           "dtype": dtype})
            self.world.barrier()
            latest = store.latest()
        self.version = latest.version
        self.tokenizer = AutoTokenizer.from_pretrained(latest.path)
        # the reference is where RL started: the format warm-up's version if there was one, else version 0
        warmed = [v for v in store.versions() if store.get(v).metadata.get("stage") == "format_warmup"]
        self.reference_version = warmed[-1] if warmed else 0
        self.in_service: frozenset[int] = frozenset()  # versions the rollout controller serves: never pruned
        weights = store.get(self.reference_version if lora.enabled else self._weights_version(latest))
        loaded = "float32" if not lora.enabled else _dtype_name(self.dtype)  # what trains stays float32
        placed = {"device": self.device, "dtype": self.dtype, "world": self.world, "lean": config.lean_init,
                  "chunk_tokens": config.logit_chunk_tokens}
        self.placement = load_placement(weights.path, loaded=loaded, lora=lora,
                                        gradient_checkpointing=config.gradient_checkpointing, **placed)
        self.policy = self.placement.lm
        # global sizes (a sharded parameter's shape is the whole tensor's)
        self.flops_per_token = flops_per_token(sum(math.prod(p.shape) for p in self.policy.parameters()),
                                               sum(math.prod(p.shape) for p in self.placement.parameters()))
        self.reference = None
        if config.grpo.beta > 0 and not lora.enabled:  # LoRA's reference is its base, adapters disabled
            self.reference = load_placement(store.get(self.reference_version).path, loaded=_dtype_name(self.dtype),
                                            frozen=True, **placed)
        g = config.grpo
        self.optimizer = torch.optim.AdamW(self.placement.parameters(), lr=g.lr, betas=config.adam_betas,
                                           weight_decay=config.weight_decay)
        warm = config.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda n: min(1.0, (n + 1) / warm) if warm else 1.0)
        self._resume(latest)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def _weights_version(self, latest) -> int:
        """The newest version whose folder holds full weights (an adapter version's base is further back)."""
        for version in reversed(self.store.versions()):
            if version <= latest.version and self.store.get(version).metadata.get("export", "full") != "adapter":
                return version
        raise InvalidInput(f"model store {self.store.uri} has no version with full weights")

    def _resume(self, latest) -> None:
        """Trainable weights, optimizer and schedule from the newest version's ``resume`` state, if it has one."""
        import torch.distributed.checkpoint as dcp

        folder = latest.path / RESUME
        if folder.is_dir():
            self._check_resumable(latest)
            state = {**self.placement.resume_state(self.optimizer), "scheduler": self.scheduler.state_dict()}
            dcp.load(state, checkpoint_id=str(folder))
            self.placement.load_resume_state(self.optimizer, state)
            self.scheduler.load_state_dict(state["scheduler"])
        elif (latest.path / LEGACY_TRAINER_STATE).is_file() and not self.world.sharded:
            saved = torch.load(latest.path / LEGACY_TRAINER_STATE, weights_only=True)
            self.optimizer.load_state_dict(saved["optimizer"])
            self.scheduler.load_state_dict(saved["scheduler"])
        elif self.config.lora.enabled and latest.version > self.reference_version:
            raise InvalidInput(f"version {latest.version} has no {RESUME}/ state: its LoRA adapters cannot be "
                               "trained further (start a new store from a merged version)")

    def _check_resumable(self, latest) -> None:
        """The saved state holds the trainable weights only: a full-weight trainer cannot resume from LoRA adapters,
        nor LoRA from full weights or from adapters of another rank or on other modules."""
        saved = _trainable_shape(latest.metadata.get("lora"))
        wanted = _trainable_shape(self.config.lora.describe() if self.config.lora.enabled else None)
        if saved != wanted:
            raise InvalidInput(f"version {latest.version} in {self.store.uri} was trained with {saved}, and this "
                               f"trainer trains {wanted}: give the same LoRA settings, or a new model store")

    def step(self, records: Sequence[dict], *, checkpoint_extra: dict | None = None,
             checkpoint_files: dict[str, bytes] | None = None) -> dict:
        """One Flow-GRPO step on scored records; returns its metrics (``skipped`` when nothing was trainable).
        ``checkpoint_extra`` goes into the new version's metadata (a consumer's offsets, for resuming),
        ``checkpoint_files`` into its folder (rank 0's). Every rank of a sharded trainer calls it with the same
        records."""
        g, started = self.config.grpo, time.perf_counter()
        batch = build_batch(records, pad_id=self.pad_id, current_version=self.version,
                            max_staleness=g.max_staleness, adv_eps=g.adv_eps, max_length=self.config.max_length,
                            credit=objective(self.config.objective).credit, min_version=self.reference_version,
                            reward_sources=self.config.reward_sources,
                            reward_precedence=self.config.reward_precedence, keep_flat=g.keep_flat_groups)
        metrics: dict = {"version": self.version, "reward": batch.stats.reward_mean,
                         **{f"batch_{k}": v for k, v in batch.stats.as_dict().items()}}
        if len(batch) == 0:  # every group without signal (or unscored, or stale): nothing to learn from
            return {**metrics, "skipped": True, **peak_memory(self.device), "step_s": time.perf_counter() - started}
        metrics.update(self._updates(batch))
        if metrics.get("skipped"):  # every group quarantined: the served log-probs are not this policy's
            return {**metrics, **peak_memory(self.device), "step_s": time.perf_counter() - started}
        metrics["update_s"] = time.perf_counter() - started
        metrics["tokens_per_s"] = float(batch.attention_mask.sum()) * g.updates_per_batch / metrics["update_s"]
        if self.config.peak_tflops > 0:
            metrics["mfu"] = mfu(self.flops_per_token, metrics["tokens_per_s"], self.config.peak_tflops,
                                 self.world.size)
        self.version += 1
        metrics["version"] = self.version
        checkpoint = self._checkpoint(metrics, checkpoint_extra, checkpoint_files)
        if checkpoint is not None:
            metrics["checkpoint"] = str(checkpoint.path)
        metrics.update(peak_memory(self.device))  # this rank's, since it started
        metrics["step_s"] = time.perf_counter() - started
        return metrics

    def _updates(self, batch: TrainBatch) -> dict:
        """k optimizer updates on ``batch``: this rank's trajectories in micro-batches, each loss divided by the
        whole batch's count so that the gradients summed over micro-batches and ranks are the batch's gradient;
        clipping; AdamW; the schedule."""
        g, world = self.config.grpo, self.world
        target = objective(self.config.objective)
        mine = batch.select_trajectories(shard_trajectories(batch.num_trajectories, world.rank, world.size))
        shards = [s.to(self.device) for s in mine.micro_batches(self.config.micro_batch_rows,
                                                                self.config.micro_batch_tokens)]
        shards += [None] * (world.max(len(shards)) - len(shards))  # every rank runs as many passes as the others
        checked: dict = {}
        with torch.no_grad():
            if bool(batch.old_logp_missing.any()):  # the same batch on every rank: all of them take this branch
                shards = [self._fill_old_logprobs(s) for s in shards]
            prox = [None] * len(shards)
            if target.proximal or self.config.behaviour_bound is not None:
                prox = [self._policy_logprobs(s) for s in shards]
            if self.config.behaviour_bound is not None:
                verdict = self._check_behaviour(batch, shards, prox)
                checked = verdict.metrics
                if len(verdict.quarantined) == batch.num_trajectories:
                    return {**checked, "skipped": True}
                shards = [_without(s, verdict.quarantined, batch.trajectory_ids) for s in shards]
                batch = _without(batch, verdict.quarantined, batch.trajectory_ids)
            refs = [self._reference_logprobs(s) if g.beta > 0 else None for s in shards]
        denominator = aggregation_count(batch.response_mask, batch.traj_index,
                                        target.aggregation or g.aggregation).to(self.device)
        # token-weighted metrics, tokens, the loss, then this rank's distinct rows: summed over ranks
        weighted = _WEIGHTED + (_OFF_POLICY if target.proximal else ())
        sums = torch.zeros(len(weighted) + 3, dtype=torch.float64)
        sums[-1] = sum(distinct_rows(s) for s in shards if s is not None)
        grad_norms: list[float] = []
        nonfinite = 0
        for _ in range(g.updates_per_batch):
            self.optimizer.zero_grad(set_to_none=True)
            for i, (shard, ref, proximal) in enumerate(zip(shards, refs, prox)):
                self.placement.sync_gradients(i == len(shards) - 1)
                if shard is None:
                    self._idle_pass()
                    continue
                logp, entropy = unique_row_logprobs(self.placement.root, shard)
                old, extra = shard.old_logp, {}
                if target.proximal:  # clipped around the trainer's own log-probs, weighted from the served ones
                    old, extra = proximal, {"behaviour_logp": shard.old_logp}
                loss, m = target.loss(logp, old, ref, shard.advantages, shard.response_mask, g,
                                      traj_index=shard.traj_index, denominator=denominator, entropy=entropy, **extra)
                loss.backward()
                sums[:-1] += torch.tensor([m.get(k, 0.0) * m["tokens"] for k in weighted] + [m["tokens"], m["loss"]],
                                          dtype=torch.float64)
            norm = self.placement.clip_grad_norm(self.config.max_grad_norm)
            if not math.isfinite(norm):
                # a non-finite loss or gradient (e.g. an importance ratio exp(logp - old_logp) that overflowed):
                # skip this update rather than write NaN into the weights and Adam's moments
                self.optimizer.zero_grad(set_to_none=True)
                nonfinite += 1
                continue
            grad_norms.append(norm)
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)  # the gradients' memory is free between steps
        if world.sharded:
            torch.distributed.all_reduce(sums, group=world.control)
        tokens = max(float(sums[-3]), 1.0)
        out = {k: float(sums[i]) / tokens for i, k in enumerate(weighted)}
        finite = grad_norms or [float("nan")]
        out.update(loss=float(sums[-2]) / g.updates_per_batch, grad_norm=sum(finite) / len(finite),
                   grad_norm_max=max(finite), nonfinite_updates=nonfinite, lr=self.scheduler.get_last_lr()[0],
                   rows=len(batch), unique_rows=int(sums[-1]),
                   trajectories=batch.num_trajectories, response_tokens=batch.num_tokens, ranks=world.size)
        return {**checked, **out}

    def _policy_logprobs(self, shard: TrainBatch | None) -> torch.Tensor | None:
        """The current weights' log-probs of a shard (no gradient): the proximal policy, and the check's side."""
        if shard is None:
            return self._idle_pass()
        return unique_row_logprobs(self.placement.root, shard)[0]

    def _check_behaviour(self, batch: TrainBatch, shards: list, prox: list) -> behaviour.Verdict:
        """Served against recomputed log-probs for every rank's rows (gathered when sharded: one verdict for all)."""
        index = {tid: i for i, tid in enumerate(batch.trajectory_ids)}
        rows = []  # (abs_sum, tokens, seq_kl, trajectory in the batch, staleness)
        for shard, logp in zip(shards, prox):
            if shard is None:
                continue
            found = behaviour.row_mismatch(logp.cpu(), shard.old_logp.cpu(), shard.response_mask.cpu(),
                                           shard.old_logp_missing.cpu())
            for b in range(len(shard)):
                version = shard.versions[b]
                rows.append((float(found.abs_sum[b]), float(found.tokens[b]), float(found.seq_kl[b]),
                             index[shard.trajectory_ids[int(shard.traj_index[b])]],
                             None if version is None else self.version - version))
        if self.world.sharded:
            gathered = [None] * self.world.size
            torch.distributed.all_gather_object(gathered, rows, group=self.world.control)
            rows = [row for part in gathered for row in part]
        column = list(zip(*rows)) if rows else [()] * 5
        stats = behaviour.RowMismatch(*(torch.tensor(c, dtype=torch.float64) for c in column[:3]))
        groups = batch.groups or [f"\0{t}" for t in batch.trajectory_ids]
        return behaviour.check(stats, torch.tensor(column[3], dtype=torch.long), groups, list(column[4]),
                               self.config.behaviour_bound)

    def _fill_old_logprobs(self, shard: TrainBatch | None) -> TrainBatch | None:
        """Served log-probs where a row has none: the pre-update policy's (then the first update is on-policy).
        Sharded, a rank with nothing to recompute still runs a pass, as the others do."""
        if shard is None or (self.world.sharded and not bool(shard.old_logp_missing.any())):
            self._idle_pass()
            return shard
        return fill_old_logprobs(shard, self.placement.root)

    def _reference_logprobs(self, shard: TrainBatch | None) -> torch.Tensor | None:
        placement = self.reference or self.placement  # LoRA's reference: the policy with its adapters disabled
        with self.placement.adapters_disabled() if self.reference is None else contextlib.nullcontext():
            if shard is None:
                return self._idle_pass(placement)
            return unique_row_logprobs(placement.root, shard)[0]

    def _idle_pass(self, placement: Placement | None = None) -> None:
        """A forward (and, with gradients on, a backward) of one token with no effect: a rank with fewer
        micro-batches than the others still joins FSDP's gathers of every pass."""
        ids = torch.full((1, 2), self.pad_id, dtype=torch.long)
        logp = sequence_logprobs((placement or self.placement).root, ids, torch.ones_like(ids),
                                 torch.tensor([[False, True]]))
        if torch.is_grad_enabled():
            (logp.sum() * 0.0).backward()

    def serving_weights(self) -> dict[str, torch.Tensor] | None:
        """The plain model's weights as served (adapters merged), on rank 0; every rank must call it."""
        full = self.placement.full_state_dict()
        return None if full is None else self.placement.serving_state_dict(full)

    def _checkpoint(self, metrics: dict, extra: dict | None = None, files: dict[str, bytes] | None = None):
        """The new version: its serving weights (or adapter) and, for resuming, a distributed checkpoint of the
        trainable weights, optimizer and schedule; old versions pruned. Collective; rank 0 writes the folder."""
        import torch.distributed.checkpoint as dcp

        full = self.placement.full_state_dict()
        staging = self.store.cache / f".{RESUME}-{version_name(self.version)}"
        if self.world.main:
            shutil.rmtree(staging, ignore_errors=True)  # left by a crash
        self.world.barrier()
        if self.config.save_optimizer_state:
            state = {**self.placement.resume_state(self.optimizer), "scheduler": self.scheduler.state_dict()}
            dcp.save(state, checkpoint_id=str(staging))
        self.world.barrier()

        def move_resume(folder: Path) -> None:
            if staging.is_dir():
                staging.rename(folder / RESUME)

        checkpoint = None
        if self.world.main:
            model, weights = self._export(full)
            checkpoint = self.store.save(model, self.tokenizer, parent=self.version - 1, state_dict=weights,
                                         metrics=rounded_metrics(metrics), version=self.version,
                                         extra={**self.metadata, **self._export_metadata(), **(extra or {})},
                                         write_extra=move_resume, files=files)
            if self.config.keep_last:
                self.store.prune(self.config.keep_last, keep=(0, self.reference_version, *self.in_service))
            if self.config.keep_resume:
                self.store.drop_folder(RESUME, self.config.keep_resume)
        self.world.barrier()
        return checkpoint

    def _export(self, full: dict) -> tuple:
        """(model whose save_pretrained writes the version, the weights it writes)."""
        lm = self.placement.lm
        if not self.config.lora.enabled:
            return lm, self.placement.serving_state_dict(full)
        if self.config.export == "merged":
            return lm.get_base_model(), self.placement.serving_state_dict(full)
        lm.peft_config["default"].base_model_name_or_path = self.store.get(self.reference_version).uri
        return lm, full

    def _export_metadata(self) -> dict:
        lora = self.config.lora
        if not lora.enabled:
            return {"export": "full", "dtype": _dtype_name(self.dtype)}
        meta = {"export": self.config.export, "dtype": _dtype_name(self.dtype), "lora": lora.describe()}
        if self.config.export == "adapter":
            meta["base_uri"] = self.store.get(self.reference_version).uri
        return meta


_WEIGHTED = ("pg_loss", "kl", "ratio_mean", "clip_frac_low", "clip_frac_high", "log_ratio_clamped", "entropy")
_OFF_POLICY = ("is_weight", "is_dropped", "is_truncated")  # the proximal objectives' importance-weight metrics


def _without(batch: TrainBatch | None, quarantined: set[int], ids: list[str]) -> TrainBatch | None:
    """``batch`` with the response tokens of the quarantined trajectories (indices into ``ids``) masked out: their
    rows stay in place, so every rank's shards and their log-probs stay aligned, and they count for nothing."""
    if batch is None or not quarantined:
        return batch
    out = {ids[t] for t in quarantined}
    rows = torch.tensor([batch.trajectory_ids[int(t)] in out for t in batch.traj_index], dtype=torch.bool,
                        device=batch.response_mask.device)
    return replace(batch, response_mask=batch.response_mask & ~rows.unsqueeze(-1))


def _trainable_shape(lora: dict | None) -> str:
    """What the resume state holds, from a version's ``lora`` metadata: full weights or adapters of a rank on modules."""
    if not lora:
        return "full weights"
    targets = lora.get("targets")
    return f"LoRA rank {lora.get('rank')} on {targets if isinstance(targets, str) else ','.join(sorted(targets or []))}"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def rounded_metrics(metrics: dict) -> dict:
    """Finite floats to 6 decimals: how metrics go into a version's metadata."""
    return {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v) for k, v in metrics.items()}


__all__ = ["TrainConfig", "Trainer", "rounded_metrics"]
