"""``policy_loss`` against TRL's GRPO loss on identical tensors (TRL is a test-only dependency).

TRL computes the loss inside ``GRPOTrainer._compute_loss(self, model, inputs)``, a method that reads settings from
``self`` and takes the per-token log-probs from ``self._get_per_token_logps_and_entropies(model, ...)``. Building a
real trainer needs a model, a dataset and reward functions, so the test calls the *unbound* method on a small
namespace holding exactly the attributes that method reads, with a ``_get_per_token_logps_and_entropies`` that
returns our tensors. Everything between the log-probs and the scalar loss is TRL's own code.

Mapping (TRL's names -> ours; the clip, the ratio and k3 KL are the same formulas):

* ``loss_type="grpo"`` (per-sequence token mean, then mean over sequences) == ``"trajectory"`` when every row is
  its own trajectory; for multi-turn trajectories ``"trajectory"`` == the mean over trajectories of TRL "grpo" on
  each trajectory's rows (checked below).
* ``loss_type="bnpo"`` (token mean over the batch) == ``"token_mean"``; so is ``"dapo"`` with
  ``num_items_in_batch`` = the batch's response tokens (its normaliser across processes and accumulation steps,
  our ``denominator``).
* ``loss_type="dr_grpo"`` divides by B x max_completion_length, a constant: no equivalent here (skipped).
* ``epsilon`` -> ``eps_low``, ``epsilon_high`` -> ``eps_high``, ``beta`` -> ``beta``;
  ``importance_sampling_level="token"``; TRL's clip fractions (``clip_ratio/low_mean``, ``high_mean``) are ours.
* Advantages: TRL normalises with ``nanstd`` (sample std, Bessel) and ``+ 1e-4``: ``group_advantages(eps=1e-4)``.
"""

from __future__ import annotations

import os
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

try:
    import trl.trainer.grpo_trainer as trl_grpo
except ImportError:  # a test-only dependency: skipped locally without it, a failure in CI (which installs it)
    if os.environ.get("CI"):
        pytest.fail("TRL is not installed; CI installs the test extra", pytrace=False)
    pytest.skip("TRL is a test-only dependency: pip install trl", allow_module_level=True)
from trl.trainer.utils import nanstd  # noqa: E402

from agentflow.trainer.grpo import GRPOConfig, group_advantages, policy_loss  # noqa: E402

TOL = 1e-6
B, L = 6, 7


class _Accelerator:
    num_processes = 1

    def reduce(self, x, reduction="sum"):
        return x

    def gather(self, x):
        return x

    gather_for_metrics = gather


def trl_loss(loss_type: str, logp, old, ref, adv, mask, *, eps_low, eps_high, beta, num_items=None):
    """TRL's loss and metrics for these tensors: ``GRPOTrainer._compute_loss`` on a minimal namespace."""
    this = SimpleNamespace(
        loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high, beta=beta,
        importance_sampling_level="token", top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        aux_loss_enabled=False, use_vllm=False, vllm_importance_sampling_correction=False,
        _entropy_bonus_enabled=False, current_gradient_accumulation_steps=1, max_completion_length=L,
        model=SimpleNamespace(training=True), accelerator=_Accelerator(),
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
    )
    inputs = {"prompt_ids": torch.zeros(logp.shape[0], 0, dtype=torch.long),
              "prompt_mask": torch.zeros(logp.shape[0], 0, dtype=torch.long),
              "completion_ids": torch.zeros(logp.shape, dtype=torch.long), "completion_mask": mask,
              "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref}
    if num_items is not None:
        inputs["num_items_in_batch"] = torch.tensor(float(num_items))
    loss = trl_grpo.GRPOTrainer._compute_loss(this, None, inputs)
    return loss, {k: v[-1] for k, v in this._metrics["train"].items()}


def tensors(seed: int):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, L, generator=g) * 3
    logp = (old + torch.randn(B, L, generator=g) * 0.6).clamp(max=0)  # ratios well outside [0.8, 1.3] too
    ref = (old + torch.randn(B, L, generator=g) * 0.3).clamp(max=0)
    lengths = torch.tensor([7, 3, 1, 5, 6, 2])
    mask = (torch.arange(L)[None] < lengths[:, None]).to(torch.long)  # ragged, right-padded responses
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.0])
    adv = group_advantages(rewards.view(2, 3), eps=1e-4).view(-1)
    return logp, old, ref, adv, mask


def both(ours_aggregation, trl_type, seed, *, beta=0.04, eps_low=0.2, eps_high=0.3, traj_index=None,
         denominator=None, num_items=None):
    logp, old, ref, adv, mask = tensors(seed)
    cfg = GRPOConfig(eps_low=eps_low, eps_high=eps_high, beta=beta, aggregation=ours_aggregation)
    ours_logp = logp.clone().requires_grad_(True)
    ours, metrics = policy_loss(ours_logp, old, ref, adv, mask, cfg, traj_index=traj_index, denominator=denominator)
    ours.backward()
    theirs_logp = logp.clone().requires_grad_(True)
    theirs, trl_metrics = trl_loss(trl_type, theirs_logp, old, ref, adv, mask, eps_low=eps_low, eps_high=eps_high,
                                   beta=beta, num_items=num_items)
    theirs.backward()
    return ours, theirs, ours_logp.grad, theirs_logp.grad, metrics, trl_metrics


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("ours_aggregation, trl_type", [("trajectory", "grpo"), ("token_mean", "bnpo")])
def test_loss_gradient_and_metrics_equal_trl(ours_aggregation, trl_type, beta, seed):
    ours, theirs, g_ours, g_theirs, m, tm = both(ours_aggregation, trl_type, seed, beta=beta)
    assert abs(float(ours.detach()) - float(theirs.detach())) <= TOL
    assert (g_ours - g_theirs).abs().max() <= TOL
    assert m["clip_frac_low"] == pytest.approx(tm["clip_ratio/low_mean"], abs=TOL)
    assert m["clip_frac_high"] == pytest.approx(tm["clip_ratio/high_mean"], abs=TOL)
    assert m["clip_frac_low"] > 0 and m["clip_frac_high"] > 0  # the tensors exercise both clips
    if beta:
        assert m["kl"] == pytest.approx(tm["kl"], abs=TOL)


def test_symmetric_clip_equals_trl_default_epsilon():
    ours, theirs, g_ours, g_theirs, *_ = both("token_mean", "bnpo", 3, eps_low=0.2, eps_high=0.2)
    assert abs(float(ours.detach()) - float(theirs.detach())) <= TOL and (g_ours - g_theirs).abs().max() <= TOL


def test_token_mean_with_a_global_denominator_equals_trl_dapo():
    # dapo divides by num_items_in_batch (the response tokens of the whole generation batch, all processes)
    logp, old, ref, adv, mask = tensors(4)
    n = int(mask.sum()) + 17  # as if other shards held 17 more tokens
    ours, theirs, g_ours, g_theirs, *_ = both("token_mean", "dapo", 4, denominator=n, num_items=n)
    assert abs(float(ours.detach()) - float(theirs.detach())) <= TOL and (g_ours - g_theirs).abs().max() <= TOL


def test_multi_turn_trajectory_mean_is_the_mean_of_trl_grpo_per_trajectory():
    logp, old, ref, adv, mask = tensors(5)
    traj = torch.tensor([0, 0, 0, 1, 2, 2])  # 3 trajectories with 3, 1 and 2 turns
    adv = adv[[0, 0, 0, 3, 4, 4]]  # every turn of a trajectory carries its advantage
    cfg = GRPOConfig(beta=0.04, aggregation="trajectory")
    ours, _ = policy_loss(logp, old, ref, adv, mask, cfg, traj_index=traj)
    per_trajectory = [trl_loss("grpo", logp[traj == i], old[traj == i], ref[traj == i], adv[traj == i],
                               mask[traj == i], eps_low=0.2, eps_high=0.3, beta=0.04)[0] for i in range(3)]
    assert abs(float(ours) - float(torch.stack(per_trajectory).mean())) <= TOL
    # and it is not TRL "grpo" over the rows (that weighs the 3-turn trajectory 3 times as much)
    flat, _ = trl_loss("grpo", logp, old, ref, adv, mask, eps_low=0.2, eps_high=0.3, beta=0.04)
    assert abs(float(ours) - float(flat)) > 1e-3


def test_dr_grpo_has_no_equivalent():
    pytest.skip("TRL dr_grpo divides by B x max_completion_length (a constant); Flow-GRPO defines no such mode")


def test_group_advantages_equal_trl_normalisation():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.2, 0.9, 0.4, 0.4], [3.0, 3.0, 3.0, 3.0]])
    mean = rewards.mean(1, keepdim=True)
    trl_adv = (rewards - mean) / (nanstd(rewards, dim=1).unsqueeze(1) + 1e-4)  # TRL's scale_rewards="group"
    assert (group_advantages(rewards, eps=1e-4) - trl_adv).abs().max() <= TOL
