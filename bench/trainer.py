"""Flow-GRPO update throughput and peak memory: our trainer vs TRL's ``GRPOTrainer``, same model, batch and settings.

  .venv/bin/python bench/trainer.py [--batch 32] [--group-size 8] [--prompt-len 192] [--completion-len 64]
                                    [--shape tiny|qwen05b|qwen15b|qwen7b] [--hidden 128] [--layers 2]
                                    [--dtype float32|bfloat16] [--lora RANK] [--gradient-checkpointing]
                                    [--micro-batch 16] [--updates 2] [--repeats 5] [--only ours]
  .venv/bin/python bench/trainer.py --shape qwen05b --device cuda --peak-tflops 989   # a GPU run; never in CI
  bash bench/gpu_trainer.sh                                                          # the prepared GPU runs

What is measured: one *update* — no generation, no checkpoint — on one prepared batch, the same for both:

* the model: ``--shape tiny`` is ``build_tiny`` (random Qwen2-style, ``--hidden``/``--layers``, saved in float32);
  ``qwen05b``/``qwen15b``/``qwen7b`` are random-init Qwen2 models of those shapes (no download: the weights are
  noise, the work per token is the real model's), saved in bfloat16 (the values are then exact in either dtype):

  ======== ====== ====== ============= ============ ======= ======== =========
  shape    hidden layers heads (q/kv)  intermediate vocab   embedding params
  ======== ====== ====== ============= ============ ======= ======== =========
  qwen05b     896     24 14 / 2               4864  151936  tied     0.49 B
  qwen15b    1536     28 12 / 2               8960  151936  tied     1.54 B
  qwen7b     3584     28 28 / 4              18944  152064  untied   7.62 B
  ======== ====== ====== ============= ============ ======= ======== =========

  (``--qwen05b`` is an alias of ``--shape qwen05b``);
* the batch: ``--batch`` single-turn trajectories, ``--group-size`` completions per prompt (groups share their
  prompt), prompt and completion lengths drawn per row from [len/2, len] (seeded), rewards 0/1 per group, old
  log-probs of the initial policy (ours computes them, in the run's precision, and both trainers get the same);
  built with ``trainer.batch.build_batch`` from synthetic trajectory records;
* ours: ``Trainer._updates`` (what ``Trainer.step`` runs between building the batch and checkpointing): the
  reference log-probs, then ``--updates`` AdamW updates over micro-batches of ``--micro-batch`` rows;
* TRL: the same work through ``GRPOTrainer`` — the reference log-probs as ``_generate_and_score_completions``
  computes them, then per update ``training_step`` (TRL's ``compute_loss`` and backward) on each micro-batch, then
  gradient clipping, ``optimizer.step``, ``lr_scheduler.step``, ``zero_grad`` as the HF training loop does.
  Settings map one to one: ``num_iterations`` = updates, ``per_device_train_batch_size`` = micro-batch,
  ``epsilon``/``epsilon_high`` = ε_low/ε_high, ``beta`` = β, ``loss_type`` "grpo" = our "trajectory" aggregation on
  single-turn rows ("bnpo" = "token_mean"), AdamW (``optim="adamw_torch"``), constant LR, grad-norm clip 1.0.
  ``--only ours`` skips TRL (e.g. a memory check of a setting TRL is not compared on).

Precision, LoRA, activation checkpointing — the same scheme on both sides:

* ``--dtype float32``: everything float32. ours ``TrainConfig(dtype="float32")``; TRL ``bf16=False``, the model
  loaded in float32 (``model_init_kwargs={"dtype": "float32"}``).
* ``--dtype bfloat16`` (the default on CUDA; float32 is the default on CPU): the trained weights and AdamW's state
  float32, the forward and backward in bf16 autocast, log-probs and loss in float32. ours
  ``TrainConfig(dtype="bfloat16")`` (``trainer/placement.py``); TRL ``bf16=True`` with the model loaded in float32:
  accelerate's ``mixed_precision="bf16"``, and TRL runs every log-prob forward under ``accelerator.autocast()``
  (``_get_per_token_logps_and_entropies``), i.e. the same float32-master + bf16-compute scheme. One difference is
  TRL's own: its KL reference model is a second copy in the policy's dtype (float32); ours keeps the frozen reference
  in bf16.
* ``--lora RANK`` (0: full-parameter): peft adapters of rank RANK, alpha 2·RANK, dropout 0, on ``"all-linear"``
  (every ``nn.Linear`` of the decoder; peft leaves out the LM head) on both. ours ``TrainConfig(lora=LoraConfig(
  rank=RANK, alpha=2·RANK))``; TRL ``GRPOTrainer(peft_config=peft.LoraConfig(r=RANK, lora_alpha=2·RANK,
  target_modules="all-linear"))``. The frozen base is stored in the compute dtype (TRL: ``model_init_kwargs`` dtype
  bfloat16 under ``--dtype bfloat16``), the adapters in float32 (peft's ``autocast_adapter_dtype``) on both; the KL
  reference is the base with the adapters disabled on both.
* ``--gradient-checkpointing``: the decoder layers recomputed in backward, non-reentrant, on both. ours
  ``TrainConfig(gradient_checkpointing=True)``; TRL ``gradient_checkpointing=True`` with ``{"use_reentrant":
  False}``, enabled on the model the way the HF training loop does it (``activation_checkpointing_enable``); without
  the flag TRL's default (on) is turned off, so the two always agree.

tokens/s = real (prompt + completion) tokens of the batch × updates / seconds of the whole update (the same
definition as ``Trainer.step``'s ``tokens_per_s``). Both are warmed up once, then timed ``--repeats`` times in ABBA
order; ``ratio`` = ours / TRL of the median tokens/s. On a shared machine the wall clock follows other processes'
load, so two steadier ratios come with it: ``ratio_paired`` (median over repeats of TRL's seconds / ours, the two
run back to back) and ``ratio_cpu`` (of the median process CPU seconds; with ``--threads 1`` that is the work).

``--peak-tflops`` (H200 bf16 dense: 989) adds model FLOPs utilisation, ``mfu = F · tokens/s / peak`` with F the
model FLOPs per token of one update, ``F = 4·N + 2·N_trainable``: N every parameter (base and adapters), since the
forward (2·N) and the backward's input gradients (2·N) go through the whole model, and weight gradients (2 per
parameter) only for what trains. Full-parameter training gives the usual ``6·N``; LoRA ``≈ 4·N``. Not counted (as
MFU conventions go): the reference forward (once per batch, not per update), activation recomputation, attention's
``T²`` term, and the LM head running on response positions only (both trainers project only those).

Peak memory, per trainer (``peak_mem_mb``, MiB; ``mem_method`` names how it was read): the trainer's own tensors
when its update starts (weights, gradients, optimizer state, its reference model; shared storage counted once) plus
the most the process's memory rose above its level at that start during one timed update (max over repeats), so the
other trainer's resident state, alive in the same process, is not charged to it (``mem_detail``: ``state_mb``,
``transient_mb``). ``cuda_max_allocated``, on a GPU: ``torch.cuda.max_memory_allocated``, reset before each update;
``mem_detail`` adds ``process_peak_mb``, the device's absolute peak during the updates (with ``--only ours``: the
run's need), and ``process_reserved_peak_mb`` (``max_memory_reserved``: what PyTorch's caching allocator held,
fragmentation included — the number to hold against the device's capacity). A CPU has no allocator statistic:
``rss_hwm`` reads the kernel's peak resident set size (VmHWM, reset through ``/proc/self/clear_refs`` before each
update); ``rss_sampled``, where that reset is not allowed, samples VmRSS every millisecond from a thread. RSS is a
rough measure: the C allocator keeps freed pages for reuse, so memory that one update freed can serve the next
update's rise without showing up (a tiny-model run can show ours rising 0 MiB), and it counts non-tensor memory too.
For CPU numbers that track live tensors, run with ``MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=65536``
(glibc then returns every large block when it is freed; the updates get slower).

Progress goes to stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import torch

from agentflow.llm.models import build_tiny
from agentflow.trainer.batch import TrainBatch, build_batch, fill_old_logprobs
from agentflow.trainer.checkpoint import ModelStore
from agentflow.trainer.grpo import GRPOConfig
from agentflow.trainer.lora import LoraConfig
from agentflow.trainer.loop import TrainConfig, Trainer
from agentflow.trainer.placement import World
from agentflow.trainer.metrics import flops_per_token, mfu

TRL_LOSS = {"trajectory": "grpo", "token_mean": "bnpo"}  # equal on single-turn rows (docs/flow-grpo.md)
SHAPES = {  # random-init Qwen2 shapes (Qwen2-0.5B, Qwen2-1.5B, Qwen2.5-7B)
    "qwen05b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True},
    "qwen15b": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
                "intermediate_size": 8960, "vocab_size": 151936, "tie_word_embeddings": True},
    "qwen7b": {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
               "intermediate_size": 18944, "vocab_size": 152064, "tie_word_embeddings": False},
}
QWEN05B = SHAPES["qwen05b"]
LORA_TARGETS = "all-linear"
MB = 2 ** 20


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32, help="trajectories (= rows, single-turn) per batch")
    p.add_argument("--group-size", type=int, default=8, help="G: completions per prompt")
    p.add_argument("--prompt-len", type=int, default=192, help="longest prompt (tokens); rows draw [len/2, len]")
    p.add_argument("--completion-len", type=int, default=64, help="longest completion (tokens)")
    p.add_argument("--shape", choices=["tiny", *SHAPES], default="tiny",
                   help="the model: tiny (--hidden/--layers), or a random-init Qwen2 shape")
    p.add_argument("--qwen05b", dest="shape", action="store_const", const="qwen05b", default=argparse.SUPPRESS,
                   help="alias of --shape qwen05b")
    p.add_argument("--hidden", type=int, default=128, help="tiny model hidden size")
    p.add_argument("--layers", type=int, default=2, help="tiny model layers")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help="bfloat16: fp32 master weights, bf16 compute (default on cuda); float32 (default on cpu)")
    p.add_argument("--lora", type=int, default=0, metavar="RANK",
                   help="LoRA rank on all linear layers, alpha 2*RANK (0: full-parameter training)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="recompute decoder layers in backward")
    p.add_argument("--micro-batch", type=int, default=16, help="rows per forward/backward (gradient accumulation)")
    p.add_argument("--updates", type=int, default=2, help="k: optimizer updates per batch")
    p.add_argument("--eps-low", type=float, default=0.2)
    p.add_argument("--eps-high", type=float, default=0.3)
    p.add_argument("--beta", type=float, default=0.001, help="KL weight (> 0 adds a reference forward to both)")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--aggregation", choices=sorted(TRL_LOSS), default="trajectory")
    p.add_argument("--repeats", type=int, default=5, help="timed updates per trainer (medians reported)")
    p.add_argument("--only", choices=["ours"], default=None, help="run only our trainer (no TRL, no ratios)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    p.add_argument("--peak-tflops", type=float, default=None, help="device peak, for model FLOPs utilisation")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fake-world", type=int, default=1, metavar="N",
                   help="measure rank 0 of an N-rank FSDP2 job on this one device (a fake process group): memory, "
                        "not learning; implies --only ours")
    args = p.parse_args(argv)
    if args.fake_world < 1:
        p.error("--fake-world must be >= 1")
    if args.fake_world > 1:
        args.only = "ours"
    if args.batch % args.group_size or args.batch % args.micro_batch:
        p.error("--batch must be a multiple of --group-size and of --micro-batch")
    if args.lora < 0:
        p.error("--lora must be >= 0")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    return args


def progress(message: str) -> None:
    print(f"[bench/trainer] {message}", file=sys.stderr, flush=True)


# --- model and batch ----------------------------------------------------------------------------------------------


def build_model(work: Path, args) -> Path:
    """The tiny model (``build_tiny``) as a folder; a Qwen2 shape (random init, bf16, on ``--device`` for speed)
    written straight into the model store as version 0, with the tiny tokenizer (the batch is token ids anyway)."""
    tiny = build_tiny(work / "tiny", seed=args.seed, hidden=args.hidden, layers=args.layers)
    if args.shape == "tiny":
        return tiny
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    config = Qwen2Config(**SHAPES[args.shape], max_position_embeddings=4096, bos_token_id=None,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(args.seed)
    with torch.device(args.device):
        model = Qwen2ForCausalLM._from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    saved = ModelStore(work / "store").save(model, tokenizer, parent=None,
                                            extra={"base_model": f"random-init {args.shape}", "export": "full"})
    del model
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return saved.path


def synthetic_records(args, vocab: int) -> list[dict]:
    """Scored single-turn trajectory records: groups of G sharing a prompt, ragged lengths, rewards 0/1 per group
    (both present, so every group has signal). No served log-probs: ``prepare_batch`` computes them."""
    rng = random.Random(args.seed)
    records = []
    for g in range(args.batch // args.group_size):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(args.prompt_len // 2, args.prompt_len))]
        rewards = [i % 2 for i in range(args.group_size)]
        rng.shuffle(rewards)
        for i, reward in enumerate(rewards):
            response = [rng.randrange(3, vocab) for _ in range(rng.randint(max(1, args.completion_len // 2),
                                                                            args.completion_len))]
            records.append({"trajectory_id": f"g{g}-t{i}", "group_id": f"g{g}",
                            "turns": [{"planner": {"prompt_token_ids": prompt, "token_ids": response,
                                                   "model_version": "v0"}}],
                            "rewards": [{"source": "rule", "value": float(reward)}]})
    return records


def prepare_batch(ours: Trainer, args) -> TrainBatch:
    """The batch on the CPU, with the old log-probs of the initial policy from our placement (its device and
    precision), so the first update is on-policy; TRL gets the same old log-probs."""
    batch = build_batch(synthetic_records(args, ours.policy.config.vocab_size), pad_id=ours.pad_id)
    return fill_old_logprobs(batch, ours.placement.root)


# --- the two trainers ---------------------------------------------------------------------------------------------


def lora_config(args) -> LoraConfig:
    return LoraConfig(rank=args.lora, alpha=2.0 * args.lora, targets=LORA_TARGETS) if args.lora else LoraConfig()


def ours_trainer(model_dir: Path, work: Path, args) -> Trainer:
    grpo = GRPOConfig(group_size=args.group_size, batch_trajectories=args.batch, lr=args.lr, eps_low=args.eps_low,
                      eps_high=args.eps_high, beta=args.beta, aggregation=args.aggregation,
                      updates_per_batch=args.updates, max_staleness=None)
    config = TrainConfig(grpo=grpo, micro_batch_rows=args.micro_batch, max_length=None, device=args.device,
                         dtype=args.dtype, gradient_checkpointing=args.gradient_checkpointing, lora=lora_config(args),
                         objective="flow_grpo")  # TRL's GRPO loss, term for term
    world = fake_world(args.fake_world) if args.fake_world > 1 else None
    trainer = Trainer(model_dir, ModelStore(work / "store"), config, seed=args.seed, world=world)
    if world is not None:
        finite_updates(trainer)
    return trainer


def fake_world(size: int) -> World:
    """Rank 0 of ``size`` ranks in a fake process group: FSDP2 shards every parameter ``size`` ways and its
    collectives do nothing, so this process holds exactly what one rank of the real job holds (its shards, the
    gathered layer in flight, its activations) while the values it computes are noise."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=size)
    return World(0, size, None)


