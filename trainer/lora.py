"""LoRA for the planner (``peft``): its settings, adapters on a model, and adapters merged into a state dict.

Importing this module does not import torch: ``LoraConfig`` is a setting of ``agentflow train``.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

from agentflow import cli_args
from agentflow.config import setting
from agentflow.errors import InvalidInput

if typing.TYPE_CHECKING:
    import torch

EXPORTS = ("adapter", "merged")  # what a LoRA version folder holds


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters (``peft``) on the planner's linear layers; rank 0 trains every weight."""

    rank: int = setting(0, "LoRA rank (0: full-parameter training)", cli_args.integer(0))
    alpha: float = setting(32.0, "LoRA alpha (the update is scaled by alpha / rank)",
                           cli_args.number(0, lo_open=True))
    dropout: float = setting(0.0, "dropout on the adapters' input", cli_args.number(0, 1, hi_open=True))
    targets: str = setting("all-linear", "modules that get adapters: all-linear, or names (q_proj,v_proj,...)",
                           cli_args.names())

    def __post_init__(self):
        if self.rank < 0 or self.alpha <= 0 or not 0 <= self.dropout < 1 or not self.targets.strip():
            raise InvalidInput("lora: rank must be >= 0, alpha > 0, dropout in [0, 1), targets not empty")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def target_modules(self) -> str | list[str]:
        names = [t.strip() for t in self.targets.split(",") if t.strip()]
        return "all-linear" if names == ["all-linear"] else names

    def describe(self) -> dict:
        return {"rank": self.rank, "alpha": self.alpha, "dropout": self.dropout, "targets": self.target_modules()}


def with_adapters(lm, lora: LoraConfig, dtype: torch.dtype):
    """peft adapters on ``lm``; the frozen base goes to ``dtype``, the adapters stay float32."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    lm = lm.to(dtype)
    config = PeftLoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                            target_modules=lora.target_modules(), bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(lm, config)
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    model.eval()
    return model


def merge_lora(state: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A peft model's full state dict -> the base model's, with W + scaling · B @ A for every adapted layer."""
    prefix, merged = "base_model.model.", {}
    for name, value in state.items():
        if ".lora_" in name:
            continue
        name = name.removeprefix(prefix)
        if name.endswith(".base_layer.weight") or name.endswith(".base_layer.bias"):
            layer, kind = name.rsplit(".base_layer.", 1)
            if kind == "weight":
                a = state[f"{prefix}{layer}.lora_A.default.weight"].float()
                b = state[f"{prefix}{layer}.lora_B.default.weight"].float()
                value = (value.float() + scaling * (b @ a)).to(value.dtype)
            name = f"{layer}.{kind}"
        merged[name] = value
    return merged


__all__ = ["EXPORTS", "LoraConfig", "merge_lora", "with_adapters"]
