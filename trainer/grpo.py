"""Flow-GRPO math (docs/flow-grpo.md) as small pure functions over torch tensors, and its configuration.

Names used in the shapes below:

* ``G`` — trajectories in one group (one query sampled G times);
* ``B`` — rows of a training batch; one row is one planner turn (its prompt followed by its response);
* ``L`` — token positions of a row, right-padded;
* ``N`` — trajectories present in a batch (``traj_index[B]`` maps each row to one of them, ``0 .. N-1``).

Per-token tensors are aligned with ``input_ids[B, L]``: ``logp[b, p]`` is the log-probability of token
``input_ids[b, p]`` given ``input_ids[b, :p]``; ``mask[b, p]`` is true on the planner's response tokens only.

The objective, per token k of turn t of trajectory i (``ρ = π_θ / π_old``, ``A_i`` the group-normalised advantage)::

    ℓ_itk = −min(ρ·A_i, clip(ρ, 1−ε_low, 1+ε_high)·A_i) + β·KL_k3(π_θ ‖ π_ref)

aggregated by one of ``AGGREGATIONS`` ("trajectory": 1/N Σ_i 1/T_i Σ_t mean_k, the paper's; "token_mean").
What the trainer minimises is one of ``OBJECTIVES`` (Flow-GRPO, or an ablation): a credit rule from ``CREDITS``
(group rewards -> per-turn advantages) and a loss function.
``docs/flow-grpo.md`` has the derivation notes and the mapping to TRL's loss types.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, fields
from typing import Callable, Mapping, Sequence

from agentflow import cli_args
from agentflow.config import setting
from agentflow.errors import InvalidInput

if typing.TYPE_CHECKING:
    from torch import Tensor


class _Torch:
    """``torch``, imported on first use: ``GRPOConfig`` is a setting of ``agentflow train``, and building the CLI's
    flags must not cost every ``agentflow`` command torch's import (seconds)."""

    def __getattr__(self, name: str):
        import torch

        globals()["torch"] = torch
        return getattr(torch, name)


torch = _Torch()

LOG_RATIO_LIMIT = 20.0  # nats; |log ρ| beyond it is a wrong served log-prob, not drift (verl clamps the same)

# --- advantages --------------------------------------------------------------------------------------------------


def has_signal(rewards: Tensor) -> Tensor:
    """Whether each group can teach anything: at least 2 trajectories and not all rewards equal.

    ``rewards[..., G] -> bool[...]`` (the last dimension is the group).
    """
    if rewards.shape[-1] < 2:
        return torch.zeros(rewards.shape[:-1], dtype=torch.bool, device=rewards.device)
    return rewards.amax(-1) > rewards.amin(-1)


def group_advantages(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """``A_i = (R_i − mean_j R_j) / (std_j R_j + eps)`` over the last dimension: ``rewards[..., G] -> [..., G]``.

    ``std`` is the *sample* standard deviation (Bessel's correction, divides by G−1): ``torch.std``'s default, and
    what TRL's GRPO trainer (``nanstd``) and verl's GRPO estimator use. For G=2 rewards {0, 1} this gives ±0.707
    (population std would give ±1). A group without signal (see ``has_signal``) gets exact zeros.
    Integer rewards are promoted to float32; rewards must be finite.
    """
    r = rewards if rewards.is_floating_point() else rewards.to(torch.float32)
    if not bool(torch.isfinite(r).all()):
        raise InvalidInput(f"rewards must be finite, got {r.tolist()}")
    if r.shape[-1] < 2:
        return torch.zeros_like(r)
    mean = r.mean(-1, keepdim=True)
    std = r.std(-1, keepdim=True)  # correction=1 (sample std)
    adv = (r - mean) / (std + eps)
    return torch.where(has_signal(r).unsqueeze(-1), adv, torch.zeros_like(adv))


def broadcast(advantages: Tensor, turns_per_trajectory: Sequence[int]) -> Tensor:
    """Give every planner turn its trajectory's advantage: ``advantages[G], [T_1..T_G] -> [Σ T_i]``.

    Turns are laid out trajectory by trajectory (all of trajectory 0's turns, then trajectory 1's, ...).
    """
    turns = list(turns_per_trajectory)
    if advantages.dim() != 1 or advantages.shape[0] != len(turns):
        raise InvalidInput(f"broadcast needs one turn count per trajectory: {tuple(advantages.shape)} advantages, "
                           f"{len(turns)} turn counts")
    if any(t < 0 for t in turns):
        raise InvalidInput(f"turn counts must be >= 0, got {turns}")
    return torch.repeat_interleave(advantages, torch.tensor(turns, dtype=torch.long, device=advantages.device))


# --- KL ----------------------------------------------------------------------------------------------------------


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """The k3 estimator of KL(π_θ ‖ π_ref) per token: ``exp(ref − logp) − (ref − logp) − 1`` (always ≥ 0).

    Same shape in and out (``[B, L]`` in the loss). Unbiased when the tokens were sampled from π_θ.
    """
    d = ref_logp - logp
    return torch.exp(d) - d - 1


# --- aggregation modes --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Aggregation:
    """One way to turn per-token losses into a scalar: ``loss = Σ_bk weights[b,k]·ℓ[b,k] / denominator``.

    ``weights(mask[B,L], traj_index[B]) -> [B,L]`` and ``count(mask, traj_index) -> scalar`` (the denominator of
    this shard alone). Written as weights over a count so that shards of one batch (gradient accumulation,
    data-parallel ranks) reproduce the whole batch's loss exactly when each is divided by the *global* count
    (the sum of the shards' counts) and their gradients are summed.
    """

    name: str
    help: str
    weights: Callable[[Tensor, Tensor], Tensor]
    count: Callable[[Tensor, Tensor], Tensor]


def _row_tokens(mask: Tensor) -> Tensor:
    return mask.sum(-1)  # [B]


def _turns_of_row(mask: Tensor, traj_index: Tensor) -> Tensor:
    """T_i for each row's trajectory, counting rows that have at least one response token: ``[B]``."""
    live = (_row_tokens(mask) > 0).to(mask.dtype)
    turns = torch.zeros(int(traj_index.max()) + 1 if traj_index.numel() else 0, dtype=mask.dtype, device=mask.device)
    turns.index_add_(0, traj_index, live)
    return turns[traj_index]


def _trajectory_weights(mask: Tensor, traj_index: Tensor) -> Tensor:
    per_row = _row_tokens(mask).clamp(min=1) * _turns_of_row(mask, traj_index).clamp(min=1)
    return mask / per_row.unsqueeze(-1)


def _trajectory_count(mask: Tensor, traj_index: Tensor) -> Tensor:
    live = _row_tokens(mask) > 0
    return torch.unique(traj_index[live]).numel() * torch.ones((), dtype=mask.dtype, device=mask.device)


AGGREGATIONS: dict[str, Aggregation] = {
    a.name: a
    for a in (
        Aggregation("trajectory", "the paper's 1/N Σ_i 1/T_i Σ_t mean_k: every trajectory weighs the same, every "
                    "turn of it the same, every token of a turn the same", _trajectory_weights, _trajectory_count),
        Aggregation("token_mean", "Σ ℓ over all response tokens / their number: every token weighs the same",
                    lambda mask, _: mask, lambda mask, _: mask.sum()),
    )
}


def aggregation_count(mask: Tensor, traj_index: Tensor | None, aggregation: str) -> Tensor:
    """This shard's denominator for ``aggregation`` (trajectories, or response tokens): a 0-dim tensor.

    Sum it over shards (``all_reduce``) and pass the sum to ``policy_loss(denominator=...)`` for exact equivalence.
    """
    m = mask.to(torch.float32)
    return _aggregation(aggregation).count(m, _traj_index(traj_index, m))


def _aggregation(name: str) -> Aggregation:
    try:
        return AGGREGATIONS[name]
    except KeyError:
        raise InvalidInput(f"unknown aggregation {name!r}: choose one of {sorted(AGGREGATIONS)}") from None


def _traj_index(traj_index: Tensor | None, mask: Tensor) -> Tensor:
    if traj_index is None:  # every row its own trajectory
        return torch.arange(mask.shape[0], device=mask.device)
    if traj_index.shape != mask.shape[:1]:
        raise InvalidInput(f"traj_index must be [B]={tuple(mask.shape[:1])}, got {tuple(traj_index.shape)}")
    return traj_index.long()


# --- the loss -----------------------------------------------------------------------------------------------------


def policy_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, adv: Tensor, mask: Tensor, cfg,
                *, traj_index: Tensor | None = None, denominator: float | Tensor | None = None,
                entropy: Tensor | None = None, importance: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """Flow-GRPO loss of one batch (or one shard of it) and its metrics.

    Args:
        logp: ``[B, L]`` log π_θ of each token under the policy being trained (carries the gradient).
        old_logp: ``[B, L]`` log π_old under the policy that sampled it (no gradient).
        ref_logp: ``[B, L]`` log π_ref under the frozen reference, or None when ``cfg.beta == 0``.
        adv: ``[B]`` advantage of each row (its trajectory's ``A_i``).
        mask: ``[B, L]`` true/1 on response tokens; everything else is ignored (NaN there is fine).
        cfg: anything with ``eps_low``, ``eps_high``, ``beta`` and ``aggregation`` (a ``GRPOConfig``).
        traj_index: ``[B]`` trajectory of each row, for the "trajectory" aggregation; None = one row per trajectory.
            The turns of one trajectory must all be in this call (shard by whole trajectories).
        denominator: the aggregation's count over the *whole* batch when this call sees one shard of it
            (see ``aggregation_count``); None = this call's own count.
        entropy: ``[B, L]`` optional per-token entropy, reported as a metric only.
        importance: ``[B, L]`` optional per-token weight of the policy term (no gradient): the off-policy
            objectives' correction from the behaviour policy to ``old_logp`` (see ``decoupled_ppo_loss``).

    Returns ``(loss, metrics)``: the scalar to backpropagate, and floats — ``loss``, ``pg_loss`` (policy part),
    ``kl_loss`` (aggregated KL before β), ``kl`` (token mean of KL_k3), ``ratio_mean``, ``clip_frac_low``
    (ρ < 1−ε_low with A < 0: clipped, no gradient), ``clip_frac_high`` (ρ > 1+ε_high with A > 0), ``entropy``,
    ``tokens``, ``trajectories``.
    """
    if logp.shape != old_logp.shape or logp.shape != mask.shape or logp.dim() != 2:
        raise InvalidInput(f"logp, old_logp and mask must share one [B, L] shape: {tuple(logp.shape)}, "
                           f"{tuple(old_logp.shape)}, {tuple(mask.shape)}")
    if adv.shape != logp.shape[:1]:
        raise InvalidInput(f"adv must be [B]={tuple(logp.shape[:1])}, got {tuple(adv.shape)}")
    if cfg.beta and ref_logp is None:
        raise InvalidInput(f"beta={cfg.beta} needs ref_logp (pass the reference model's log-probs, or set beta=0)")
    on = mask.bool()
    m = on.to(logp.dtype)
    agg = _aggregation(cfg.aggregation)
    index = _traj_index(traj_index, m)

    # A log-ratio beyond +-LOG_RATIO_LIMIT nats is no policy drift but a served log-prob that is wrong (a faulty
    # server): clamped, that token adds a constant and no gradient, instead of an infinite loss that voids the update.
    raw_log_ratio = torch.where(on, logp - old_logp, torch.zeros_like(logp))
    log_ratio = raw_log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    a = adv.to(logp.dtype).unsqueeze(-1)  # [B, 1]
    clipped = ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high)
    pg = -torch.minimum(ratio * a, clipped * a)  # [B, L]
    if importance is not None:
        pg = pg * importance.detach().to(pg.dtype)

    weights = agg.weights(m, index)
    count = agg.count(m, index) if denominator is None else torch.as_tensor(denominator, dtype=logp.dtype)
    count = count.to(device=logp.device, dtype=logp.dtype).clamp(min=1)
    pg_loss = (weights * pg).sum() / count
    loss = pg_loss
    kl = None
    if ref_logp is not None:
        kl = torch.where(on, kl_k3(logp, ref_logp), torch.zeros_like(logp))
        kl_loss = (weights * kl).sum() / count
        if cfg.beta:
            loss = pg_loss + cfg.beta * kl_loss

    with torch.no_grad():
        tokens = m.sum()

        def token_mean(x: Tensor) -> float:
            return float((x.to(m.dtype) * m).sum() / tokens.clamp(min=1))

        metrics = {
            "loss": float(loss),
            "pg_loss": float(pg_loss),
            "ratio_mean": token_mean(ratio),
            "clip_frac_low": token_mean((ratio < 1 - cfg.eps_low) & (a < 0)),
            "clip_frac_high": token_mean((ratio > 1 + cfg.eps_high) & (a > 0)),
            "log_ratio_clamped": token_mean(raw_log_ratio.abs() > LOG_RATIO_LIMIT),
            "tokens": float(tokens),
            "trajectories": float(_trajectory_count(m, index)),
        }
        if kl is not None:
            metrics["kl"] = token_mean(kl)
            metrics["kl_loss"] = float(kl_loss)
        if entropy is not None:
            metrics["entropy"] = token_mean(entropy)
        if importance is not None:
            metrics["is_weight"] = token_mean(importance)
    return loss, metrics


def _behaviour_ratio(old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor) -> Tensor:
    """``π_old / π_behaviour`` per response token (1 elsewhere), the log-ratio clamped like the policy ratio."""
    log_w = torch.where(mask.bool(), old_logp - behaviour_logp, torch.zeros_like(old_logp))
    return torch.exp(log_w.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))


def decoupled_ppo_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, adv: Tensor, mask: Tensor, cfg,
                       *, behaviour_logp: Tensor, **kwargs) -> tuple[Tensor, dict[str, float]]:
    """AReaL's decoupled PPO for stale rollouts: the clip is around the *proximal* policy ``old_logp`` (the trainer's
    weights before this batch's updates, recomputed), not around the policy that sampled, and each token is weighted
    by ``π_prox / π_behaviour`` from ``behaviour_logp`` (what the server returned). A token whose weight exceeds
    ``cfg.is_cap`` is left out (weight 0): too far off-policy to correct for. Same arguments as ``policy_loss``
    plus ``behaviour_logp [B, L]``; metrics add ``is_weight`` and ``is_dropped`` (share of tokens left out)."""
    weight = _behaviour_ratio(old_logp, behaviour_logp, mask)
    dropped = weight > cfg.is_cap
    loss, metrics = policy_loss(logp, old_logp, ref_logp, adv, mask, cfg,
                                importance=torch.where(dropped, torch.zeros_like(weight), weight), **kwargs)
    return loss, {**metrics, "is_dropped": _token_share(dropped, mask)}


