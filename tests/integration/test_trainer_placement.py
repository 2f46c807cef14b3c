"""The GPU trainer's paths, on a CPU (trainer/placement.py, trainer/lora.py, batch.ResponseLogProbs):

* chunked response log-probs equal one full log-softmax (values and gradients), and a 32k-vocabulary forward and
  backward peaks far below the full logits' footprint (peak RSS of a child process, measured);
* bf16 compute (autocast, float32 master weights) gives the float32 loss within tolerance on the same batch;
* activation checkpointing leaves the gradients as they were;
* a LoRA step changes only the adapters; the reference (adapters disabled) is the base model; the merged export
  is peft's merge;
* micro-batches by a token budget keep trajectories whole.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest
import torch

from agentflow.errors import InvalidInput
from agentflow.llm.models import load_causal_lm
from agentflow.trainer.batch import ResponseLogProbs, _full_logprobs, build_batch, sequence_logprobs
from agentflow.trainer.checkpoint import ModelStore
from agentflow.trainer.grpo import GRPOConfig, policy_loss
from agentflow.trainer.loop import TrainConfig, Trainer
from agentflow.trainer.lora import LoraConfig
from agentflow.trainer.placement import Placement
from tests.integration.fsdp_worker import records

pytestmark = pytest.mark.slow


def rows(seed: int = 0, b: int = 5, length: int = 40, vocab: int = 500):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (b, length), generator=g)
    attn = torch.ones_like(ids)
    attn[1, 30:] = 0
    resp = torch.zeros_like(ids, dtype=torch.bool)
    resp[:, 12:30] = True
    resp[0, 3:40] = True
    return ids, attn, resp


def test_chunked_logprobs_equal_a_full_log_softmax(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir).eval()
    ids, attn, resp = rows()
    full, full_entropy = _full_logprobs(model, ids, attn, resp)
    full.sum().backward()
    full_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    chunked, entropy = ResponseLogProbs(model, chunk_tokens=7)(ids, attn, resp, with_entropy=True)
    chunked.sum().backward()
    assert float((chunked - full).abs().max()) <= 1e-5
    assert float((entropy - full_entropy).abs().max()) <= 1e-5
    assert max(float((p.grad - g).abs().max()) for p, g in zip(model.parameters(), full_grads)) <= 1e-5
    assert bool((chunked[resp] < 0).all()) and float(chunked[~resp].abs().max()) == 0.0


PEAK = textwrap.dedent("""
    import resource, sys, torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from agentflow.trainer.batch import ResponseLogProbs, _full_logprobs
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=32000, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2))
    ids = torch.randint(0, 32000, (8, 512))
    resp = torch.zeros_like(ids, dtype=torch.bool)
    resp[:, 64:] = True
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if sys.argv[1] == "full":
        logp, _ = _full_logprobs(model, ids, torch.ones_like(ids), resp)
    else:
        logp, _ = ResponseLogProbs(model, chunk_tokens=512)(ids, torch.ones_like(ids), resp)
    logp.sum().backward()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
