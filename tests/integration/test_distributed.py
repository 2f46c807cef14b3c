"""The batch split across ranks (trainer/distributed.py); the sharded update is tests/integration/test_fsdp.py."""

from __future__ import annotations

from agentflow.trainer.batch import build_batch
from agentflow.trainer.distributed import shard_trajectories
from agentflow.trainer.grpo import aggregation_count
from tests.integration.fsdp_worker import records


def test_shards_are_contiguous_whole_and_cover_the_batch():
    assert [shard_trajectories(7, r, 2) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6]]
    assert [shard_trajectories(2, r, 3) for r in range(3)] == [[0], [1], []]
    batch = build_batch(records(0), pad_id=0)
    shards = [batch.select_trajectories(shard_trajectories(batch.num_trajectories, r, 2)) for r in range(2)]
    assert [s.num_trajectories for s in shards] == [4, 4]
    assert sum(len(s) for s in shards) == len(batch) and shards[0].num_tokens != shards[1].num_tokens
    # the global counts each rank divides by: its shards' counts add up to them
    for mode in ("trajectory", "token_mean"):
        whole = aggregation_count(batch.response_mask, batch.traj_index, mode)
        assert sum(aggregation_count(s.response_mask, s.traj_index, mode) for s in shards) == whole
