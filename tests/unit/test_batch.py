"""Trajectory records -> training tensors: grouping, filters, padding and alignment, checked element by element."""

import math

import pytest
import torch

from agentflow.errors import InvalidInput
from agentflow.domain import trajectory
from agentflow.trainer.batch import (
    build_batch,
    fill_old_logprobs,
    sequence_logprobs,
)

PAD = 0


def call(prompt, tokens, logprobs=None, version="v5") -> dict:
    return {"text": "", "prompt_token_ids": list(prompt), "token_ids": list(tokens),
            "logprobs": list(logprobs if logprobs is not None else [-0.5] * len(tokens)),
            "model_version": version, "finish_reason": "stop", "latency_s": 0.0}


def turn(step, planner) -> dict:
    return {"step": step, "planner": planner, "decision": {"sub_goal": "", "tool": "", "context": ""},
            "parse_error": "", "command": "", "executor": {}, "result": "", "tool_error": "", "verdict": "STOP",
            "verifier_analysis": "", "timings": {"plan_s": 0, "execute_s": 0, "verify_s": 0, "total_s": 0},
            "verifier": {}}


def record(tid, group, reward, planner_calls, *, source="rule") -> dict:
    rewards = [] if reward is None else [{"value": reward, "source": source}]
    r = {"schema_version": 1, "trajectory_id": tid, "group_id": group, "query": "q", "ground_truth": "",
         "source": "training", "analysis": "", "status": "answered", "answer": "", "error": "", "trace_id": "",
         "started_at_unix": 0, "turns": [turn(i, c) for i, c in enumerate(planner_calls)],
         "memory": {"query": "q", "analysis": "", "summary": "", "compacted_steps": 0, "steps": []},
         "rewards": rewards, "totals": {"turns": len(planner_calls), "prompt_tokens": 0, "completion_tokens": 0,
                                        "latency_s": 0},
         "analysis_call": call([9, 9], [8, 8]), "generator": {}}
    trajectory.validate(r)  # the fixtures are real records
    return r


def test_the_batch_reads_rewards_by_the_record_precedence():
    records = [record("a", "g", None, [call([1], [2])]), record("b", "g", None, [call([1], [3])])]
    records[0]["rewards"] = [{"value": 0.2, "source": "judge"}, {"value": 1.0, "source": "rule"},
                             {"value": 0.0, "source": "rule"}]  # rule beats judge; the latest rule reward wins
    records[1]["rewards"] = [{"value": 0.0, "source": "rule"}, {"value": 1.5, "source": "human"}]
    # by default a rating never overrides the ground truth: both rule rewards are 0, the group has no signal
    assert len(build_batch(records, pad_id=PAD)) == 0
    # a deployment that puts ratings first: the human reward wins, clipped to 1
    ratings_first = build_batch(records, pad_id=PAD, reward_precedence=trajectory.RATINGS_FIRST)
    assert ratings_first.rewards.tolist() == [0.0, 1.0]


def test_rows_are_padded_and_aligned_by_hand():
    records = [
        record("a", "g1", 1.0, [call([11, 12, 13], [21, 22], [-0.1, -0.2]), call([14], [23], [-0.3])]),
        record("b", "g1", 0.0, [call([15, 16], [24, 25, 26], [-0.4, -0.5, -0.6])]),
        record("c", "g2", 1.0, [call([1], [2])]),  # g2: all rewards equal -> dropped
        record("d", "g2", 1.0, [call([1], [2])]),
        record("a", "g1", 0.0, [call([1], [2])]),  # a duplicate delivery of "a": ignored
    ]
    batch = build_batch(records, pad_id=PAD)
    assert batch.input_ids.tolist() == [[11, 12, 13, 21, 22], [14, 23, 0, 0, 0], [15, 16, 24, 25, 26]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert batch.response_mask.int().tolist() == [[0, 0, 0, 1, 1], [0, 1, 0, 0, 0], [0, 0, 1, 1, 1]]
    torch.testing.assert_close(batch.old_logp, torch.tensor([[0, 0, 0, -0.1, -0.2], [0, -0.3, 0, 0, 0],
                                                             [0, 0, -0.4, -0.5, -0.6]]))
    # g1 rewards {1, 0}: mean 0.5, sample std sqrt(0.5) -> A = +-0.5/sqrt(0.5); both turns of "a" get +A
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(batch.advantages, torch.tensor([a, a, -a]))
    assert batch.traj_index.tolist() == [0, 0, 1] and batch.trajectory_ids == ["a", "b"]
    assert batch.rewards.tolist() == [1.0, 0.0] and batch.versions == [5, 5, 5]
    assert not bool(batch.old_logp_missing.any())
    s = batch.stats
    assert (s.records, s.duplicates, s.groups, s.groups_kept, s.groups_no_signal, s.turns_kept) == (5, 1, 2, 1, 1, 3)
    assert s.reward_mean == pytest.approx(3 / 4)
    assert batch.num_tokens == 6 and len(batch) == 3


def test_staleness_filter_drops_turns_but_keeps_the_group_baseline():
    records = [
        record("a", "g", 1.0, [call([1], [2], version="v3"), call([1], [3], version="v5")]),
        record("b", "g", 0.0, [call([1], [4], version="4")]),
        record("c", "g", 0.0, [call([1], [5], version="v2")]),  # every turn stale: no rows, no trajectory
        record("d", "g", 0.0, [call([1], [6], version="tiny")]),  # unknown version: dropped when filtering
    ]
    batch = build_batch(records, pad_id=PAD, current_version="v5", max_staleness=1)
    assert batch.input_ids[:, 1].tolist() == [3, 4]
    assert batch.trajectory_ids == ["a", "b"] and batch.traj_index.tolist() == [0, 1]
    # advantages over all four rewards 1,0,0,0: mean 1/4, sample std sqrt((9/16 + 3/16)/3) = 1/2
    torch.testing.assert_close(batch.advantages, torch.tensor([0.75, -0.25]) / (0.5 + 1e-6))
    assert (batch.stats.turns_stale, batch.stats.turns_unversioned) == (2, 1)
    assert batch.stats.turns_by_staleness == {0: 1, 1: 1}  # the kept turns: v5 and 4
    # turns from before a reset of the policy (the format warm-up's version) are stale whatever their age
    reset = build_batch(records, pad_id=PAD, current_version="v5", max_staleness=1, min_version=5)
    assert reset.input_ids[:, 1].tolist() == [3] and reset.stats.turns_stale == 3
    # without a current version nothing is filtered
    assert len(build_batch(records, pad_id=PAD, max_staleness=1)) == 5
    with pytest.raises(InvalidInput, match="not a version"):
        build_batch(records, pad_id=PAD, current_version="latest", max_staleness=1)


def test_unscored_groups_missing_tokens_and_long_turns():
    records = [
        record("a", "g1", 1.0, [call([1], [2])]),
        record("b", "g1", None, [call([1], [2])]),  # its reward has not arrived: the group waits, dropped here
        record("c", "g2", 1.0, [call([], []), call([1, 2, 3], [4, 5, 6]), call([1], [2, 3], logprobs=[])]),
        record("d", "g2", 0.0, [call([1], [7], logprobs=[-1.0, -2.0])]),  # logprobs do not match: recompute
        record("e", "", 1.0, [call([1], [2])]),  # no group id: a group of one, no signal
        record("f", "", 0.0, [call([1], [2])]),
    ]
    batch = build_batch(records, pad_id=PAD, max_length=4)
    s = batch.stats
    assert (s.groups, s.groups_unscored, s.groups_no_signal, s.groups_kept) == (4, 1, 2, 1)
    assert (s.turns_without_tokens, s.turns_too_long, s.rows_missing_logprobs) == (1, 1, 2)
    assert batch.input_ids.tolist() == [[1, 2, 3], [1, 7, 0]]
    assert batch.old_logp_missing.tolist() == [True, True]


def test_a_flat_group_is_kept_at_advantage_zero_only_when_asked():
    records = [record("a", "g1", 1.0, [call([1], [2])]), record("b", "g1", 0.0, [call([1], [3])]),
               record("c", "g2", 1.0, [call([1], [4]), call([1], [5])]), record("d", "g2", 1.0, [call([1], [6])]),
               record("e", "", 0.0, [call([1], [7])])]  # a group of one is never kept: nothing to compare it with
    dropped = build_batch(records, pad_id=PAD)
    assert dropped.trajectory_ids == ["a", "b"] and dropped.stats.groups_no_signal == 2
    kept = build_batch(records, pad_id=PAD, keep_flat=True)
    assert kept.trajectory_ids == ["a", "b", "c", "d"] and kept.input_ids[:, 1].tolist() == [2, 3, 4, 5, 6]
    assert kept.advantages[2:].tolist() == [0.0, 0.0, 0.0]
    torch.testing.assert_close(kept.advantages[:2], dropped.advantages)  # the other groups' advantages unchanged
    s = kept.stats
    assert (s.groups_kept, s.groups_kl_only, s.groups_no_signal) == (2, 1, 1)


def test_no_rows_gives_an_empty_batch():
    batch = build_batch([record("a", "g", 1.0, [call([1], [2])]), record("b", "g", 1.0, [])], pad_id=PAD)
    assert len(batch) == 0 and batch.input_ids.shape == (0, 0) and batch.stats.groups_no_signal == 1


def test_micro_batches_keep_trajectories_whole():
    records = [record("a", "g", 1.0, [call([1], [2]), call([1, 2], [3])]),
               record("b", "g", 0.0, [call([1], [4])]),
               record("c", "g", 0.5, [call([1, 2, 3, 4], [5, 6])])]
    batch = build_batch(records, pad_id=PAD)
    shards = batch.micro_batches(1)  # a has 2 rows: a shard of its own all the same
    assert [s.trajectory_ids for s in shards] == [["a"], ["b"], ["c"]]
    assert [s.traj_index.tolist() for s in shards] == [[0, 0], [0], [0]]
    assert shards[1].input_ids.tolist() == [[1, 4]]  # padding trimmed to the shard's longest row
    assert [s.trajectory_ids for s in batch.micro_batches(2)] == [["a"], ["b", "c"]]
    assert [s.trajectory_ids for s in batch.micro_batches(3)] == [["a", "b"], ["c"]]
    ab = batch.select_trajectories([1, 0])
    assert ab.trajectory_ids == ["a", "b"] and ab.advantages.tolist() == batch.advantages[:3].tolist()


# --- log-probs ----------------------------------------------------------------------------------------------------


class Bigram(torch.nn.Module):
    """A causal LM whose next-token logits depend on the current token only (logits = table[token])."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(table)

    def forward(self, input_ids, attention_mask=None):
        return type("Out", (), {"logits": self.table[input_ids]})()


def test_sequence_logprobs_by_hand():
    # vocabulary {0, 1, 2}; after token 1 the logits are (0, ln 3, 0) -> p(1|1) = 3/5, p(2|1) = 1/5
    table = torch.tensor([[0.0, 0.0, 0.0], [0.0, math.log(3), 0.0], [math.log(2), 0.0, 0.0]])
    model = Bigram(table)
    input_ids = torch.tensor([[1, 1, 2, 0], [2, 0, 0, 0]])
    attention = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    response = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0]])
    logp, entropy = sequence_logprobs(model, input_ids, attention, response, with_entropy=True)
    # row 0: p(1|1) = 3/5, p(2|1) = 1/5 ; row 1: after 2 the logits are (ln 2, 0, 0) -> p(0|2) = 2/4
    want = torch.log(torch.tensor([[1.0, 3 / 5, 1 / 5, 1.0], [1.0, 2 / 4, 1.0, 1.0]]))
    torch.testing.assert_close(logp, want)
    h1 = -(3 / 5 * math.log(3 / 5) + 2 * (1 / 5) * math.log(1 / 5))  # entropy of (1/5, 3/5, 1/5)
    h2 = -(1 / 2 * math.log(1 / 2) + 2 * (1 / 4) * math.log(1 / 4))  # entropy of (1/2, 1/4, 1/4)
    torch.testing.assert_close(entropy, torch.tensor([[0, h1, h1, 0], [0, h2, 0, 0]]))
    logp.sum().backward()  # the gradient reaches the model
    assert model.table.grad is not None and bool(model.table.grad.abs().sum() > 0)
    with pytest.raises(InvalidInput, match="position 0"):
        sequence_logprobs(model, input_ids, attention, torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0]]))


def test_fill_old_logprobs_recomputes_only_missing_rows():
    table = torch.tensor([[0.0, 0.0, 0.0], [0.0, math.log(3), 0.0], [math.log(2), 0.0, 0.0]])
    records = [record("a", "g", 1.0, [call([1], [1, 2], logprobs=[])]),
               record("b", "g", 0.0, [call([2], [0], logprobs=[-7.0])])]
    batch = fill_old_logprobs(build_batch(records, pad_id=PAD), Bigram(table))
    torch.testing.assert_close(batch.old_logp, torch.tensor([[0.0, math.log(3 / 5), math.log(1 / 5)],
                                                             [0.0, -7.0, 0.0]]))
    assert not bool(batch.old_logp_missing.any())


def test_ablation_credit_modes():
    records = [record("a", "g", 1.0, [call([1], [2]), call([1], [3])]), record("b", "g", 0.0, [call([1], [4])]),
               record("c", "h", 1.0, [call([1], [5])]), record("d", "h", 1.0, [call([1], [6])])]
    broadcast = build_batch(records, pad_id=PAD)
    last = build_batch(records, pad_id=PAD, credit="last_turn")
    assert broadcast.advantages[0] == broadcast.advantages[1] > 0  # group h has no spread: dropped
    assert last.advantages[0] == 0 and last.advantages[1] == broadcast.advantages[1] and len(last) == 3
    success = build_batch(records, pad_id=PAD, credit="success")  # every turn of a rewarded trajectory, A = 1
    assert success.trajectory_ids == ["a", "c", "d"] and success.advantages.tolist() == [1.0] * 4
    with pytest.raises(InvalidInput, match="credit"):
        build_batch(records, pad_id=PAD, credit="everything")
