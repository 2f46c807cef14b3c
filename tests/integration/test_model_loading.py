"""Loading models from several threads at once (a server's admin API and its version follower do).

transformers' from_pretrained swaps PreTrainedModel.tie_weights and the weight-init functions for no-ops and back;
loads that overlap in threads can leave the no-ops installed, and every later model then has an untied,
uninitialised lm_head. ``load_causal_lm`` serialises the loads and checks the tie."""

import threading

import pytest
import torch

from agentflow.errors import EngineError
from agentflow.llm.models import load_causal_lm


def tied(model) -> bool:
    return model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_concurrent_loads_leave_later_loads_tied_and_exact(tiny_model_dir):
    reference = load_causal_lm(tiny_model_dir).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        expected = reference(ids).logits
    for _ in range(3):
        loaded = []
        threads = [threading.Thread(target=lambda: loaded.append(load_causal_lm(tiny_model_dir))) for _ in range(3)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        loaded.append(load_causal_lm(tiny_model_dir))
        assert len(loaded) == 4 and all(tied(m) for m in loaded)
        with torch.no_grad():
            assert all(torch.equal(m.eval()(ids).logits, expected) for m in loaded)


def test_a_broken_loading_state_is_an_error_not_garbage(tiny_model_dir, monkeypatch):
    from transformers import PreTrainedModel

    monkeypatch.setattr(PreTrainedModel, "tie_weights", lambda self, *a, **k: None)  # the stuck no-op
    with pytest.raises(EngineError, match="not.*tied|did not get tied"):
        load_causal_lm(tiny_model_dir)
