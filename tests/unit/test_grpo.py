"""Flow-GRPO math against numbers computed by hand (the arithmetic is written next to each expected value)."""

import math

import pytest
import torch

from agentflow.errors import InvalidInput
from agentflow.trainer.grpo import (
    AGGREGATIONS,
    GRPOConfig,
    aggregation_count,
    broadcast,
    group_advantages,
    has_signal,
    kl_k3,
    policy_loss,
)

EPS = 1e-6


# --- advantages ---------------------------------------------------------------------------------------------------


def test_group_advantages_use_the_sample_std():
    # rewards 1,0,0,1: mean 0.5; squared deviations 4 x 0.25 = 1; sample variance 1/(4-1); std sqrt(1/3)
    got = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    want = torch.tensor([0.5, -0.5, -0.5, 0.5]) / (math.sqrt(1 / 3) + EPS)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-7)
    # rewards 2,4,6: mean 4; deviations -2,0,2; variance (4+0+4)/2 = 4; std 2
    torch.testing.assert_close(group_advantages(torch.tensor([2.0, 4.0, 6.0])),
                               torch.tensor([-2.0, 0.0, 2.0]) / (2 + EPS), rtol=0, atol=1e-7)


def test_group_advantages_eps_and_integer_rewards():
    # G=2, rewards {1, 0}: mean 0.5, sample std sqrt(0.5); eps 0.5 is visible in the result
    got = group_advantages(torch.tensor([1, 0]), eps=0.5)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.tensor([0.5, -0.5]) / (math.sqrt(0.5) + 0.5))


def test_groups_without_signal_give_zeros():
    for rewards in ([0.3, 0.3, 0.3], [1.0], [0.0, 0.0]):
        r = torch.tensor(rewards)
        assert not bool(has_signal(r))
        assert torch.equal(group_advantages(r), torch.zeros(len(rewards)))
    assert bool(has_signal(torch.tensor([0.0, 0.0, 1e-3])))


def test_group_advantages_over_the_last_dimension():
    # two groups of 2: {1, 0} -> +-0.5/sqrt(0.5); {1, 1} -> no signal
    r = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert has_signal(r).tolist() == [True, False]
    a = 0.5 / (math.sqrt(0.5) + EPS)
    torch.testing.assert_close(group_advantages(r), torch.tensor([[a, -a], [0.0, 0.0]]))


def test_group_advantages_reject_non_finite_rewards():
    with pytest.raises(InvalidInput, match="finite"):
        group_advantages(torch.tensor([1.0, float("nan")]))


def test_broadcast_repeats_each_trajectory_for_its_turns():
    got = broadcast(torch.tensor([0.5, -1.0, 2.0]), [2, 0, 3])
    assert got.tolist() == [0.5, 0.5, 2.0, 2.0, 2.0]
    with pytest.raises(InvalidInput, match="one turn count per trajectory"):
        broadcast(torch.tensor([1.0, 2.0]), [1])
    with pytest.raises(InvalidInput, match=">= 0"):
        broadcast(torch.tensor([1.0]), [-1])


# --- KL -----------------------------------------------------------------------------------------------------------


def test_kl_k3_by_hand():
    logp = torch.log(torch.tensor([0.5, 0.25, 0.3]))
    ref = torch.log(torch.tensor([0.25, 0.5, 0.3]))
    # d = ref - logp: log 1/2 -> 0.5 + ln 2 - 1 ; log 2 -> 2 - ln 2 - 1 ; 0 -> 0
    want = torch.tensor([0.5 + math.log(2) - 1, 2 - math.log(2) - 1, 0.0])
    torch.testing.assert_close(kl_k3(logp, ref), want)
    assert bool((kl_k3(torch.randn(50), torch.randn(50)) >= 0).all())


# --- the loss -----------------------------------------------------------------------------------------------------
#
# Three rows, old_logp = 0 so logp is the log-ratio. eps_low 0.2 (floor 0.8), eps_high 0.3 (ceiling 1.3).
#   row 0, A=+1  : tokens 1,2 with ratios 1.5 and 0.5 -> -min(1.5, 1.3) = -1.3 (clipped high); -min(0.5, 0.8) = -0.5
#   row 1, A=-2  : token 1 with ratio 0.5            -> -min(-1.0, -1.6) = +1.6 (clipped low)
#   row 2, A=+0.5: token 2 with ratio 1.0            -> -0.5
# Masked positions hold values that would be wrong if they leaked in (a huge ratio, NaN).