def tis_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, adv: Tensor, mask: Tensor, cfg,
             *, behaviour_logp: Tensor, **kwargs) -> tuple[Tensor, dict[str, float]]:
    """Truncated importance sampling (verl's and Agent Lightning's fix for the serving/training mismatch): the clip is
    around the recomputed ``old_logp`` and each token is weighted by ``min(π_old / π_behaviour, cfg.is_cap)``.
    Unlike ``decoupled_ppo_loss`` no token is left out; metrics add ``is_weight`` and ``is_truncated``."""
    weight = _behaviour_ratio(old_logp, behaviour_logp, mask)
    truncated = weight > cfg.is_cap
    loss, metrics = policy_loss(logp, old_logp, ref_logp, adv, mask, cfg, importance=weight.clamp(max=cfg.is_cap),
                                **kwargs)
    return loss, {**metrics, "is_truncated": _token_share(truncated, mask)}


def _token_share(flags: Tensor, mask: Tensor) -> float:
    m = mask.bool()
    return float((flags & m).sum()) / max(float(m.sum()), 1.0)


def sft_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, adv: Tensor, mask: Tensor, cfg,
             *, traj_index: Tensor | None = None, denominator: float | Tensor | None = None,
             entropy: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """The ``sft_success`` ablation's loss: negative log-likelihood of the response tokens over their count.

    Same signature as ``policy_loss`` so that an objective can name either; ``old_logp``, ``ref_logp``, ``adv``,
    ``cfg`` and ``traj_index`` are not used (the rows are already the successful trajectories' turns).
    ``denominator``: the whole batch's response-token count when this call sees one shard (None = this call's own).
    Returns ``(loss, metrics)`` with ``loss``, ``pg_loss`` (the same number), ``tokens`` and ``entropy``.
    """
    m = mask.to(logp.dtype)
    tokens = float(m.sum())
    count = m.sum() if denominator is None else torch.as_tensor(denominator, dtype=logp.dtype)
    loss = -(torch.where(mask.bool(), logp, torch.zeros_like(logp))).sum() / count.clamp(min=1)
    metrics = {"loss": float(loss.detach()), "pg_loss": float(loss.detach()), "tokens": tokens}
    if entropy is not None:
        metrics["entropy"] = float((entropy.detach() * m).sum()) / max(tokens, 1.0)
    return loss, metrics