def finite_updates(trainer: Trainer) -> None:
    """Under a fake world the gathered weights are whatever the buffers held, so losses and gradients may be NaN
    and the trainer would skip the optimizer step (and never allocate AdamW's state): zero the non-finite gradient
    entries first, so that every update does what a real one does."""
    clip = trainer.placement.clip_grad_norm

    def clip_finite(max_norm: float) -> float:
        for p in trainer.placement.parameters():
            if p.grad is not None:
                grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                grad.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        return clip(max_norm)

    trainer.placement.clip_grad_norm = clip_finite


def trl_trainer(model_dir: Path, work: Path, args):
    import datasets
    from transformers import AutoTokenizer
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    def no_reward(completions, **_):  # never called: there is no generation here
        return [0.0] * len(completions)

    peft_config = None
    if args.lora:
        import peft

        peft_config = peft.LoraConfig(r=args.lora, lora_alpha=2 * args.lora, lora_dropout=0.0,
                                      target_modules=LORA_TARGETS, bias="none", task_type="CAUSAL_LM")
    # the weights that train are float32 (bf16 autocast does the compute); LoRA's frozen base is in the compute dtype
    load_dtype = "bfloat16" if args.lora and args.dtype == "bfloat16" else "float32"
    config = TRLConfig(
        output_dir=str(work / "trl"), report_to="none", save_strategy="no", use_cpu=args.device == "cpu",
        bf16=args.dtype == "bfloat16", fp16=False, model_init_kwargs={"dtype": load_dtype},
        gradient_checkpointing=args.gradient_checkpointing, gradient_checkpointing_kwargs={"use_reentrant": False},
        seed=args.seed, per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=args.batch // args.micro_batch, num_generations=args.group_size,
        num_iterations=args.updates, max_completion_length=args.completion_len, beta=args.beta,
        epsilon=args.eps_low, epsilon_high=args.eps_high, loss_type=TRL_LOSS[args.aggregation],
        learning_rate=args.lr, lr_scheduler_type="constant", optim="adamw_torch", weight_decay=0.0,
        max_grad_norm=1.0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=no_reward, args=config, processing_class=tokenizer,
                          train_dataset=datasets.Dataset.from_dict({"prompt": ["x"] * args.batch}),
                          peft_config=peft_config)
    if config.gradient_checkpointing:  # what the HF training loop (Trainer._inner_training_loop) does on start
        kwargs = dict(config.gradient_checkpointing_kwargs or {})
        if hasattr(trainer.model, "activation_checkpointing_enable"):
            trainer.model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    trainer.create_optimizer_and_scheduler(num_training_steps=10_000)
    trainer._prepare_inputs = lambda inputs: inputs  # the inputs are prepared already: no generation
    trainer.current_gradient_accumulation_steps = args.batch // args.micro_batch
    return trainer


def trl_inputs(batch: TrainBatch, micro: int, pad_id: int, device) -> list[dict]:
    """Our batch as TRL's micro-batch dicts: prompts left-padded, completions right-padded, the same old log-probs
    and advantages, ``num_items_in_batch`` the batch's completion tokens."""
    rows = []
    for b in range(len(batch)):
        resp = batch.response_mask[b].nonzero().squeeze(-1)
        first, last = int(resp[0]), int(resp[-1]) + 1
        rows.append((batch.input_ids[b, :first], batch.input_ids[b, first:last], batch.old_logp[b, first:last]))
    P, C = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    items = torch.tensor(float(batch.num_tokens), device=device)
    out = []
    for start in range(0, len(rows), micro):
        chunk = rows[start:start + micro]
        n = len(chunk)
        d = {"prompt_ids": torch.full((n, P), pad_id), "prompt_mask": torch.zeros(n, P, dtype=torch.long),
             "completion_ids": torch.full((n, C), pad_id), "completion_mask": torch.zeros(n, C, dtype=torch.long),
             "old_per_token_logps": torch.zeros(n, C), "advantages": batch.advantages[start:start + n].clone()}
        for i, (prompt, completion, old) in enumerate(chunk):
            d["prompt_ids"][i, P - len(prompt):], d["prompt_mask"][i, P - len(prompt):] = prompt, 1
            d["completion_ids"][i, :len(completion)], d["completion_mask"][i, :len(completion)] = completion, 1
            d["old_per_token_logps"][i, :len(completion)] = old
        out.append({**{k: v.to(device) for k, v in d.items()}, "num_items_in_batch": items})
    return out


# --- one timed update each ----------------------------------------------------------------------------------------


def sync(device) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device):
    """``fn()``'s result with its wall-clock and process CPU seconds (CPU time is the steadier number on a shared
    machine: other processes' load stretches the wall clock, not the work)."""
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    sync(device)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def ours_update(trainer: Trainer, batch: TrainBatch) -> float:
    """``Trainer._updates``: reference log-probs, then k updates over micro-batches; returns the mean loss."""
    return trainer._updates(batch)["loss"]


def trl_update(trainer, micros: list[dict], updates: int) -> float:
    """The same work through GRPOTrainer (see the module docstring); returns the mean loss."""
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import use_adapter

    model = trainer.model
    if trainer.beta != 0.0:  # as _generate_and_score_completions: no grad, checkpointing off, adapters off for LoRA
        with torch.no_grad(), disable_gradient_checkpointing(model, trainer.args.gradient_checkpointing_kwargs):
            for m in micros:
                ids = torch.cat([m["prompt_ids"], m["completion_ids"]], 1)
                mask = torch.cat([m["prompt_mask"], m["completion_mask"]], 1)
                inputs = (ids, mask, m["completion_ids"].size(1))
                if trainer.ref_model is not None:
                    ref = trainer._get_per_token_logps_and_entropies(trainer.ref_model, *inputs, batch_size=len(ids))
                else:
                    unwrapped = trainer.accelerator.unwrap_model(model)
                    with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None):
                        ref = trainer._get_per_token_logps_and_entropies(model, *inputs, batch_size=len(ids))
                m["ref_per_token_logps"] = ref[0]
    losses = []
    for _ in range(updates):
        losses.append(sum(float(trainer.training_step(model, dict(m), m["num_items_in_batch"])) for m in micros))
        grad_norm = trainer._clip_grad_norm(model)
        trainer._get_grad_norm(model, grad_norm=grad_norm)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        model.zero_grad()
    return sum(losses) / len(losses)


