"""Proof of the sampling version: the log-probs a server returned with each rollout, against the trainer's own.

Before it updates on a batch the trainer recomputes every response token's log-prob under its current weights
(``π_prox``). Where a row's turn was sampled by the version being trained (staleness 0), the two differ only by
numerics (bf16 against fp32, batching, kernels): a few hundredths of a nat per token at most. A server that sampled
from other weights than the version it named (an adapter that never loaded, a wrong folder) differs by more. Rows of
older versions also differ by the policy's drift since, which says nothing about the server: they are measured,
not judged.

``check(...)`` measures per row and decides per group from its on-policy rows: a group whose mean |Δ log-prob| per
token there is over ``bound`` is quarantined (kept on the topic, not trained on, counted). Pure: tensors in, numbers
out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True)
class RowMismatch:
    """Per row ``[B]``: the summed |Δ log-prob| over its checked response tokens, their count, and the sequence-level
    KL(π_behaviour ‖ π_prox) (k3 estimator summed over the row's tokens: ≥ 0, exact in expectation over samples)."""

    abs_sum: Tensor
    tokens: Tensor
    seq_kl: Tensor


def row_mismatch(prox: Tensor, served: Tensor, mask: Tensor, served_missing: Tensor) -> RowMismatch:
    """``prox, served [B, L]`` log-probs, ``mask [B, L]`` response tokens, ``served_missing [B]`` rows without served
    log-probs (nothing to check: 0 tokens)."""
    on = mask.bool() & ~served_missing.bool().unsqueeze(-1)
    delta = torch.where(on, prox.double() - served.double(), torch.zeros_like(prox, dtype=torch.float64))
    k3 = torch.where(on, torch.exp(delta.clamp(max=20.0)) - delta - 1, torch.zeros_like(delta))
    return RowMismatch(abs_sum=delta.abs().sum(-1), tokens=on.sum(-1).double(), seq_kl=k3.sum(-1))


@dataclass
class Verdict:
    quarantined: set[int] = field(default_factory=set)  # trajectory indices (0..N-1) not to train on
    groups_quarantined: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


def check(rows: RowMismatch, traj_index: Tensor, groups: list[str], staleness: list[int | None],
          bound: float) -> Verdict:
    """Decide per group (``groups [N]``: the group of each trajectory) from the on-policy rows (``staleness [B]`` 0, in
    versions; None: unknown) of all its trajectories (``traj_index [B]``). ``bound`` <= 0 measures only. Metrics: ``behaviour_abs`` (mean |Δ| per checked token), ``behaviour_abs_s{k}`` (the same over rows k
    versions old), ``behaviour_seq_kl`` (mean per checked row), ``behaviour_tokens``, ``groups_quarantined``,
    ``trajectories_quarantined``."""
    verdict = Verdict()
    checked = rows.tokens > 0
    tokens = float(rows.tokens.sum())
    verdict.metrics["behaviour_tokens"] = tokens
    if tokens == 0:
        return verdict
    verdict.metrics["behaviour_abs"] = float(rows.abs_sum.sum()) / tokens
    verdict.metrics["behaviour_seq_kl"] = float(rows.seq_kl[checked].mean())
    for lag in sorted({s for s in staleness if s is not None}):
        picked = torch.tensor([s == lag for s in staleness]) & checked
        if bool(picked.any()):
            verdict.metrics[f"behaviour_abs_s{lag}"] = float(rows.abs_sum[picked].sum() / rows.tokens[picked].sum())
    if bound > 0:
        n, judged = len(groups), torch.tensor([s == 0 for s in staleness], dtype=torch.float64)
        per_traj_abs = torch.zeros(n, dtype=torch.float64).index_add_(0, traj_index, rows.abs_sum * judged)
        per_traj_tokens = torch.zeros(n, dtype=torch.float64).index_add_(0, traj_index, rows.tokens * judged)
        by_group: dict[str, list[int]] = {}
        for t, group in enumerate(groups):
            by_group.setdefault(group, []).append(t)
        for members in by_group.values():
            group_tokens = float(per_traj_tokens[members].sum())
            if group_tokens and float(per_traj_abs[members].sum()) / group_tokens > bound:
                verdict.quarantined.update(members)
                verdict.groups_quarantined += 1
    verdict.metrics["groups_quarantined"] = float(verdict.groups_quarantined)
    verdict.metrics["trajectories_quarantined"] = float(len(verdict.quarantined))
    return verdict
