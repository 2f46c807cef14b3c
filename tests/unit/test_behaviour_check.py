"""The proof of the sampling version (``agentflow.trainer.behaviour``): served against recomputed log-probs, per row
and per group, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from agentflow.trainer.behaviour import check, row_mismatch


def test_row_mismatch_by_hand():
    prox = torch.tensor([[0.0, -1.0, -2.0], [-1.0, -1.0, 0.0], [-3.0, -3.0, -3.0]])
    served = torch.tensor([[0.0, -1.5, -1.0], [-1.0, -0.5, 9.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)  # row 1's last token is padding
    rows = row_mismatch(prox, served, mask, torch.tensor([False, False, True]))  # row 2 has no served log-probs
    assert rows.abs_sum.tolist() == [1.5, 0.5, 0.0] and rows.tokens.tolist() == [2.0, 2.0, 0.0]
    k3 = lambda d: math.exp(d) - d - 1  # noqa: E731 - KL(behaviour || prox), d = prox - served
    assert rows.seq_kl.tolist() == pytest.approx([k3(0.5) + k3(-1.0), k3(0.0) + k3(-0.5), 0.0])


def test_a_group_past_the_bound_on_its_on_policy_rows_is_quarantined_whole():
    # group a: trajectories 0, 1 (0.1 and 0.3 nats per token, on-policy: mean 0.2); group b: 2 (0.1, on-policy) and
    # 3 (2.9, on-policy: mean 1.5); group c: 4 (3.0, but 2 versions old: drift, not judged)
    served = torch.tensor([[0.1, 0.1], [0.3, 0.3], [0.1, 0.1], [2.9, 2.9], [3.0, 3.0]])
    rows = row_mismatch(torch.zeros(5, 2), served, torch.ones(5, 2, dtype=torch.bool), torch.zeros(5, dtype=torch.bool))
    verdict = check(rows, torch.arange(5), ["a", "a", "b", "b", "c"], [0, 0, 0, 0, 2], bound=1.0)
    assert verdict.quarantined == {2, 3} and verdict.groups_quarantined == 1
    assert verdict.metrics["behaviour_abs"] == pytest.approx((0.2 + 0.6 + 0.2 + 5.8 + 6.0) / 10)
    assert verdict.metrics["behaviour_abs_s0"] == pytest.approx((0.2 + 0.6 + 0.2 + 5.8) / 8)
    assert verdict.metrics["behaviour_abs_s2"] == pytest.approx(3.0)
    assert verdict.metrics["trajectories_quarantined"] == 2
    measured = check(rows, torch.arange(5), ["a", "a", "b", "b", "c"], [0, 0, 0, 0, 2], bound=0.0)
    assert measured.quarantined == set() and measured.metrics["behaviour_abs"] == verdict.metrics["behaviour_abs"]


def test_nothing_to_check_quarantines_nothing():
    rows = row_mismatch(torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool),
                        torch.tensor([True]))
    verdict = check(rows, torch.tensor([0]), ["a"], [0], bound=0.01)
    assert verdict.quarantined == set() and verdict.metrics == {"behaviour_tokens": 0.0}
