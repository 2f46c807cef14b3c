"""Trajectory records (``agentflow/domain/trajectory.schema.json``) -> Flow-GRPO training tensors.

What is trained: the planner's **action turns**, ``record["turns"][t]["planner"]`` — one row per turn, its prompt
token ids followed by its response token ids, with the loss on the response tokens only. The planner's one-off query
analysis (``record["analysis_call"]``) is *not* trained: Flow-GRPO's unit is the planner's decision a_t at each
turn, T_i counts those turns, and the analysis is context that every one of those prompts already contains.
Executor, verifier and generator calls are frozen modules and never become rows.

``build_batch`` goes, in order:

1. dedupe by ``trajectory_id`` (delivery is at-least-once), group by ``group_id`` (an empty group id is a group of
   its own: traffic without a group cannot be compared with anything);
2. reward per trajectory (``Record.reward``: one precedence over the sources, see ``agentflow.domain.trajectory``); a
   group with an unscored trajectory is dropped (``groups_unscored``);
3. group advantages over the group's trajectories; a group with no signal (every reward equal) is dropped
   (``groups_no_signal``), or with ``keep_flat`` kept at advantage 0 (``groups_kl_only``: the KL penalty is then its
   only gradient);
4. per planner turn: skip it when it has no prompt or response token ids, when it is longer than ``max_length``, or
   when it is stale (``parse_version``: sampled more than ``max_staleness`` versions before ``current_version``).
   Advantages are computed before this filter, over the whole group: every reward is a valid sample of the group's
   baseline, whichever version produced it;
5. right-padded tensors, one row per kept turn.

Log-probs are aligned with ``input_ids``: ``old_logp[b, p]`` is log π_old(input_ids[b, p] | input_ids[b, :p]),
the engine's logprob of that response token (raw logits, temperature 1 — what vLLM and the embedded engine report).
Where the served logprobs are absent (or do not match the tokens), the row is flagged in ``old_logp_missing`` and
``fill_old_logprobs`` recomputes them with ``sequence_logprobs``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Iterable, Sequence

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from agentflow.errors import InvalidInput
from agentflow.domain.trajectory import REWARD_PRECEDENCE, Record
from agentflow.trainer.grpo import credit_rule
from agentflow.versions import parse_version


# --- the batch ----------------------------------------------------------------------------------------------------


@dataclass
class BatchStats:
    """What ``build_batch`` kept and dropped, for metrics and logs."""

    records: int = 0
    duplicates: int = 0
    groups: int = 0
    groups_kept: int = 0
    groups_no_signal: int = 0
    groups_kl_only: int = 0  # groups without signal kept at advantage 0 (keep_flat)
    groups_unscored: int = 0
    turns_kept: int = 0
    turns_stale: int = 0
    turns_unversioned: int = 0
    turns_without_tokens: int = 0
    turns_too_long: int = 0
    rows_missing_logprobs: int = 0
    reward_mean: float = 0.0  # over every scored trajectory, kept or not
    #: kept turns by staleness (versions between the one that sampled a turn and the one being trained)
    turns_by_staleness: dict[int, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class TrainBatch:
    """B rows (planner turns) of L positions, ready for ``sequence_logprobs`` and ``policy_loss``."""

    input_ids: Tensor  # [B, L] long, prompt + response, right-padded with pad_id
    attention_mask: Tensor  # [B, L] long, 1 on real tokens
    response_mask: Tensor  # [B, L] bool, True on the planner's response tokens only
    old_logp: Tensor  # [B, L] float32, served logprobs at response positions, 0 elsewhere
    old_logp_missing: Tensor  # [B] bool, rows whose old_logp must be recomputed (fill_old_logprobs)
    advantages: Tensor  # [B] float32, the row's trajectory's A_i
    traj_index: Tensor  # [B] long, 0..N-1: the row's trajectory (rows of a trajectory are contiguous)
    versions: list  # [B] parsed policy version of each row (int | None)
    trajectory_ids: list[str]  # [N]
    rewards: Tensor  # [N] float32, R_i of each trajectory with rows in the batch
    stats: BatchStats = field(default_factory=BatchStats)
    groups: list[str] = field(default_factory=list)  # [N] the group of each trajectory

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_trajectories(self) -> int:
        return len(self.trajectory_ids)

    @property
    def num_tokens(self) -> int:
        return int(self.response_mask.sum())

    def select_trajectories(self, trajectories: Iterable[int]) -> "TrainBatch":
        """The rows of some trajectories (indices into ``trajectory_ids``), renumbered 0..n-1, padding trimmed."""
        keep = sorted(set(int(t) for t in trajectories))
        if not keep:
            return _empty(self.stats)
        new_index = torch.full((self.num_trajectories,), -1, dtype=torch.long)
        new_index[keep] = torch.arange(len(keep))
        rows = (new_index[self.traj_index] >= 0).nonzero().squeeze(-1)
        width = int(self.attention_mask[rows].sum(-1).max())
        return replace(
            self,
            input_ids=self.input_ids[rows, :width], attention_mask=self.attention_mask[rows, :width],
            response_mask=self.response_mask[rows, :width], old_logp=self.old_logp[rows, :width],
            old_logp_missing=self.old_logp_missing[rows], advantages=self.advantages[rows],
            traj_index=new_index[self.traj_index[rows]], versions=[self.versions[int(r)] for r in rows],
            trajectory_ids=[self.trajectory_ids[t] for t in keep], rewards=self.rewards[keep],
            groups=[self.groups[t] for t in keep] if self.groups else [],
        )

    def micro_batches(self, max_rows: int, max_tokens: int = 0) -> list["TrainBatch"]:
        """Consecutive whole trajectories packed into shards of at most ``max_rows`` rows and, when ``max_tokens`` >
        0, at most that many padded tokens (rows x the longest row); a trajectory over either limit alone gets a
        shard of its own. Keeping trajectories whole keeps the "trajectory" aggregation exact when each shard is
        divided by the whole batch's count."""
        if max_rows < 1 or max_tokens < 0:
            raise InvalidInput(f"max_rows must be >= 1 and max_tokens >= 0, got {max_rows} and {max_tokens}")
        rows_per = torch.bincount(self.traj_index, minlength=self.num_trajectories).tolist()
        longest = torch.zeros(self.num_trajectories, dtype=torch.long).scatter_reduce(
            0, self.traj_index, self.attention_mask.sum(-1), reduce="amax").tolist()
        shards, current, size, width = [], [], 0, 0
        for t, (n, w) in enumerate(zip(rows_per, longest)):
            over_tokens = max_tokens and (size + n) * max(width, w) > max_tokens
            if current and (size + n > max_rows or over_tokens):
                shards.append(current)
                current, size, width = [], 0, 0
            current.append(t)
            size, width = size + n, max(width, w)
        if current:
            shards.append(current)
        return [self.select_trajectories(s) for s in shards]

    def to(self, device) -> "TrainBatch":
        """The tensors on ``device`` (the lists and stats stay as they are)."""
        moved = {f: getattr(self, f).to(device) for f in ("input_ids", "attention_mask", "response_mask", "old_logp",
                                                          "old_logp_missing", "advantages", "traj_index", "rewards")}
        return replace(self, **moved)


