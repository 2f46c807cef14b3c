"""Flow-GRPO update throughput: our trainer vs TRL's ``GRPOTrainer``, same model, batch and settings; prints JSON.

  .venv/bin/python bench/trainer.py [--batch 32] [--group-size 8] [--prompt-len 192] [--completion-len 64]
                                    [--hidden 128] [--layers 2] [--micro-batch 16] [--updates 2] [--repeats 5]
  .venv/bin/python bench/trainer.py --qwen05b --device cuda --peak-tflops 989   # a GPU run; never in CI

What is measured: one *update* — no generation, no checkpoint — on one prepared batch, the same for both:

* the model: ``build_tiny`` (random Qwen2-style, ``--hidden``/``--layers``), or with ``--qwen05b`` a random-init
  Qwen2 of the 0.5B shape (hidden 896, 24 layers, 14/2 heads, intermediate 4864, vocab 151936), float32 for both;
* the batch: ``--batch`` single-turn trajectories, ``--group-size`` completions per prompt (groups share their
  prompt), prompt and completion lengths drawn per row from [len/2, len] (seeded), rewards 0/1 per group, old
  log-probs of the initial policy; built with ``trainer.batch.build_batch`` from synthetic trajectory records;
* ours: ``Trainer._updates`` (what ``Trainer.step`` runs between building the batch and checkpointing): the
  reference log-probs, then ``--updates`` AdamW updates over micro-batches of ``--micro-batch`` rows;
* TRL: the same work through ``GRPOTrainer`` — the reference log-probs as ``_generate_and_score_completions``
  computes them, then per update ``training_step`` (TRL's ``compute_loss`` and backward) on each micro-batch, then
  gradient clipping, ``optimizer.step``, ``lr_scheduler.step``, ``zero_grad`` as the HF training loop does.
  Settings map one to one: ``num_iterations`` = updates, ``per_device_train_batch_size`` = micro-batch,
  ``epsilon``/``epsilon_high`` = ε_low/ε_high, ``beta`` = β, ``loss_type`` "grpo" = our "trajectory" aggregation on
  single-turn rows ("bnpo" = "token_mean"), AdamW (``optim="adamw_torch"``), constant LR, grad-norm clip 1.0.

tokens/s = real (prompt + completion) tokens of the batch × updates / seconds of the whole update (the same
definition as ``Trainer.step``'s ``tokens_per_s``). Both are warmed up once, then timed ``--repeats`` times in ABBA
order; ``ratio`` = ours / TRL of the median tokens/s. On a shared machine the wall clock follows other processes'
load, so two steadier ratios come with it: ``ratio_paired`` (median over repeats of TRL's seconds / ours, the two
run back to back) and ``ratio_cpu`` (of the median process CPU seconds; with ``--threads 1`` that is the work).
``--peak-tflops`` adds model FLOPs utilisation, 6 · params · tokens/s / peak. Progress goes to stderr; the last
stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch

from agentflow.llm.models import build_tiny
from agentflow.trainer.batch import TrainBatch, build_batch, fill_old_logprobs
from agentflow.trainer.checkpoint import ModelStore
from agentflow.trainer.grpo import GRPOConfig
from agentflow.trainer.loop import TrainConfig, Trainer

TRL_LOSS = {"trajectory": "grpo", "token_mean": "bnpo"}  # equal on single-turn rows (docs/flow-grpo.md)
QWEN05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
               intermediate_size=4864, vocab_size=151936)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32, help="trajectories (= rows, single-turn) per batch")
    p.add_argument("--group-size", type=int, default=8, help="G: completions per prompt")
    p.add_argument("--prompt-len", type=int, default=192, help="longest prompt (tokens); rows draw [len/2, len]")
    p.add_argument("--completion-len", type=int, default=64, help="longest completion (tokens)")
    p.add_argument("--hidden", type=int, default=128, help="tiny model hidden size")
    p.add_argument("--layers", type=int, default=2, help="tiny model layers")
    p.add_argument("--micro-batch", type=int, default=16, help="rows per forward/backward (gradient accumulation)")
    p.add_argument("--updates", type=int, default=2, help="k: optimizer updates per batch")
    p.add_argument("--eps-low", type=float, default=0.2)
    p.add_argument("--eps-high", type=float, default=0.3)
    p.add_argument("--beta", type=float, default=0.001, help="KL weight (> 0 adds a reference forward to both)")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--aggregation", choices=sorted(TRL_LOSS), default="trajectory")
    p.add_argument("--repeats", type=int, default=5, help="timed updates per trainer (medians reported)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    p.add_argument("--qwen05b", action="store_true", help="a random-init 0.5B Qwen2 instead of the tiny model")
    p.add_argument("--peak-tflops", type=float, default=None, help="device peak, for model FLOPs utilisation")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.batch % args.group_size or args.batch % args.micro_batch:
        p.error("--batch must be a multiple of --group-size and of --micro-batch")
    return args


def progress(message: str) -> None:
    print(f"[bench/trainer] {message}", file=sys.stderr, flush=True)


# --- model and batch ----------------------------------------------------------------------------------------------


def build_model(folder: Path, args) -> Path:
    """The tiny model (``build_tiny``), or the 0.5B Qwen2 shape with the tiny tokenizer beside it."""
    build_tiny(folder, seed=args.seed, hidden=args.hidden, layers=args.layers)
    if args.qwen05b:
        from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

        tiny = AutoConfig.from_pretrained(folder)
        config = Qwen2Config(**QWEN05B, max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=None,
                             eos_token_id=tiny.eos_token_id, pad_token_id=tiny.pad_token_id)
        torch.manual_seed(args.seed)
        Qwen2ForCausalLM(config).save_pretrained(folder)
    return folder


def synthetic_records(args, vocab: int) -> list[dict]:
    """Scored single-turn trajectory records: groups of G sharing a prompt, ragged lengths, rewards 0/1 per group
    (both present, so every group has signal). No served log-probs: ``fill_old_logprobs`` computes them."""
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
    """The batch on the CPU, with the old log-probs of the initial policy (so the first update is on-policy)."""
    batch = build_batch(synthetic_records(args, ours.policy.config.vocab_size), pad_id=ours.pad_id)
    filled = fill_old_logprobs(to_device(batch, args.device), ours.policy)
    return replace(batch, old_logp=filled.old_logp.cpu(), old_logp_missing=filled.old_logp_missing.cpu())


def to_device(batch: TrainBatch, device) -> TrainBatch:
    return replace(batch, **{f.name: getattr(batch, f.name).to(device) for f in fields(batch)
                             if isinstance(getattr(batch, f.name), torch.Tensor)})


@dataclass
class DeviceBatch(TrainBatch):
    """A CPU batch whose micro-batches land on ``device``: ``Trainer`` has no device setting (it slices batches
    with CPU index tensors), so on a GPU this is how its unchanged ``_updates`` runs there."""

    device: str = "cpu"

    def micro_batches(self, max_rows: int) -> list[TrainBatch]:
        return [to_device(s, self.device) for s in super().micro_batches(max_rows)]


# --- the two trainers ---------------------------------------------------------------------------------------------


def ours_trainer(model_dir: Path, work: Path, args) -> Trainer:
    grpo = GRPOConfig(group_size=args.group_size, batch_trajectories=args.batch, lr=args.lr, eps_low=args.eps_low,
                      eps_high=args.eps_high, beta=args.beta, aggregation=args.aggregation,
                      updates_per_batch=args.updates, max_staleness=None)
    trainer = Trainer(model_dir, ModelStore(work / "store"), TrainConfig(grpo=grpo, micro_batch_rows=args.micro_batch,
                                                                         max_length=None), seed=args.seed)
    trainer.policy.to(args.device)  # in place: the optimizer keeps the same parameters
    if trainer.reference is not None:
        trainer.reference.to(args.device)
    return trainer


def trl_trainer(model_dir: Path, work: Path, args):
    import datasets
    from transformers import AutoTokenizer
    from trl import GRPOConfig as TRLConfig, GRPOTrainer

    def no_reward(completions, **_):  # never called: there is no generation here
        return [0.0] * len(completions)

    config = TRLConfig(
        output_dir=str(work / "trl"), report_to="none", save_strategy="no", use_cpu=args.device == "cpu",
        bf16=False, fp16=False, seed=args.seed, per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=args.batch // args.micro_batch, num_generations=args.group_size,
        num_iterations=args.updates, max_completion_length=args.completion_len, beta=args.beta,
        epsilon=args.eps_low, epsilon_high=args.eps_high, loss_type=TRL_LOSS[args.aggregation],
        learning_rate=args.lr, lr_scheduler_type="constant", optim="adamw_torch", weight_decay=0.0,
        max_grad_norm=1.0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=no_reward, args=config, processing_class=tokenizer,
                          train_dataset=datasets.Dataset.from_dict({"prompt": ["x"] * args.batch}))
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
    model = trainer.model
    if trainer.beta != 0.0:
        with torch.no_grad():
            for m in micros:
                ids = torch.cat([m["prompt_ids"], m["completion_ids"]], 1)
                mask = torch.cat([m["prompt_mask"], m["completion_mask"]], 1)
                m["ref_per_token_logps"] = trainer._get_per_token_logps_and_entropies(
                    trainer.ref_model, ids, mask, m["completion_ids"].size(1), batch_size=len(ids))[0]
    losses = []
    for _ in range(updates):
        losses.append(sum(float(trainer.training_step(model, dict(m), m["num_items_in_batch"])) for m in micros))
        grad_norm = trainer._clip_grad_norm(model)
        trainer._get_grad_norm(model, grad_norm=grad_norm)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        model.zero_grad()
    return sum(losses) / len(losses)


def measure(updates: dict, args, tokens: int):
    """A warm-up, then ``args.repeats`` timed updates of each trainer, alternating so that drift in the machine's
    load hits both alike (ABBA): wall and CPU seconds per trainer, and each one's first (warm-up) loss."""
    wall: dict[str, list[float]] = {name: [] for name in updates}
    cpu: dict[str, list[float]] = {name: [] for name in updates}
    losses: dict[str, float] = {}
    names = list(updates)
    for r in range(args.repeats + 1):  # r == 0: the warm-up
        for name in names if r % 2 == 0 else names[::-1]:  # ABBA order: a linear drift cancels out
            loss, w, c = timed(updates[name], args.device)
            if r == 0:
                losses[name] = loss  # the first update, from the same weights: the two losses should agree
            else:
                wall[name].append(w)
                cpu[name].append(c)
            progress(f"{'warm-up' if r == 0 else f'repeat {r}'}: {name} {w:.3f} s wall, {c:.3f} s cpu "
                     f"({tokens / w:,.0f} tokens/s)")
    return wall, cpu, losses