# --- memory -------------------------------------------------------------------------------------------------------


def state_bytes(device: str, modules, optimizer) -> int:
    """Bytes of a trainer's own tensors on ``device``: parameters, their gradients, buffers, optimizer state; a
    storage shared by several (tied embeddings) counted once."""
    kind, seen, total = torch.device(device).type, set(), 0
    optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper, if any
    tensors = [t for m in modules for p in m.parameters() for t in (p, p.grad)]
    tensors += [b for m in modules for b in m.buffers()]
    tensors += [v for state in optimizer.state.values() for v in state.values()]
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t  # a sharded (FSDP2) tensor: this rank's shard
        if not isinstance(t, torch.Tensor) or t.device.type != kind:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


class PeakMemory:
    """The process's memory at the start of a block and its peak within: ``cuda_max_allocated`` on a GPU, else the
    resident set size — the kernel's high-water mark reset before the block (``rss_hwm``), or VmRSS sampled from a
    thread every millisecond where that reset is not allowed (``rss_sampled``)."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.method = "cuda_max_allocated" if self.cuda else ("rss_hwm" if self._reset_hwm() else "rss_sampled")
        self.start = self.peak = self.reserved = 0

    @staticmethod
    def _reset_hwm() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
            return True
        except OSError:
            return False

    @staticmethod
    def _status(field: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"/proc/self/status has no {field}")

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            self.start = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        elif self.method == "rss_hwm":
            self._reset_hwm()
            self.start = self._status("VmRSS")
        else:
            self.start = self.peak = self._status("VmRSS")
            self._running = True
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while self._running:
            self.peak = max(self.peak, self._status("VmRSS"))
            time.sleep(0.001)

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
            self.reserved = torch.cuda.max_memory_reserved()  # what the caching allocator held from the device
        elif self.method == "rss_hwm":
            self.peak = self._status("VmHWM")
        else:
            self._running = False
            self._thread.join()
            self.peak = max(self.peak, self._status("VmRSS"))
        return False


def measure(updates: dict, states: dict, args, tokens: int):
    """A warm-up, then ``args.repeats`` timed updates of each trainer, alternating so that drift in the machine's
    load hits both alike (ABBA): wall and CPU seconds per trainer, each one's first (warm-up) loss, and per timed
    update its own tensors' bytes at the start (``states[name]()``), the process's memory then and its peak (and
    the ``PeakMemory`` method that read them)."""
    wall: dict[str, list[float]] = {name: [] for name in updates}
    cpu: dict[str, list[float]] = {name: [] for name in updates}
    memory: dict[str, list[tuple[int, int, int, int]]] = {name: [] for name in updates}
    losses: dict[str, float] = {}
    names, method = list(updates), None
    for r in range(args.repeats + 1):  # r == 0: the warm-up
        for name in names if r % 2 == 0 else names[::-1]:  # ABBA order: a linear drift cancels out
            own = states[name]()
            with PeakMemory(args.device) as mem:
                loss, w, c = timed(updates[name], args.device)
            method = mem.method
            if r == 0:
                losses[name] = loss  # the first update, from the same weights: the two losses should agree
            else:
                wall[name].append(w)
                cpu[name].append(c)
                memory[name].append((own, mem.start, mem.peak, mem.reserved))
            progress(f"{'warm-up' if r == 0 else f'repeat {r}'}: {name} {w:.3f} s wall, {c:.3f} s cpu "
                     f"({tokens / w:,.0f} tokens/s), memory {own / MB:,.0f} MB own + "
                     f"{(mem.peak - mem.start) / MB:,.0f} MB rise")
    return wall, cpu, losses, memory, method


def memory_report(memory: dict) -> dict:
    """Per trainer: its tensors at the start of a timed update + the most memory rose in one (max over repeats)."""
    out = {}
    for name, samples in memory.items():
        state = max(s[0] for s in samples)
        transient = max(peak - start for _, start, peak, _ in samples)
        out[name] = {"peak_mb": (state + transient) / MB, "state_mb": state / MB, "transient_mb": transient / MB,
                     "process_peak_mb": max(s[2] for s in samples) / MB}
        if any(s[3] for s in samples):
            out[name]["process_reserved_peak_mb"] = max(s[3] for s in samples) / MB
    return out


# --- main ---------------------------------------------------------------------------------------------------------


def run(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stderr is for this bench's progress lines
    # transformers 5's renames (gradient_checkpointing* -> activation_checkpointing*), hit by TRL's code and ours
    warnings.filterwarnings("ignore", message=".* is deprecated and will be removed in v6", category=FutureWarning)
    both = args.only is None
    with tempfile.TemporaryDirectory(prefix="agentflow-bench-trainer-") as tmp:
        work = Path(tmp)
        progress(f"building the model ({args.shape if args.shape != 'tiny' else f'tiny h{args.hidden} l{args.layers}'}"
                 f"), {args.dtype}, {f'LoRA rank {args.lora}' if args.lora else 'full-parameter'}"
                 f"{', gradient checkpointing' if args.gradient_checkpointing else ''}, on {args.device}")
        model_dir = build_model(work, args)
        ours = ours_trainer(model_dir, work, args)
        params = sum(p.numel() for p in ours.policy.parameters())
        trainable = sum(p.numel() for p in ours.placement.parameters())
        lm_config = ours.policy.config

        batch = prepare_batch(ours, args)
        tokens = int(batch.attention_mask.sum()) * args.updates
        modules = [ours.placement.root] + ([ours.reference.root] if ours.reference is not None else [])
        updates = {"ours": lambda: ours_update(ours, batch)}
        states = {"ours": lambda: state_bytes(args.device, modules, ours.optimizer)}

        if both:
            progress("building TRL's GRPOTrainer")
            trl = trl_trainer(ours.store.get(0).path, work, args)
            micros = trl_inputs(batch, args.micro_batch, ours.pad_id, trl.accelerator.device)
            trl_modules = [trl.model] + ([trl.ref_model] if trl.ref_model is not None else [])
            updates["trl"] = lambda: trl_update(trl, micros, args.updates)
            states["trl"] = lambda: state_bytes(args.device, trl_modules, trl.optimizer)

        try:
            wall, cpu, losses, memory, mem_method = measure(updates, states, args, tokens)
        finally:
            if args.fake_world > 1:
                import torch.distributed as dist

                dist.destroy_process_group()

    median = {k: statistics.median(v) for k, v in wall.items()}
    median_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    mem = memory_report(memory)
    flops = flops_per_token(params, trainable)
    out: dict = {}
    for name in wall:
        out[f"{name}_tokens_per_s"] = tokens / median[name]
    if both:
        out.update(ratio=median["trl"] / median["ours"],
                   ratio_cpu=median_cpu["trl"] / median_cpu["ours"],
                   ratio_paired=statistics.median(t / o for o, t in zip(wall["ours"], wall["trl"])))
    for name in wall:
        out.update({f"{name}_update_s": median[name], f"{name}_cpu_s": median_cpu[name],
                    f"{name}_update_s_all": wall[name]})
    out.update({
        "peak_mem_mb": {name: m["peak_mb"] for name, m in mem.items()},
        "mem_method": mem_method, "mem_detail": mem,
        "first_loss": losses,
        "tokens": tokens, "rows": len(batch), "response_tokens": batch.num_tokens,
        "dtype": args.dtype, "gradient_checkpointing": args.gradient_checkpointing,
        "lora": ({"rank": args.lora, "alpha": 2 * args.lora, "targets": LORA_TARGETS} if args.lora else None),
        "model": {"kind": args.shape, "params": params, "trainable_params": trainable, "vocab": lm_config.vocab_size,
                  "hidden": lm_config.hidden_size, "layers": lm_config.num_hidden_layers},
        "flops_per_token": flops,
        "settings": {k: getattr(args, k) for k in ("batch", "group_size", "prompt_len", "completion_len",
                                                   "micro_batch", "updates", "eps_low", "eps_high", "beta", "lr",
                                                   "aggregation", "repeats", "device", "seed", "shape", "dtype",
                                                   "lora", "gradient_checkpointing", "only", "fake_world")},
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "fake_world": args.fake_world,
    })
    if both:
        out["trl_loss_type"] = TRL_LOSS[args.aggregation]
        out["padded_width"] = {"ours": batch.input_ids.shape[1],
                               "trl": sum(micros[0][k].shape[1] for k in ("prompt_ids", "completion_ids"))}
    if args.device.startswith("cuda"):
        out["gpu"] = torch.cuda.get_device_name()
    if args.peak_tflops:
        for name in wall:
            out[f"{name}_mfu"] = mfu(flops, out[f"{name}_tokens_per_s"], args.peak_tflops, devices=1)
    return out


def main(argv=None) -> dict:
    result = run(parse_args(argv))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