""")


def test_chunked_logprobs_peak_far_below_the_full_logits():
    """8 rows x 512 tokens, vocabulary 32000: the full float32 logits alone are 8*512*32000*4 B = 500 MiB (and a
    log-softmax and its gradient hold more of that size); a chunk of 512 is 62.5 MiB."""
    peaks = {}
    for kind in ("full", "chunked"):
        run = subprocess.run([sys.executable, "-c", PEAK, kind], capture_output=True, text=True, timeout=300,
                             env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
        assert run.returncode == 0, run.stderr[-3000:]
        peaks[kind] = float(run.stdout.split()[-1])
    print(f"\npeak RSS growth (MiB): {peaks}")
    assert peaks["full"] > 500 and peaks["chunked"] < peaks["full"] / 3


def test_bf16_loss_is_within_tolerance_of_float32(tiny_model_dir):
    """The same batch and weights, float32 vs bf16 compute (autocast; log-softmax and loss in float32)."""
    batch = build_batch(records(0), pad_id=0)
    batch.old_logp[batch.response_mask] = -6.0  # off-policy: the ratio and both clips are in play
    cfg = GRPOConfig(group_size=4, batch_trajectories=8, beta=0.0)
    losses, logps = {}, {}
    for dtype in (torch.float32, torch.bfloat16):
        placement = Placement(load_causal_lm(tiny_model_dir), device=torch.device("cpu"), dtype=dtype)
        logp = sequence_logprobs(placement.root, batch.input_ids, batch.attention_mask, batch.response_mask)
        assert logp.dtype == torch.float32
        loss, _ = policy_loss(logp, batch.old_logp, None, batch.advantages, batch.response_mask, cfg,
                              traj_index=batch.traj_index)
        losses[dtype], logps[dtype] = float(loss), logp
    mask = batch.response_mask
    print(f"\nloss fp32 {losses[torch.float32]:.6f} bf16 {losses[torch.bfloat16]:.6f}; max |dlogp| "
          f"{float((logps[torch.float32] - logps[torch.bfloat16])[mask].abs().max()):.4f}")
    assert abs(losses[torch.bfloat16] - losses[torch.float32]) <= 0.02 * abs(losses[torch.float32])
    assert float((logps[torch.float32] - logps[torch.bfloat16])[mask].abs().mean()) <= 0.05


def test_activation_checkpointing_keeps_the_gradients(tiny_model_dir):
    """Same gradients, and the forward keeps far fewer activations for backward (the layers are recomputed)."""
    ids, attn, resp = rows(1)
    grads, kept = [], []
    for checkpointing in (False, True):
        placement = Placement(load_causal_lm(tiny_model_dir), device=torch.device("cpu"), dtype=torch.float32,
                              gradient_checkpointing=checkpointing)
        saved = []

        def pack(tensor):
            saved.append(tensor.numel() * tensor.element_size())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            logp = sequence_logprobs(placement.root, ids, attn, resp)
        logp.sum().backward()
        grads.append([p.grad for p in placement.parameters()])
        kept.append(sum(saved))
    print(f"\nbytes kept for backward: {kept[0]} without checkpointing, {kept[1]} with")
    assert kept[1] < kept[0] / 4
    assert max(float((a - b).abs().max()) for a, b in zip(*grads)) <= 1e-6


def test_a_lora_step_trains_only_the_adapters(tiny_model_dir, tmp_path):
    config = TrainConfig(grpo=GRPOConfig(group_size=4, batch_trajectories=8, beta=0.01, lr=1e-2, max_staleness=None),
                         lora=LoraConfig(rank=4, alpha=8), export="merged", peak_tflops=1.0)
    trainer = Trainer(tiny_model_dir, ModelStore(tmp_path / "store"), config)
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    for step in range(2):
        metrics = trainer.step(records(step))
    # MFU counts every weight's forward and input gradients, the adapters' weight gradients (peak 1 TFLOP/s)
    n_all, n_lora = (sum(p.numel() for p in ps) for ps in (trainer.policy.parameters(), trainer.placement.parameters()))
    assert 0 < n_lora < n_all
    assert metrics["mfu"] == pytest.approx((4 * n_all + 2 * n_lora) * metrics["tokens_per_s"] / 1e12)
    after = trainer.policy.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".lora_" in k for k in changed)
    assert any("lora_A" in k for k in changed) and any("lora_B" in k for k in changed)
    assert all(p.dtype == torch.float32 for p in trainer.placement.parameters())
    assert metrics["kl"] > 0  # the reference (adapters off) differs from the trained policy

    base = load_causal_lm(tiny_model_dir).eval()
    ids, attn, resp = rows(2)
    with torch.no_grad(), trainer.placement.adapters_disabled():
        reference = sequence_logprobs(trainer.placement.root, ids, attn, resp)
    assert float((reference - ResponseLogProbs(base)(ids, attn, resp)[0]).abs().max()) <= 1e-5

    version = tmp_path / "store" / "v000002"
    assert json.loads((version / "agentflow.json").read_text())["export"] == "merged"
    merged = load_causal_lm(version).eval()  # the merged export, as a server loads it
    with torch.no_grad():
        served = ResponseLogProbs(merged)(ids, attn, resp)[0]
        trained = sequence_logprobs(trainer.placement.root, ids, attn, resp)  # the trained peft model, unmerged
    assert float((served - trained).abs().max()) <= 1e-5


def test_a_store_trained_with_lora_resumes_only_with_the_same_adapters(tiny_model_dir, tmp_path):
    lora = LoraConfig(rank=4, alpha=8)
    config = TrainConfig(grpo=GRPOConfig(group_size=4, batch_trajectories=8, lr=1e-2, max_staleness=None),
                         lora=lora, export="adapter")
    store = ModelStore(tmp_path / "store")
    Trainer(tiny_model_dir, store, config).step(records(0))
    for other, said in ((replace(config, lora=LoraConfig()), "trains full weights"),
                        (replace(config, lora=replace(lora, rank=8)), "trains LoRA rank 8")):
        with pytest.raises(InvalidInput, match=f"version 1 .* was trained with LoRA rank 4 .*{said}"):
            Trainer(tiny_model_dir, store, other)
    assert Trainer(tiny_model_dir, store, replace(config, lora=replace(lora, alpha=16))).version == 1


def test_micro_batches_by_tokens_keep_trajectories_whole():
    batch = build_batch(records(3), pad_id=0)
    for budget in (0, 40, 120):
        shards = batch.micro_batches(256, budget)
        assert sum(s.num_trajectories for s in shards) == batch.num_trajectories
        assert sum(len(s) for s in shards) == len(batch)
        if budget:
            assert all(len(s) * s.input_ids.shape[1] <= budget or s.num_trajectories == 1 for s in shards)
    assert len(batch.micro_batches(256, 40)) > len(batch.micro_batches(256, 0)) == 1