# --- main ---------------------------------------------------------------------------------------------------------


def run(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stderr is for this bench's progress lines
    with tempfile.TemporaryDirectory(prefix="agentflow-bench-trainer-") as tmp:
        work = Path(tmp)
        progress(f"building the model ({'qwen05b' if args.qwen05b else f'tiny h{args.hidden} l{args.layers}'})")
        model_dir = build_model(work / "model", args)
        ours = ours_trainer(model_dir, work, args)
        params = sum(p.numel() for p in ours.policy.parameters())
        vocab = ours.policy.config.vocab_size

        batch = prepare_batch(ours, args)
        ours_batch = batch if args.device == "cpu" else DeviceBatch(**vars(batch), device=args.device)
        tokens = int(batch.attention_mask.sum()) * args.updates

        progress("building TRL's GRPOTrainer")
        trl = trl_trainer(model_dir, work, args)
        micros = trl_inputs(batch, args.micro_batch, ours.pad_id, trl.accelerator.device)

        wall, cpu, losses = measure({"ours": lambda: ours_update(ours, ours_batch),
                                     "trl": lambda: trl_update(trl, micros, args.updates)}, args, tokens)

    median = {k: statistics.median(v) for k, v in wall.items()}
    median_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    out = {
        "ours_tokens_per_s": tokens / median["ours"], "trl_tokens_per_s": tokens / median["trl"],
        "ratio": median["trl"] / median["ours"],
        "ours_update_s": median["ours"], "trl_update_s": median["trl"],
        "ours_cpu_s": median_cpu["ours"], "trl_cpu_s": median_cpu["trl"],
        "ratio_cpu": median_cpu["trl"] / median_cpu["ours"],
        "ratio_paired": statistics.median(t / o for o, t in zip(wall["ours"], wall["trl"])),
        "ours_update_s_all": wall["ours"], "trl_update_s_all": wall["trl"],
        "first_loss": losses,
        "tokens": tokens, "rows": len(batch), "response_tokens": batch.num_tokens,
        "padded_width": {"ours": batch.input_ids.shape[1], "trl": sum(micros[0][k].shape[1]
                                                                       for k in ("prompt_ids", "completion_ids"))},
        "model": {"kind": "qwen05b" if args.qwen05b else "tiny", "params": params, "vocab": vocab,
                  "hidden": ours.policy.config.hidden_size, "layers": ours.policy.config.num_hidden_layers},
        "settings": {k: getattr(args, k) for k in ("batch", "group_size", "prompt_len", "completion_len",
                                                   "micro_batch", "updates", "eps_low", "eps_high", "beta", "lr",
                                                   "aggregation", "repeats", "device", "seed")},
        "trl_loss_type": TRL_LOSS[args.aggregation], "dtype": "float32",
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
    }
    if args.peak_tflops:
        for name in ("ours", "trl"):
            out[f"{name}_mfu"] = 6 * params * out[f"{name}_tokens_per_s"] / (args.peak_tflops * 1e12)
    return out


def main(argv=None) -> dict:
    result = run(parse_args(argv))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