LOGP = torch.tensor([[0.0, math.log(1.5), math.log(0.5)],
                     [0.0, math.log(0.5), 5.0],
                     [7.0, 3.0, 0.0]])
OLD = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [float("nan"), 0.0, 0.0]])
MASK = torch.tensor([[0, 1, 1], [0, 1, 0], [0, 0, 1]])
ADV = torch.tensor([1.0, -2.0, 0.5])
TRAJ = torch.tensor([0, 0, 1])  # rows 0 and 1 are two turns of one trajectory


def cfg(aggregation: str, beta: float = 0.0) -> GRPOConfig:
    return GRPOConfig(eps_low=0.2, eps_high=0.3, beta=beta, aggregation=aggregation)


def test_token_mean_by_hand():
    loss, metrics = policy_loss(LOGP, OLD, None, ADV, MASK, cfg("token_mean"))
    torch.testing.assert_close(loss, torch.tensor((-1.3 - 0.5 + 1.6 - 0.5) / 4))
    assert metrics["tokens"] == 4 and metrics["trajectories"] == 3
    assert metrics["clip_frac_low"] == pytest.approx(1 / 4)  # row 1: ratio 0.5 < 0.8 with A < 0
    assert metrics["clip_frac_high"] == pytest.approx(1 / 4)  # row 0: ratio 1.5 > 1.3 with A > 0
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 0.5 + 0.5 + 1.0) / 4)
    assert "kl" not in metrics


def test_trajectory_mean_by_hand():
    # trajectory 0 = rows 0,1: turn means -0.9 and 1.6, mean over its 2 turns 0.35; trajectory 1 = row 2: -0.5
    loss, metrics = policy_loss(LOGP, OLD, None, ADV, MASK, cfg("trajectory"), traj_index=TRAJ)
    torch.testing.assert_close(loss, torch.tensor((0.35 - 0.5) / 2))
    assert metrics["trajectories"] == 2
    # without traj_index every row is its own trajectory: (-0.9 + 1.6 - 0.5) / 3
    loss, _ = policy_loss(LOGP, OLD, None, ADV, MASK, cfg("trajectory"))
    torch.testing.assert_close(loss, torch.tensor(0.2 / 3))


def test_gradients_vanish_on_clipped_tokens():
    logp = LOGP.clone().requires_grad_(True)
    loss, _ = policy_loss(logp, OLD, None, ADV, MASK, cfg("token_mean"))
    loss.backward()
    # d(-ratio*A)/dlogp = -ratio*A, divided by the 4 tokens; the clipped tokens and masked positions get 0
    want = torch.tensor([[0.0, 0.0, -0.5 * 1 / 4], [0.0, 0.0, 0.0], [0.0, 0.0, -1.0 * 0.5 / 4]])
    torch.testing.assert_close(logp.grad, want)


def test_kl_penalty_by_hand():
    ref = LOGP + math.log(0.5)  # ref - logp = log 1/2 on every token: KL_k3 = 0.5 + ln 2 - 1 everywhere
    c = 0.5 + math.log(2) - 1
    for aggregation, pg in (("token_mean", -0.7 / 4), ("trajectory", -0.15 / 2)):
        loss, metrics = policy_loss(LOGP, OLD, ref, ADV, MASK, cfg(aggregation, beta=0.1), traj_index=TRAJ)
        torch.testing.assert_close(loss, torch.tensor(pg + 0.1 * c))
        assert metrics["kl"] == pytest.approx(c) and metrics["kl_loss"] == pytest.approx(c)
        assert metrics["pg_loss"] == pytest.approx(pg) and metrics["loss"] == pytest.approx(pg + 0.1 * c)


def test_global_denominator_makes_shards_add_up():
    # the whole batch has 2 trajectories; shard A = rows 0,1 (trajectory 0), shard B = row 2 (trajectory 1)
    whole, _ = policy_loss(LOGP, OLD, None, ADV, MASK, cfg("trajectory"), traj_index=TRAJ)
    assert float(aggregation_count(MASK, TRAJ, "trajectory")) == 2
    a, _ = policy_loss(LOGP[:2], OLD[:2], None, ADV[:2], MASK[:2], cfg("trajectory"), traj_index=TRAJ[:2],
                       denominator=2)
    b, _ = policy_loss(LOGP[2:], OLD[2:], None, ADV[2:], MASK[2:], cfg("trajectory"), traj_index=torch.tensor([0]),
                       denominator=2)
    torch.testing.assert_close(a, torch.tensor(0.35 / 2))
    torch.testing.assert_close(a + b, whole)
    # token_mean: the denominator is the whole batch's 4 tokens
    assert float(aggregation_count(MASK, None, "token_mean")) == 4
    a, _ = policy_loss(LOGP[:2], OLD[:2], None, ADV[:2], MASK[:2], cfg("token_mean"), denominator=4)
    torch.testing.assert_close(a, torch.tensor((-1.3 - 0.5 + 1.6) / 4))


def test_rows_without_tokens_do_not_count_as_turns():
    mask = MASK.clone()
    mask[1] = 0  # trajectory 0 keeps one live turn (row 0, mean -0.9)
    loss, metrics = policy_loss(LOGP, OLD, None, ADV, mask, cfg("trajectory"), traj_index=TRAJ)
    torch.testing.assert_close(loss, torch.tensor((-0.9 - 0.5) / 2))
    empty, _ = policy_loss(LOGP, OLD, None, ADV, torch.zeros_like(MASK), cfg("token_mean"))
    assert float(empty) == 0.0


def test_entropy_metric_is_a_token_mean():
    entropy = torch.tensor([[9.0, 1.0, 2.0], [9.0, 3.0, 9.0], [9.0, 9.0, 4.0]])
    _, metrics = policy_loss(LOGP, OLD, None, ADV, MASK, cfg("token_mean"), entropy=entropy)
    assert metrics["entropy"] == pytest.approx((1 + 2 + 3 + 4) / 4)


def test_policy_loss_rejects_bad_inputs():
    with pytest.raises(InvalidInput, match="needs ref_logp"):
        policy_loss(LOGP, OLD, None, ADV, MASK, cfg("token_mean", beta=0.1))
    with pytest.raises(InvalidInput, match=r"adv must be \[B\]"):
        policy_loss(LOGP, OLD, None, ADV[:2], MASK, cfg("token_mean"))
    with pytest.raises(InvalidInput, match="one \\[B, L\\] shape"):
        policy_loss(LOGP, OLD[:, :2], None, ADV, MASK, cfg("token_mean"))
    with pytest.raises(InvalidInput, match="traj_index"):
        policy_loss(LOGP, OLD, None, ADV, MASK, cfg("trajectory"), traj_index=torch.tensor([0]))


def test_aggregation_registry():
    assert set(AGGREGATIONS) == {"trajectory", "token_mean"}
    with pytest.raises(InvalidInput, match="unknown aggregation 'sum'"):
        aggregation_count(MASK, None, "sum")


# --- configuration ------------------------------------------------------------------------------------------------


def test_config_defaults_are_the_published_ones():
    c = GRPOConfig()
    assert (c.group_size, c.queries_per_batch, c.batch_trajectories) == (8, 32, 256)
    assert (c.lr, c.eps_low, c.eps_high, c.beta, c.temperature, c.max_planner_turns) == (1e-6, 0.2, 0.3, 0.001,
                                                                                         1.0, 3)
    assert c.aggregation == "trajectory"
    assert all(text for text in GRPOConfig.help().values())


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_trajectories": 30}, "grpo.batch_trajectories: batch must hold whole groups: 30 is not a multiple of G=8"),
    ({"group_size": 1, "batch_trajectories": 4}, "grpo.group_size must be >= 2"),
    ({"eps_low": 1.0}, "grpo.eps_low must be in \\[0, 1\\)"),
    ({"eps_high": -0.1}, "grpo.eps_high"),
    ({"beta": -1.0}, "grpo.beta"),
    ({"lr": 0.0}, "grpo.lr"),
    ({"temperature": 0.0}, "grpo.temperature"),
    ({"max_staleness": -1}, "grpo.max_staleness"),
    ({"aggregation": "seq_sum"}, "grpo.aggregation must be one of \\['token_mean', 'trajectory'\\]"),
    ({"group_size": "8"}, "grpo.group_size must be an integer"),
    ({"lr": float("nan")}, "grpo.lr must be a finite number"),
    ({"updates_per_batch": 0}, "grpo.updates_per_batch"),
    ({"is_cap": 0.5}, "grpo.is_cap must be >= 1"),
    ({"keep_flat_groups": True, "beta": 0.0}, "grpo.keep_flat_groups needs beta > 0"),
])
def test_config_errors_name_the_setting(kwargs, message):
    with pytest.raises(InvalidInput, match=message):
        GRPOConfig(**kwargs)


def test_config_from_mapping_converts_strings():
    c = GRPOConfig.from_mapping({"group_size": "4", "batch_trajectories": "8", "lr": "3e-6",
                                 "max_staleness": "none", "aggregation": "token_mean"})
    assert (c.group_size, c.batch_trajectories, c.lr, c.max_staleness, c.aggregation) == (4, 8, 3e-6, None,
                                                                                           "token_mean")
    with pytest.raises(InvalidInput, match="unknown grpo setting\\(s\\) \\['G'\\]"):
        GRPOConfig.from_mapping({"G": "8"})
    with pytest.raises(InvalidInput, match="grpo.group_size must be int"):
        GRPOConfig.from_mapping({"group_size": "eight"})


def test_a_wrong_served_logprob_is_clamped_instead_of_voiding_the_update():
    """One token whose served log-prob is garbage (-1e21, a faulty server) must not make the loss infinite: the
    other tokens keep their gradient and the metric counts the clamped token."""
    from agentflow.trainer.grpo import LOG_RATIO_LIMIT, GRPOConfig, policy_loss

    logp = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, -0.2]], requires_grad=True)
    old = logp.detach().clone()
    old[0, 1] = -1e21
    mask = torch.ones(2, 3)
    loss, m = policy_loss(logp, old, None, torch.tensor([-1.0, 1.0]), mask, GRPOConfig(beta=0.0))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert logp.grad[0, 1] == 0 and logp.grad[1].abs().sum() > 0 and logp.grad[0, 0] != 0
    assert m["log_ratio_clamped"] == pytest.approx(1 / 6) and LOG_RATIO_LIMIT == 20.0


# --- credit rules and objectives ----------------------------------------------------------------------------------


def test_credit_rules():
    from agentflow.trainer.grpo import CREDITS, credit_rule

    rewards = torch.tensor([0.0, 1.0], dtype=torch.float64)
    a = 1 / (math.sqrt(0.5) + EPS)  # mean 0.5, sample std sqrt(0.5): ±0.5/0.707 = ±0.707
    for name in ("broadcast", "last_turn"):
        assert CREDITS[name].advantages(rewards, EPS).tolist() == pytest.approx([-0.5 * a, 0.5 * a])
        assert CREDITS[name].advantages(torch.tensor([1.0, 1.0]), EPS) is None  # no signal
    assert [CREDITS["broadcast"].turn(0.7, t, 3) for t in range(3)] == [0.7, 0.7, 0.7]
    assert [CREDITS["last_turn"].turn(0.7, t, 3) for t in range(3)] == [0.0, 0.0, 0.7]
    success = CREDITS["success"].advantages(torch.tensor([0.0, 1.0, 0.5]), EPS).tolist()
    assert math.isnan(success[0]) and success[1:] == [1.0, 1.0]  # failures left out, no normalisation
    with pytest.raises(InvalidInput, match="credit must be one of broadcast, last_turn, success"):
        credit_rule("first_turn")


def test_objectives_name_a_credit_rule_and_a_loss():
    from agentflow.trainer.grpo import CREDITS, OBJECTIVES, objective, sft_loss

    from agentflow.trainer.grpo import decoupled_ppo_loss, tis_loss

    assert {name: (o.credit, o.loss, o.aggregation, o.proximal) for name, o in OBJECTIVES.items()} == {
        "flow_grpo": ("broadcast", policy_loss, None, False), "last_turn": ("last_turn", policy_loss, None, False),
        "sft_success": ("success", sft_loss, "token_mean", False),
        "decoupled_ppo": ("broadcast", decoupled_ppo_loss, None, True), "tis": ("broadcast", tis_loss, None, True)}
    assert all(o.credit in CREDITS and o.help for o in OBJECTIVES.values())
    with pytest.raises(InvalidInput, match="objective must be one of flow_grpo, last_turn, sft_success"):
        objective("dpo")


def test_off_policy_objectives_by_hand():
    """One row, two tokens, A = +1, clip [0.8, 1.3], is_cap 2. The proximal (recomputed) log-probs are 0 and 0; the
    server said log 0.25 and log 0.8, so pi_prox / pi_behaviour is 4 (past the cap) and 1.25."""
    from agentflow.trainer.grpo import decoupled_ppo_loss, tis_loss

    config = GRPOConfig(eps_low=0.2, eps_high=0.3, beta=0.0, aggregation="token_mean", is_cap=2.0)
    prox = torch.zeros(1, 2)
    behaviour = torch.log(torch.tensor([[0.25, 0.8]]))
    logp = torch.log(torch.tensor([[1.5, 1.1]])).requires_grad_(True)  # the policy moved: ratios 1.5 and 1.1
    mask, adv = torch.ones(1, 2, dtype=torch.bool), torch.ones(1)
    # decoupled: token 0 (weight 4 > 2) left out; token 1: -min(1.1, 1.1) * 1.25, over the 2 tokens
    loss, metrics = decoupled_ppo_loss(logp, prox, None, adv, mask, config, behaviour_logp=behaviour)
    torch.testing.assert_close(loss, torch.tensor(-1.1 * 1.25 / 2))
    assert metrics["is_dropped"] == 0.5 and metrics["is_weight"] == pytest.approx((0 + 1.25) / 2)
    # tis: token 0 weight truncated to 2, its ratio 1.5 clipped to 1.3: -(1.3 * 2 + 1.1 * 1.25) / 2
    loss, metrics = tis_loss(logp, prox, None, adv, mask, config, behaviour_logp=behaviour)
    torch.testing.assert_close(loss, torch.tensor(-(1.3 * 2 + 1.1 * 1.25) / 2))
    assert metrics["is_truncated"] == 0.5 and metrics["is_weight"] == pytest.approx((2 + 1.25) / 2)
    loss.backward()  # the clipped token gets no gradient; the weight carries none
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -1.1 * 1.25 / 2]]))
    # on-policy (served = recomputed = the policy) both are today's objective
    same, _ = tis_loss(prox, prox, None, adv, mask, config, behaviour_logp=prox)
    torch.testing.assert_close(same, policy_loss(prox, prox, None, adv, mask, config)[0])


def test_sft_loss_is_the_mean_negative_log_likelihood():
    from agentflow.trainer.grpo import sft_loss

    logp = torch.tensor([[-1.0, -2.0, float("nan")], [-4.0, -0.5, -3.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]], dtype=torch.bool)
    entropy = torch.tensor([[0.2, 0.4, 9.0], [9.0, 0.6, 0.8]])
    loss, m = sft_loss(logp, logp.detach(), None, torch.zeros(2), mask, GRPOConfig(), entropy=entropy)
    assert float(loss.detach()) == pytest.approx((1 + 2 + 0.5 + 3) / 4)  # 6.5 / 4 response tokens
    assert m == pytest.approx({"loss": 1.625, "pg_loss": 1.625, "tokens": 4.0, "entropy": (0.2 + 0.4 + 0.6 + 0.8) / 4})
    loss.backward()
    assert logp.grad.tolist() == [[-0.25, -0.25, 0.0], [0.0, -0.25, -0.25]]
    shard, _ = sft_loss(logp[:1], logp[:1].detach(), None, torch.zeros(1), mask[:1], GRPOConfig(), denominator=4)
    assert float(shard.detach()) == pytest.approx((1 + 2) / 4)  # one shard over the whole batch's count