def _empty(stats: BatchStats) -> TrainBatch:
    return TrainBatch(
        input_ids=torch.zeros(0, 0, dtype=torch.long), attention_mask=torch.zeros(0, 0, dtype=torch.long),
        response_mask=torch.zeros(0, 0, dtype=torch.bool), old_logp=torch.zeros(0, 0),
        old_logp_missing=torch.zeros(0, dtype=torch.bool), advantages=torch.zeros(0),
        traj_index=torch.zeros(0, dtype=torch.long), versions=[], trajectory_ids=[], rewards=torch.zeros(0),
        stats=stats,
    )


def build_batch(records: Iterable[dict], *, pad_id: int, current_version=None, max_staleness: int | None = None,
                adv_eps: float = 1e-6, max_length: int | None = None, credit: str = "broadcast",
                min_version: int = 0, reward_sources: Sequence[str] | None = None,
                reward_precedence: tuple[str, ...] = REWARD_PRECEDENCE, keep_flat: bool = False) -> TrainBatch:
    """Training rows from trajectory records (see the module docstring for every rule).

    ``current_version`` is the version of the weights being trained (anything ``parse_version`` reads); the
    staleness filter runs only when both it and ``max_staleness`` are given, and then drops turns of unknown version.
    ``min_version`` also drops turns sampled before that version (with filtering on): the trainer passes its
    reference version, since a format warm-up moves the policy too far for an importance ratio to bridge.
    ``credit`` names a rule of ``grpo.CREDITS``: Flow-GRPO's ``broadcast`` (the group advantage on every planner
    turn) or one of the ablations: ``last_turn`` (only the final turn gets it; earlier turns get 0) and ``success``
    (every turn of a trajectory with reward > 0 gets advantage 1, the others are dropped, no group normalisation:
    the rows of supervised fine-tuning on successes). ``reward_sources`` limits ``Record.reward`` to those sources.
    ``keep_flat`` keeps a group (of 2 or more) whose rewards are all equal, every trajectory at advantage 0.
    """
    rule = credit_rule(credit)
    stats = BatchStats()
    current = parse_version(current_version) if current_version is not None else None
    if current_version is not None and current is None:
        raise InvalidInput(f"current_version {current_version!r} is not a version (e.g. 3 or 'v3')")
    filtering = current is not None and max_staleness is not None

    groups: dict[str, list[dict]] = {}
    seen: set[str] = set()
    for record in records:
        stats.records += 1
        tid = record["trajectory_id"]
        if tid in seen:
            stats.duplicates += 1
            continue
        seen.add(tid)
        groups.setdefault(record.get("group_id") or f"\0{tid}", []).append(record)
    stats.groups = len(groups)

    scored: list[float] = []
    rows: list[tuple[list[int], list[int], list[float] | None, float, int, int | None]] = []
    trajectory_ids: list[str] = []
    rewards: list[float] = []
    trajectory_groups: list[str] = []
    for group_id, members in groups.items():
        group_rewards = [Record(r).reward(reward_sources, reward_precedence) for r in members]
        scored += [r for r in group_rewards if r is not None]
        if any(r is None for r in group_rewards):
            stats.groups_unscored += 1
            continue
        advantages = rule.advantages(torch.tensor(group_rewards, dtype=torch.float64), adv_eps)
        if advantages is None and keep_flat and len(members) >= 2:
            stats.groups_kl_only += 1
            advantages = torch.zeros(len(members), dtype=torch.float64)
        elif advantages is None:
            stats.groups_no_signal += 1
            continue
        kept_members = [(m, r, a) for m, r, a in zip(members, group_rewards, advantages.tolist()) if not math.isnan(a)]
        if not kept_members:
            continue
        stats.groups_kept += 1
        for record, reward, adv in kept_members:
            kept = 0
            calls = Record(record).planner_calls()
            for index, call in enumerate(calls):
                prompt, response = call.get("prompt_token_ids") or [], call.get("token_ids") or []
                if not prompt or not response:
                    stats.turns_without_tokens += 1
                    continue
                if max_length is not None and len(prompt) + len(response) > max_length:
                    stats.turns_too_long += 1
                    continue
                version = parse_version(call.get("model_version", ""))
                if filtering:
                    if version is None:
                        stats.turns_unversioned += 1
                        continue
                    if current - version > max_staleness or version < min_version:
                        stats.turns_stale += 1
                        continue
                if current is not None and version is not None:
                    stale = current - version
                    stats.turns_by_staleness[stale] = stats.turns_by_staleness.get(stale, 0) + 1
                logprobs = call.get("logprobs") or []
                turn_adv = rule.turn(adv, index, len(calls))
                rows.append((prompt, response, logprobs if len(logprobs) == len(response) else None, turn_adv,
                             len(trajectory_ids), version))
                kept += 1
            if kept:
                trajectory_ids.append(record["trajectory_id"])
                rewards.append(reward)
                trajectory_groups.append(group_id)
    stats.reward_mean = sum(scored) / len(scored) if scored else 0.0
    stats.turns_kept = len(rows)
    if not rows:
        return _empty(stats)

    width = max(len(p) + len(r) for p, r, *_ in rows)
    B = len(rows)
    input_ids = torch.full((B, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(B, width, dtype=torch.long)
    response_mask = torch.zeros(B, width, dtype=torch.bool)
    old_logp = torch.zeros(B, width, dtype=torch.float32)
    missing = torch.zeros(B, dtype=torch.bool)
    for b, (prompt, response, logprobs, _, _, _) in enumerate(rows):
        n, m = len(prompt), len(response)
        input_ids[b, : n + m] = torch.tensor(prompt + response)
        attention_mask[b, : n + m] = 1
        response_mask[b, n: n + m] = True
        if logprobs is None:
            missing[b] = True
        else:
            old_logp[b, n: n + m] = torch.tensor(logprobs, dtype=torch.float32)
    stats.rows_missing_logprobs = int(missing.sum())
    return TrainBatch(
        input_ids=input_ids, attention_mask=attention_mask, response_mask=response_mask, old_logp=old_logp,
        old_logp_missing=missing, advantages=torch.tensor([r[3] for r in rows], dtype=torch.float32),
        traj_index=torch.tensor([r[4] for r in rows], dtype=torch.long), versions=[r[5] for r in rows],
        trajectory_ids=trajectory_ids, rewards=torch.tensor(rewards, dtype=torch.float32), stats=stats,
        groups=trajectory_groups,
    )


# --- log-probs from a model ---------------------------------------------------------------------------------------


def sequence_logprobs(model, input_ids: Tensor, attention_mask: Tensor, response_mask: Tensor,
                      *, with_entropy: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """log π(input_ids[b, p] | input_ids[b, :p]) at every response position: ``[B, L]`` float32, 0 elsewhere.

    Raw logits (temperature 1). Gradients flow unless the caller wraps it in ``torch.no_grad()``. A transformers
    causal LM (or peft model) goes through ``ResponseLogProbs``: the vocabulary projection of response positions
    only, by chunks. Any other module returning ``.logits`` (a test model, a DDP wrapper) gets one full log-softmax.
    ``with_entropy`` also returns the policy's entropy at those positions ``[B, L]`` (detached, for metrics).
    """
    if input_ids.shape != attention_mask.shape or input_ids.shape != response_mask.shape:
        raise InvalidInput("input_ids, attention_mask and response_mask must share one [B, L] shape")
    if not isinstance(model, ResponseLogProbs) and ResponseLogProbs.supports(model):
        model = ResponseLogProbs(model)
    if isinstance(model, ResponseLogProbs):
        logp, entropy = model(input_ids, attention_mask, response_mask, with_entropy=with_entropy)
    else:
        logp, entropy = _full_logprobs(model, input_ids, attention_mask, response_mask.bool())
    return (logp, entropy) if with_entropy else logp


class ResponseLogProbs(torch.nn.Module):
    """A causal LM's log-probs of its response tokens without ``[rows, T, vocab]`` logits.

    The decoder's last hidden states are gathered at the positions that predict a response token (``[K, H]``, K
    the response tokens of the batch), then projected through the LM head ``chunk_tokens`` rows at a time with a
    float32 log-sum-exp. In a backward pass each chunk is recomputed (``torch.utils.checkpoint``), so the peak holds
    one chunk's ``[chunk_tokens, vocab]`` logits whatever the batch. As a module it is also the root that FSDP2
    shards (``placement``): the LM head and embeddings stay gathered for every chunk of one forward. Inputs move to
    the model's device; ``autocast`` (a dtype) runs the model under ``torch.autocast`` (bf16 compute on one process).
    """

    def __init__(self, lm, chunk_tokens: int = 512, autocast: torch.dtype | None = None):
        super().__init__()
        if chunk_tokens < 1:
            raise InvalidInput(f"chunk_tokens must be >= 1, got {chunk_tokens}")
        self.lm, self.chunk_tokens, self.autocast = lm, chunk_tokens, autocast

    @staticmethod
    def supports(model) -> bool:
        """A transformers-style causal LM: a decoder and an output projection, no final logit soft-capping."""
        try:
            head, decoder = model.get_output_embeddings(), model.get_decoder()
        except (AttributeError, NotImplementedError, ValueError):
            return False
        config = getattr(model, "config", None)
        return head is not None and decoder is not None and not getattr(config, "final_logit_softcapping", None)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, response_mask: Tensor, *,
                with_entropy: bool = False) -> tuple[Tensor, Tensor]:
        head = self.lm.get_output_embeddings()
        device = head.weight.device
        input_ids, attention_mask, response_mask = (t.to(device) for t in (input_ids, attention_mask, response_mask))
        if self.autocast is None:
            return self._logprobs(head, input_ids, attention_mask, response_mask, with_entropy)
        with torch.autocast(device.type, dtype=self.autocast):
            return self._logprobs(head, input_ids, attention_mask, response_mask, with_entropy)

    def _logprobs(self, head, input_ids: Tensor, attention_mask: Tensor, response_mask: Tensor,
                  with_entropy: bool) -> tuple[Tensor, Tensor]:
        B, L = input_ids.shape
        logp = torch.zeros(B, L, dtype=torch.float32, device=input_ids.device)
        entropy = torch.zeros_like(logp)
        rows, cols = response_mask.bool().nonzero(as_tuple=True)
        if rows.numel() == 0:
            return logp, entropy
        if int(cols.min()) == 0:
            raise InvalidInput("a response token at position 0 has no prefix to condition on")
        hidden = self.lm.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        states, targets = hidden[rows, cols - 1], input_ids[rows, cols]  # the state at p - 1 predicts token p
        parts, entropies = [], []
        for start in range(0, states.shape[0], self.chunk_tokens):
            chunk = (states[start: start + self.chunk_tokens], targets[start: start + self.chunk_tokens])
            if torch.is_grad_enabled():
                lp, ent = checkpoint(_chunk_logprobs, head, *chunk, with_entropy, use_reentrant=False)
            else:
                lp, ent = _chunk_logprobs(head, *chunk, with_entropy)
            parts.append(lp)
            entropies.append(ent)
        logp = logp.index_put((rows, cols), torch.cat(parts))
        if with_entropy:
            entropy[rows, cols] = torch.cat(entropies)
        return logp, entropy


def _chunk_logprobs(head, states: Tensor, targets: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor]:
    logits = head(states).float()
    norm = logits.logsumexp(-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - norm
    if not with_entropy:
        return logp, logp.new_zeros(())
    with torch.no_grad():
        return logp, norm - (logits.softmax(-1) * logits).sum(-1)


def _full_logprobs(model, input_ids: Tensor, attention_mask: Tensor, resp: Tensor) -> tuple[Tensor, Tensor]:
    """One forward and a full float32 log-softmax: for modules that only return ``.logits``."""
    B, L = input_ids.shape
    logp = torch.zeros(B, L, dtype=torch.float32, device=input_ids.device)
    entropy = torch.zeros_like(logp)
    columns = resp.any(0).nonzero()
    if columns.numel() == 0:
        return logp, entropy
    first = int(columns[0])
    if first == 0:
        raise InvalidInput("a response token at position 0 has no prefix to condition on")
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, first - 1: -1].float()
    norm = logits.logsumexp(-1)
    lp = logits.gather(-1, input_ids[:, first:].unsqueeze(-1)).squeeze(-1) - norm
    logp = torch.where(resp, torch.cat([logp[:, :first], lp], dim=1), torch.zeros_like(logp))
    with torch.no_grad():
        ent = norm - (logits.softmax(-1) * logits).sum(-1)
        entropy[:, first:] = torch.where(resp[:, first:], ent, torch.zeros_like(ent))
    return logp, entropy


@torch.no_grad()
def fill_old_logprobs(batch: TrainBatch, model) -> TrainBatch:
    """Recompute ``old_logp`` for the rows flagged in ``old_logp_missing`` with ``model`` (the sampling version's
    weights when the trainer still holds them, else the pre-update policy: then the first update is on-policy)."""
    rows = batch.old_logp_missing.nonzero().squeeze(-1)
    if rows.numel() == 0:
        return batch
    recomputed = sequence_logprobs(model, batch.input_ids[rows], batch.attention_mask[rows],
                                   batch.response_mask[rows])
    old = batch.old_logp.clone()
    old[rows] = recomputed.to(old.device, old.dtype)
    return replace(batch, old_logp=old, old_logp_missing=torch.zeros_like(batch.old_logp_missing))