# --- credit rules and objectives ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Credit:
    """How one group's rewards become the advantages of its trajectories' planner turns.

    ``advantages(rewards[G], eps) -> [G] | None``: each trajectory's advantage, NaN for a trajectory left out;
    None when the group teaches nothing (counted as "no signal"). ``turn(advantage, index, turns) -> float``: the
    advantage of planner turn ``index`` (0-based) of a trajectory with ``turns`` turns.
    """

    name: str
    help: str
    advantages: Callable[[Tensor, float], Tensor | None]
    turn: Callable[[float, int, int], float]


def _normalised(rewards: Tensor, eps: float) -> Tensor | None:
    return group_advantages(rewards, eps=eps) if bool(has_signal(rewards)) else None


def _successes(rewards: Tensor, eps: float) -> Tensor:
    return torch.where(rewards > 0, torch.ones_like(rewards), torch.full_like(rewards, math.nan))


CREDITS: dict[str, Credit] = {
    c.name: c
    for c in (
        Credit("broadcast", "Flow-GRPO's: the group-normalised advantage on every planner turn",
               _normalised, lambda adv, index, turns: adv),
        Credit("last_turn", "the group-normalised advantage on the final planner turn only; earlier turns get 0",
               _normalised, lambda adv, index, turns: adv if index == turns - 1 else 0.0),
        Credit("success", "advantage 1 on every turn of a trajectory with reward > 0, the others left out, no "
               "group normalisation (the rows of supervised fine-tuning on successes)",
               _successes, lambda adv, index, turns: adv),
    )
}


def credit_rule(name: str) -> Credit:
    try:
        return CREDITS[name]
    except KeyError:
        raise InvalidInput(f"credit must be one of {', '.join(CREDITS)}, got {name!r}") from None


@dataclass(frozen=True)
class Objective:
    """What the trainer minimises: a credit rule (``CREDITS``), a loss with ``policy_loss``'s signature, and the
    aggregation whose count divides it (None: the config's ``aggregation``)."""

    name: str
    help: str
    credit: str
    loss: Callable[..., tuple[Tensor, dict[str, float]]]
    aggregation: str | None = None
    proximal: bool = False  # the loss takes the recomputed log-probs as old_logp and the served ones as behaviour_logp


