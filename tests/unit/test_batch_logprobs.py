"""``sequence_logprobs`` on right-padded training rows reproduces what the embedded engine recorded while sampling
(left-padded, batched ``generate``) on the tiny model, to 1e-4."""

import pytest
import torch

from agentflow.llm.base import Sampling
from agentflow.llm.embedded import EmbeddedEngine
from agentflow.trainer.batch import build_batch, fill_old_logprobs, sequence_logprobs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = EmbeddedEngine(tiny_model_dir, version="v7")
    yield e
    e.close()


def planner_record(tid, completions, reward) -> dict:
    turns = [{"planner": {"prompt_token_ids": c.prompt_token_ids, "token_ids": c.token_ids, "logprobs": c.logprobs,
                          "model_version": c.model_version}} for c in completions]
    return {"trajectory_id": tid, "group_id": "g", "turns": turns, "rewards": [{"value": reward, "source": "rule"}]}


def test_recomputed_logprobs_match_the_engine(engine):
    questions = ["What is 2 + 2?", "Name a colour of the sky, and explain at length why it is that colour.", "Hi"]
    prompts = [engine.encode_chat([{"role": "user", "content": q}]) for q in questions]
    sampled = engine.generate(prompts, Sampling(temperature=1.0, seed=3), max_new_tokens=[12, 20, 6])
    assert len({len(p) for p in prompts}) == 3 and all(c.token_ids for c in sampled)
    records = [planner_record("a", sampled[:2], 1.0), planner_record("b", sampled[2:], 0.0)]
    batch = build_batch(records, pad_id=engine.tokenizer.pad_token_id, current_version="v7", max_staleness=0)
    assert len(batch) == 3 and batch.versions == [7, 7, 7]

    with torch.no_grad():
        logp, entropy = sequence_logprobs(engine.model, batch.input_ids, batch.attention_mask, batch.response_mask,
                                          with_entropy=True)
    mask = batch.response_mask
    assert batch.num_tokens > 20 and (logp - batch.old_logp)[mask].abs().max() < 1e-4
    assert bool((logp[~mask] == 0).all()) and bool((entropy[mask] > 0).all())

    # without the logits_to_keep shortcut (a model that does not take it) the numbers are the same
    class Plain(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask=None):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask)

    with torch.no_grad():
        plain = sequence_logprobs(Plain(engine.model), batch.input_ids, batch.attention_mask, batch.response_mask)
    assert (plain - logp).abs().max() < 1e-5

    # rows whose served logprobs are absent get the same numbers recomputed
    for t in records[0]["turns"]:
        t["planner"]["logprobs"] = []
    refilled = fill_old_logprobs(build_batch(records, pad_id=engine.tokenizer.pad_token_id), engine.model)
    assert (refilled.old_logp - batch.old_logp)[mask].abs().max() < 1e-4
