"""Proof of the sampling version, on real weights (issue 31, item 4): rollouts whose served log-probs come from the
weights being trained are measured and trained on; rollouts that name this version but were sampled from other
weights (a server that never loaded it) are quarantined within the batch, and the step trains on nothing.

The "server" here is the trainer's own log-prob code run on a model folder (what serve-llm and vLLM return for
those tokens, to float rounding: tests/integration/test_vllm_parity.py measures vLLM against it)."""

from __future__ import annotations

import pytest
import torch

from agentflow.llm.models import build_tiny, load_causal_lm
from agentflow.trainer.batch import sequence_logprobs
from agentflow.trainer.checkpoint import ModelStore
from agentflow.trainer.grpo import GRPOConfig
from agentflow.trainer.loop import TrainConfig, Trainer
from tests.integration.fsdp_worker import records

pytestmark = pytest.mark.slow


def served_by(model_dir, batch: list[dict]) -> list[dict]:
    """``batch`` with every planner call's log-probs as a server running ``model_dir`` would return them."""
    model = load_causal_lm(model_dir)
    with torch.no_grad():
        for record in batch:
            for turn in record["turns"]:
                call = turn["planner"]
                ids = torch.tensor([call["prompt_token_ids"] + call["token_ids"]])
                response = torch.zeros_like(ids, dtype=torch.bool)
                response[0, len(call["prompt_token_ids"]):] = True
                logp = sequence_logprobs(model, ids, torch.ones_like(ids), response)
                call["logprobs"] = logp[response].tolist()
    return batch


def trainer(model_dir, store, objective: str = "flow_grpo", lr: float = 1e-4) -> Trainer:
    grpo = GRPOConfig(group_size=4, batch_trajectories=8, beta=0.0, lr=lr, max_staleness=4)
    return Trainer(model_dir, ModelStore(store), TrainConfig(grpo=grpo, objective=objective))  # the default bound


def named(batch: list[dict], version: str) -> list[dict]:
    for record in batch:
        for turn in record["turns"]:
            turn["planner"]["model_version"] = version
    return batch


def test_rollouts_of_the_trained_weights_pass_and_one_that_never_loaded_is_quarantined(tiny_model_dir, tmp_path):
    objective = "tis"  # a proximal objective: the check's forward pass is also its clip's centre
    t = trainer(tiny_model_dir, tmp_path / "store", objective, lr=3e-3)
    for step in range(3):  # honest rollouts: served by the version being trained
        served = named(served_by(t.store.get(t.version).path, records(step)), f"v{t.version}")
        honest = t.step(served)
        assert not honest.get("skipped") and honest["version"] == step + 1, honest
        assert honest["behaviour_abs_s0"] < 1e-4 and honest["groups_quarantined"] == 0
    # the server says v3 but still samples from v0's weights (the new version never loaded)
    stale = named(served_by(tiny_model_dir, records(3)), "v3")
    metrics = t.step(stale)
    print(f"\n{objective}: served by the weights trained {honest['behaviour_abs_s0']:.1e} nats/token; by v0 "
          f"named v3 {metrics['behaviour_abs_s0']:.2f}")
    assert metrics["behaviour_abs_s0"] > 0.2 and metrics["groups_quarantined"] == 2 and metrics["skipped"]
    assert t.version == 3  # nothing trained on it, no version published