OBJECTIVES: dict[str, Objective] = {
    o.name: o
    for o in (
        Objective("flow_grpo", "the clipped policy loss with the advantage broadcast to every turn", "broadcast",
                  policy_loss),
        Objective("last_turn", "ablation: the clipped policy loss, the advantage on the final planner turn only",
                  "last_turn", policy_loss),
        Objective("sft_success", "ablation: supervised fine-tuning on the turns of successful trajectories (mean "
                  "negative log-likelihood per token)", "success", sft_loss, aggregation="token_mean"),
        Objective("decoupled_ppo", "off-policy Flow-GRPO (AReaL): clipped around the trainer's own log-probs, "
                  "weighted by pi_prox / pi_behaviour, tokens past is_cap left out", "broadcast", decoupled_ppo_loss,
                  proximal=True),
        Objective("tis", "off-policy Flow-GRPO with truncated importance sampling (verl): clipped around the "
                  "trainer's own log-probs, weighted by min(pi_prox / pi_behaviour, is_cap)", "broadcast", tis_loss,
                  proximal=True),
    )
}


def objective(name: str) -> Objective:
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise InvalidInput(f"objective must be one of {', '.join(OBJECTIVES)}, got {name!r}") from None


# --- configuration ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GRPOConfig:
    """Flow-GRPO settings; defaults are the AgentFlow paper's 7B-planner configuration (docs/flow-grpo.md).
    Validated on creation."""

    group_size: int = setting(8, "G: trajectories sampled per query; advantages are normalised within each group",
                              cli_args.integer(2))
    batch_trajectories: int = setting(256, "trajectories per optimizer batch (32 queries x G=8); must hold whole "
                                           "groups", cli_args.integer(1))
    lr: float = setting(1e-6, "learning rate of the planner's optimizer", cli_args.number(0, lo_open=True))
    eps_low: float = setting(0.2, "lower clip range: ratios below 1 - eps_low stop pushing down (in [0, 1))",
                             cli_args.number(0, 1, hi_open=True))
    eps_high: float = setting(0.3, "upper clip range: ratios above 1 + eps_high stop pushing up (>= 0)",
                              cli_args.number(0))
    beta: float = setting(0.001, "weight of the k3 KL penalty to the frozen reference planner (0 = no reference "
                                 "model)", cli_args.number(0))
    adv_eps: float = setting(1e-6, "added to the group's reward std before dividing (> 0)",
                             cli_args.number(0, lo_open=True))
    temperature: float = setting(1.0, "sampling temperature of training rollouts; log-probs are always taken at "
                                      "temperature 1 (raw logits), so 1.0 keeps the importance ratio exact",
                                  cli_args.number(0, lo_open=True))
    keep_flat_groups: bool = setting(False, "a group whose rewards are all equal stays in the batch at advantage 0, "
                                            "so the KL penalty pulls a policy that collapsed onto one answer back "
                                            "toward the reference (off: dropped; docs/training.md, \"Plateaus\")")
    max_planner_turns: int = setting(3, "planner turns per training rollout (evaluation uses its own, larger "
                                        "limit)", cli_args.integer(1))
    max_staleness: int | None = setting(1, "drop planner turns sampled more than this many versions before the one "
                                           "being trained (0 = on-policy only; None = keep everything)",
                                       cli_args.optional(cli_args.integer(0)))
    aggregation: str = setting("trajectory", "how per-token losses become one number: " + "; ".join(
        f"{a.name!r} = {a.help}" for a in AGGREGATIONS.values()), cli_args.names(AGGREGATIONS, one=True))
    updates_per_batch: int = setting(1, "k: optimizer updates made on each batch (ratios move away from 1 after "
                                        "the first)", cli_args.integer(1))
    is_cap: float = setting(2.0, "the decoupled_ppo and tis objectives: the largest importance weight "
                                 "pi_prox / pi_behaviour (decoupled_ppo leaves a token past it out, tis truncates it)",
                         cli_args.number(1))

    def __post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise InvalidInput(f"grpo.{message}")

        for f in fields(self):  # types first: the rules below compare numbers
            value, kind = getattr(self, f.name), _scalar_type(f)
            if value is None and _optional(f):
                continue
            if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
                need(False, f"{f.name} must be an integer, got {value!r}")
            if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
                need(False, f"{f.name} must be a finite number, got {value!r}")
            if kind is str and not isinstance(value, str):
                need(False, f"{f.name} must be a string, got {value!r}")
        need(self.group_size >= 2, f"group_size must be >= 2 (advantages compare a trajectory with its group), "
                                   f"got {self.group_size}")
        need(self.batch_trajectories >= 1, f"batch_trajectories must be >= 1, got {self.batch_trajectories}")
        need(self.batch_trajectories % self.group_size == 0,
             f"batch_trajectories: batch must hold whole groups: {self.batch_trajectories} is not a multiple of "
             f"G={self.group_size} (group_size)")
        need(self.lr > 0, f"lr must be > 0, got {self.lr}")
        need(0 <= self.eps_low < 1, f"eps_low must be in [0, 1) (the ratio's lower bound 1 - eps_low must stay "
                                    f"positive), got {self.eps_low}")
        need(self.eps_high >= 0, f"eps_high must be >= 0, got {self.eps_high}")
        need(self.beta >= 0, f"beta must be >= 0, got {self.beta}")
        need(self.adv_eps > 0, f"adv_eps must be > 0, got {self.adv_eps}")
        need(not self.keep_flat_groups or self.beta > 0,
             "keep_flat_groups needs beta > 0: a group without signal trains only on the KL penalty")
        need(self.temperature > 0, f"temperature must be > 0 for sampled rollouts, got {self.temperature}")
        need(self.max_planner_turns >= 1, f"max_planner_turns must be >= 1, got {self.max_planner_turns}")
        need(self.max_staleness is None or self.max_staleness >= 0,
             f"max_staleness must be >= 0 or None, got {self.max_staleness}")
        need(self.aggregation in AGGREGATIONS,
             f"aggregation must be one of {sorted(AGGREGATIONS)}, got {self.aggregation!r}")
        need(self.updates_per_batch >= 1, f"updates_per_batch must be >= 1, got {self.updates_per_batch}")
        need(self.is_cap >= 1, f"is_cap must be >= 1 (a weight of 1 is on-policy), got {self.is_cap}")

    @property
    def queries_per_batch(self) -> int:
        return self.batch_trajectories // self.group_size

    @classmethod
    def help(cls) -> dict[str, str]:
        """Each setting's help text, for CLI flags and docs."""
        return {f.name: f.metadata["help"] for f in fields(cls)}

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> "GRPOConfig":
        """Build from a mapping (parsed flags, a config file, ``{name: env value}``); strings are converted.

        Unknown names are an error naming them. ``"none"``/``""`` mean None for optional settings.
        """
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise InvalidInput(f"unknown grpo setting(s) {unknown}; known: {sorted(known)}")
        kwargs = {}
        for name, raw in values.items():
            f = known[name]
            if isinstance(raw, str):
                kind = _scalar_type(f)
                text = raw.strip()
                if _optional(f) and text.lower() in ("", "none", "null"):
                    kwargs[name] = None
                    continue
                try:
                    kwargs[name] = kind(text) if kind is not int else int(text, 10)
                except ValueError:
                    raise InvalidInput(f"grpo.{name} must be {kind.__name__}, got {raw!r}") from None
            else:
                kwargs[name] = raw
        return cls(**kwargs)


def _hints() -> dict:
    return typing.get_type_hints(GRPOConfig)


def _optional(f) -> bool:
    return type(None) in typing.get_args(_hints()[f.name])


def _scalar_type(f) -> type:
    hint = _hints()[f.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint

