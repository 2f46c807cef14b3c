"""The sequential test of the rollout controller: the confidence sequence against the paper's formula, its
coverage under continuous monitoring, the decision rule, and its error rates and sample sizes by simulation
(agentflow/rollout/simulate.py runs many rollouts at once through the controller's own decision code)."""

import math

import numpy as np
import pytest

from agentflow.rollout.policy import CANARY, PAIRING_BUFFER, STABLE, Arms, Policy, decide
from agentflow.rollout.simulate import ArmModel, simulate
from agentflow.rollout.stats import ConfidenceSequence

ALPHA = 0.05


def reference_bounds(xs, alpha):
    """PrPl-EB written out from Waudby-Smith & Ramdas (2023), Theorem 2, one sample at a time (plain floats)."""
    log_term = math.log(2 / alpha)
    mu_hats, sum_x, sum_sq = [0.5], 0.0, 0.0  # mu_hat_0 = 1/2
    sigma2_prev = 0.25  # sigma2_0 = 1/4
    sum_lam = sum_lam_x = sum_pen = 0.0
    lower, upper, out = 0.0, 1.0, []
    for t, x in enumerate(xs, start=1):
        lam = min(math.sqrt(2 * log_term / (sigma2_prev * t * math.log(1 + t))), 0.5)
        v = 4 * (x - mu_hats[-1]) ** 2
        psi_e = (-math.log(1 - lam) - lam) / 4
        sum_lam += lam
        sum_lam_x += lam * x
        sum_pen += v * psi_e
        sum_x += x
        mu_hats.append((0.5 + sum_x) / (t + 1))
        sum_sq += (x - mu_hats[-1]) ** 2
        sigma2_prev = (0.25 + sum_sq) / (t + 1)
        center, radius = sum_lam_x / sum_lam, (log_term + sum_pen) / sum_lam
        lower, upper = max(lower, min(1, max(0, center - radius))), min(upper, min(1, max(0, center + radius)))
        out.append((lower, upper))
    return out


def test_confidence_sequence_is_the_papers_formula():
    rng = np.random.default_rng(3)
    xs = list(rng.beta(2, 5, size=300))
    cs = ConfidenceSequence(ALPHA)
    for x, (lower, upper) in zip(xs, reference_bounds(xs, ALPHA)):
        cs.update(x)
        assert float(cs.lower) == pytest.approx(lower, abs=1e-12)
        assert float(cs.upper) == pytest.approx(upper, abs=1e-12)
    assert float(cs.mean) == pytest.approx(np.mean(xs))
    assert 0 < float(cs.lower) < np.mean(xs) < float(cs.upper) < 1


def test_vectorised_streams_equal_separate_ones():
    rng = np.random.default_rng(4)
    data = rng.random((200, 5))
    mask = rng.random((200, 5)) < 0.6
    together = ConfidenceSequence(ALPHA, (5,))
    apart = [ConfidenceSequence(ALPHA) for _ in range(5)]
    for row, row_mask in zip(data, mask):
        together.update(row, row_mask)
        for i in np.flatnonzero(row_mask):
            apart[i].update(row[i])
    assert np.allclose(together.lower, [float(c.lower) for c in apart])
    assert np.allclose(together.upper, [float(c.upper) for c in apart])
    assert np.array_equal(together.n, mask.sum(axis=0))


@pytest.mark.parametrize("p", [0.05, 0.5])
def test_coverage_holds_under_continuous_monitoring_where_a_naive_interval_fails(p):
    """2,000 streams of 2,000 Bernoulli(p) samples, the interval looked at after every sample: the share of
    streams where it ever misses p stays under alpha; a fixed-sample 95 % interval looked at the same way misses in
    a large share of streams."""
    rng = np.random.default_rng(5)
    streams, length = 2000, 2000
    cs = ConfidenceSequence(ALPHA, (streams,))
    ever_missed = np.zeros(streams, dtype=bool)
    samples = (rng.random((length, streams)) < p).astype(float)
    for x in samples:
        cs.update(x)
        ever_missed |= (cs.lower > p) | (cs.upper < p)
    assert ever_missed.mean() <= ALPHA

    t = np.arange(1, length + 1)[:, None]
    mean = np.cumsum(samples, axis=0) / t
    half = 1.96 * np.sqrt(np.maximum(mean * (1 - mean), 1e-12) / t)
    naive_missed = (np.abs(mean - p) > half)[30:].any(axis=0)  # from 30 samples on, as a t-test user might
    assert naive_missed.mean() > 3 * ALPHA


def arms_with(canary, stable, alpha=ALPHA):
    """Arms fed with lists of (reward, error_rate, latency_norm) per arm, alternating."""
    arms = Arms(alpha)
    for c, s in zip(canary, stable):
        arms.add(CANARY, *c)
        arms.add(STABLE, *s)
    return arms


def test_decision_gates_and_reasons():
    policy = Policy(min_samples=30, reward_margin=0.1, timeout_s=100)
    good = [(1.0, 0.0, 0.1)] * 29
    arms = arms_with(good, good)
    d = decide(arms, policy, step_samples=29, step_elapsed_s=0)
    assert d.action == "hold" and d.reason == "waiting for 30 trajectories per arm (canary 29, stable 29)"
    arms = arms_with([(None, 0.0, 0.1)] * 40, [(None, 0.0, 0.1)] * 40)
    d = decide(arms, policy, step_samples=40, step_elapsed_s=0)
    assert d.reason == "waiting for 30 rewarded trajectories per arm (canary 0, stable 0)"
    assert decide(arms, policy, step_samples=40, step_elapsed_s=100).action == "rollback"  # timeout
    arms = arms_with([(0.0, 0.0, 0.1)] * 60, [(1.0, 0.0, 0.1)] * 60)
    d = decide(arms, policy, step_samples=60, step_elapsed_s=0)
    assert d.action == "rollback" and d.reason.startswith("reward lower by more than 0.1")
    assert [c.verdict for c in d.comparisons] == ["worse", "undecided", "undecided"]


def test_promotion_needs_every_metric_proven_and_enough_samples_in_the_step():
    policy = Policy(min_samples=30, reward_margin=0.1, timeout_s=float("inf"))
    rng = np.random.default_rng(6)
    rows = [(1.0, 0.0, float(x)) for x in rng.uniform(0.05, 0.1, 1500)]
    arms = arms_with(rows, rows)
    assert decide(arms, policy, step_samples=29, step_elapsed_s=0).reason == (
        "waiting for 30 canary trajectories in this step (29)")
    d = decide(arms, policy, step_samples=30, step_elapsed_s=0)
    assert d.action == "promote"
    assert {c.metric: c.verdict for c in d.comparisons} == {
        "reward": "non_inferior", "error_rate": "non_inferior", "latency": "better"}


def test_rewards_pair_oldest_first_and_late_rewards_join_their_arm():
    arms = Arms(ALPHA)
    for reward in (1.0, 1.0, 0.0):
        arms.add(CANARY, reward, 0.0, 0.1)
    arms.add(STABLE, 0.0, 0.0, 0.1)
    arms.add(STABLE, None, 0.0, 0.1)  # no reward yet: nothing to pair
    assert int(arms.paired.n) == 1 and float(arms.paired.sum_x) == 1.0  # (1 - 0 + 1) / 2
    arms.add_reward(STABLE, 1.0)
    arms.add_reward(STABLE, 1.0)
    assert int(arms.paired.n) == 3 and float(arms.paired.sum_x) == 1.5  # then (1 - 1 + 1) / 2 and (0 - 1 + 1) / 2
    assert int(arms.samples(STABLE)) == 2 and int(arms.rewarded(STABLE)) == 3


def test_a_full_pairing_buffer_drops_its_oldest_reward():
    arms = Arms(ALPHA)
    for _ in range(10):
        arms.add(CANARY, 0.0, 0.0, 0.1)
    for _ in range(PAIRING_BUFFER):
        arms.add(CANARY, 1.0, 0.0, 0.1)
    arms.add(STABLE, 1.0, 0.0, 0.1)
    assert float(arms.paired.sum_x) == 0.5  # paired with a 1, the oldest kept: the ten 0s were dropped


def test_the_paired_sequence_narrows_the_reward_bounds_of_arms_with_equal_traffic():
    rng = np.random.default_rng(8)
    paired, unpaired = Arms(ALPHA), Arms(ALPHA, paired=False)
    for c, s in rng.random((400, 2)) < 0.6:
        for arms in (paired, unpaired):
            arms.add(CANARY, float(c), 0.0, 0.1)
            arms.add(STABLE, float(s), 0.0, 0.1)
    width = {}
    for name, arms in (("paired", paired), ("unpaired", unpaired)):
        lo, hi = arms.reward_difference()
        width[name] = float(hi - lo)
    assert width["paired"] < 0.8 * width["unpaired"], width  # observed: 0.26 against 0.40
    lo, hi = paired.reward_difference()
    assert lo < 0 < hi


# --- error rates and sample sizes by simulation ---------------------------------------------------------------------
# min_samples 100 and a reward margin of 0.1 keep these to seconds; `python -m agentflow.rollout.simulate` prints the
# same table for the defaults (docs/rollout.md).

POLICY = Policy(min_samples=100, reward_margin=0.1, alpha=ALPHA, timeout_s=float("inf"))
ROLLOUTS = 400


def test_equal_arms_are_rarely_rolled_back():
    result = simulate(POLICY, ArmModel(), ArmModel(), rollouts=ROLLOUTS, max_trajectories=3000, seed=11)
    assert result.rolled_back <= ALPHA  # observed: 0 of 400


def test_at_the_margin_itself_no_decision_is_taken_beyond_alpha():
    """The hardest case for validity: the canary is worse by exactly the margin, so promoting and rolling back
    would both be errors. Over 400 rollouts of 6,000 trajectories, looked at after each one, hardly any decide."""
    result = simulate(POLICY, ArmModel(reward=0.5), ArmModel(reward=0.6), rollouts=ROLLOUTS, max_trajectories=6000,
                      seed=12)
    assert result.promoted + result.rolled_back <= ALPHA  # observed: 1 of 400


@pytest.mark.parametrize("canary, bound", [
    (ArmModel(reward=0.3), 500),  # reward 0.3 below stable's
    (ArmModel(error=0.3), 300),  # 30 % of trajectories fail their tools (stable: 5 %)
    (ArmModel(latency_s=20.0), 500),  # twice as slow
], ids=["reward", "errors", "latency"])
def test_a_real_regression_is_rolled_back_within_a_bounded_sample(canary, bound):
    result = simulate(POLICY, canary, ArmModel(), rollouts=ROLLOUTS, max_trajectories=6000, seed=13)
    assert result.promoted == 0
    assert result.rolled_back >= 0.99
    assert result.canary_samples_p95 <= bound  # canary trajectories at the 10 % step


def test_a_better_canary_is_promoted_through_every_step():
    """Promotion must prove all three metrics not worse (error rate within 0.05 of stable's 5 %, latency under
    1.5x), which takes a few hundred canary trajectories at the 10 % step, and 100 more at 50 %."""
    result = simulate(POLICY, ArmModel(reward=0.75), ArmModel(), rollouts=100, max_trajectories=12000, seed=14)
    assert result.rolled_back == 0
    assert result.promoted >= 0.9  # observed 0.96; the rest were still undecided at 12,000 trajectories
    assert result.canary_samples_p95 <= 1500
