"""Data-parallel Flow-GRPO: one global batch split over 2 gloo processes gives the update of 1 process, to 1e-6.

Two processes (``torch.multiprocessing.spawn``, gloo on CPU, a file store) each take whole trajectories of the same
global batch, compute ``policy_loss`` divided by the *global* aggregation count, sum gradients with
``all_reduce_gradients`` and take 2 SGD steps. The shards are deliberately unequal (4 and 3 trajectories, different
token counts), which is what makes the normalisation matter: the same run with each rank normalising by its own
count and averaging gradients (what plain DDP does with a per-rank mean loss) is shown to land elsewhere.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agentflow.trainer.batch import build_batch, sequence_logprobs
from agentflow.trainer.distributed import all_reduce_gradients, global_denominator, shard_trajectories
from agentflow.trainer.grpo import GRPOConfig, policy_loss

pytestmark = pytest.mark.slow

VOCAB, STEPS, LR = 32, 2, 1.0
MODES = ("trajectory", "token_mean")


class TinyLM(torch.nn.Module):
    """A causal LM small enough to train in milliseconds: next-token logits from the running mean of the prefix."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, input_ids, attention_mask):
        m = attention_mask.unsqueeze(-1).float()
        prefix = (self.embed(input_ids) * m).cumsum(1) / m.cumsum(1).clamp(min=1)
        return type("Out", (), {"logits": self.head(torch.tanh(prefix))})()


def global_batch():
    """2 groups (G=4 and G=3) of multi-turn trajectories with ragged prompts and responses, served logprobs noisy
    enough that both clips fire."""
    rng = random.Random(0)
    records = []
    for g, rewards in enumerate(([1.0, 0.0, 0.0, 1.0], [0.5, 0.0, 1.0])):
        for j, reward in enumerate(rewards):
            turns = []
            for _ in range(1 + (3 * g + j) % 3):
                n, k = rng.randint(2, 6), rng.randint(1, 5)
                turns.append({"planner": {"prompt_token_ids": [rng.randrange(1, VOCAB) for _ in range(n)],
                                          "token_ids": [rng.randrange(1, VOCAB) for _ in range(k)],
                                          "logprobs": [-rng.uniform(2.5, 4.5) for _ in range(k)],
                                          "model_version": "v1"}})
            records.append({"trajectory_id": f"{g}-{j}", "group_id": f"g{g}", "turns": turns,
                            "rewards": [{"value": reward, "source": "rule"}]})
    return build_batch(records, pad_id=0)


def train(model, ref, batch, cfg, *, normalise: str, world: int = 1) -> list[dict]:
    """STEPS SGD steps on ``batch`` (this rank's shard); returns each step's metrics."""
    history = []
    with torch.no_grad():
        ref_logp = sequence_logprobs(ref, batch.input_ids, batch.attention_mask, batch.response_mask)
    for _ in range(STEPS):
        model.zero_grad()
        logp = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask)
        denominator = (global_denominator(batch.response_mask, batch.traj_index, cfg.aggregation)
                       if normalise == "global" else None)
        loss, metrics = policy_loss(logp, batch.old_logp, ref_logp, batch.advantages, batch.response_mask, cfg,
                                    traj_index=batch.traj_index, denominator=denominator)
        loss.backward()
        all_reduce_gradients(model.parameters())
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad / (world if normalise == "local_mean" else 1)
        history.append(metrics)
    return history


def _rank(rank: int, world: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        batch = global_batch()
        shard = batch.select_trajectories(shard_trajectories(batch.num_trajectories, rank, world))
        results = {}
        for mode in MODES:
            cfg = GRPOConfig(group_size=4, batch_trajectories=8, beta=0.05, aggregation=mode)
            for normalise in ("global", "local_mean"):
                model = TinyLM()
                ref = copy.deepcopy(model)
                metrics = train(model, ref, shard, cfg, normalise=normalise, world=world)
                results[mode, normalise] = {k: v.detach().clone() for k, v in model.state_dict().items()}
                results[mode, normalise, "metrics"] = metrics
        results["trajectories"] = shard.num_trajectories
        results["tokens"] = shard.num_tokens
        torch.save(results, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    mp.spawn(_rank, args=(2, str(tmp / "store"), str(tmp / "result")), nprocs=2, join=True)
    return [torch.load(tmp / f"result.{r}") for r in range(2)]


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_shards_are_whole_and_unequal(ranks):
    batch = global_batch()
    assert [r["trajectories"] for r in ranks] == [4, 3]
    assert sum(r["tokens"] for r in ranks) == batch.num_tokens and ranks[0]["tokens"] != ranks[1]["tokens"]


@pytest.mark.parametrize("mode", MODES)
def test_two_ranks_equal_one_process(ranks, mode):
    batch = global_batch()
    cfg = GRPOConfig(group_size=4, batch_trajectories=8, beta=0.05, aggregation=mode)
    model = TinyLM()
    metrics = train(model, copy.deepcopy(model), batch, cfg, normalise="global")
    single = model.state_dict()
    assert metrics[0]["clip_frac_low"] > 0 and metrics[0]["clip_frac_high"] > 0 and metrics[1]["kl"] > 0
    assert max_diff(single, TinyLM().state_dict()) > 1e-2  # the update is not negligible
    assert max_diff(ranks[0][mode, "global"], ranks[1][mode, "global"]) == 0.0  # replicas stay identical
    assert max_diff(ranks[0][mode, "global"], single) <= 1e-6
    # each rank normalising by its own count, gradients averaged: a different update
    assert max_diff(ranks[0][mode, "local_mean"], single) > 1e-4


def test_shard_trajectories_and_denominator_without_a_process_group():
    assert [shard_trajectories(7, r, 2) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6]]
    assert [shard_trajectories(2, r, 3) for r in range(3)] == [[0], [1], []]
    batch = global_batch()
    assert float(global_denominator(batch.response_mask, batch.traj_index, "trajectory")) == 7
    assert float(global_denominator(batch.response_mask, batch.traj_index, "token_mean")) == batch.num_tokens
