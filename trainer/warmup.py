"""The format warm-up (docs/training.md): supervised steps on correct-format planner outputs before RL, so that a
random initialisation learns the output format without a preference between tools."""

from __future__ import annotations

import json
import time
from typing import Iterable, Sequence

import torch

from agentflow.domain.trajectory import Record
from agentflow.errors import InvalidInput
from agentflow.trainer.batch import sequence_logprobs
from agentflow.trainer.loop import Trainer, rounded_metrics


def tool_responses(tokenizer, tools: Sequence[str]) -> list[list[int]]:
    """The planner's response tokens for each tool under the tiny-deterministic profile: what structured decoding
    of ``{"tool": <name>}`` returns (the JSON text, then EOS)."""
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token) if tokenizer.eos_token else None
    return [tokenizer.encode(json.dumps({"tool": t}), add_special_tokens=False) + ([eos] if eos is not None else [])
            for t in tools]


def planner_prompts(records: Iterable[dict]) -> list[list[int]]:
    """The distinct planner prompts (token ids) of some records, in order of appearance."""
    seen: dict[tuple, None] = {}
    for record in records:
        for call in Record(record).planner_calls():
            ids = call.get("prompt_token_ids")
            if ids:
                seen.setdefault(tuple(ids), None)
    return [list(p) for p in seen]


def format_warmup(trainer: Trainer, prompts: Sequence[list[int]], responses: Sequence[list[int]], *,
                  steps: int = 30, lr: float = 3e-3, seed: int = 0, checkpoint_extra: dict | None = None,
                  checkpoint_files: dict[str, bytes] | None = None) -> dict:
    """Supervised warm-up on correct-format planner outputs, every prompt paired with *every* response equally.

    The loss is the mean cross-entropy of the response tokens, so the shared format tokens become near-certain and
    the choice between responses becomes uniform for every prompt: the warm-up teaches the format and no
    preference (a random initialisation can favour one tool strongly, which starves the others of samples).
    It runs on its own optimizer, is checkpointed as the next version, and becomes the KL reference.
    """
    if not prompts or not responses:
        raise InvalidInput("format_warmup needs prompts and responses")
    if trainer.config.lora.enabled or trainer.world.sharded:
        raise InvalidInput("the format warm-up is for tiny full-parameter planners on one process: not with LoRA "
                           "or under torchrun")
    started = time.perf_counter()
    rows = [(p, r) for p in prompts for r in responses]
    losses = supervised_steps(trainer.placement.root, rows, pad_id=trainer.pad_id, steps=steps, lr=lr, seed=seed,
                              max_grad_norm=trainer.config.max_grad_norm)
    trainer.version += 1
    metrics = {"warmup_loss_first": losses[0], "warmup_loss_last": losses[-1], "warmup_steps": steps,
               "warmup_prompts": len(prompts), "warmup_s": time.perf_counter() - started}
    trainer.store.save(trainer.policy, trainer.tokenizer, parent=trainer.version - 1, metrics=rounded_metrics(metrics),
                       extra={**trainer.metadata, **(checkpoint_extra or {}), "stage": "format_warmup",
                              "export": "full"},
                       version=trainer.version, state_dict=trainer.serving_weights(), files=checkpoint_files)
    trainer.reference_version = trainer.version
    if trainer.reference is not None:
        trainer.reference.lm.load_state_dict(trainer.policy.state_dict())
    return metrics


def supervised_steps(model, rows: Sequence[tuple[list[int], list[int]]], *, pad_id: int, steps: int, lr: float,
                     seed: int = 0, max_grad_norm: float = 1.0, batch: int = 96) -> list[float]:
    """``steps`` AdamW steps of supervised fine-tuning on ``(prompt, response)`` token ids, each on a random batch of
    ``batch`` rows: the loss is the mean cross-entropy of the response tokens. The losses, one a step."""
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    resp = torch.zeros_like(ids, dtype=torch.bool)
    for b, (p, r) in enumerate(rows):
        ids[b, : len(p) + len(r)] = torch.tensor(p + r)
        attn[b, : len(p) + len(r)] = 1
        resp[b, len(p): len(p) + len(r)] = True
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        pick = torch.randperm(len(rows), generator=generator)[: min(len(rows), batch)]
        logp = sequence_logprobs(model, ids[pick], attn[pick], resp[pick])
        loss = -(logp * resp[pick].to(logp.device)).sum() / resp[pick].sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses
