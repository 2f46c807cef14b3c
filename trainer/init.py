"""A checkpoint into its placement (``trainer/placement.py``), without a full copy of the model on every rank.

One process loads the model (``load_causal_lm``) and places it. Sharded (torchrun), the lean path PyTorch
recommends for FSDP2, so that host memory does not grow with the number of ranks:

1. rank 0 loads the model as one process would — its LoRA adapters too, initialised from the same seed — and keeps
   its full state dict; no other rank reads the checkpoint;
2. every rank builds the model on the meta device (``empty_causal_lm``: no weights, real buffers) and places it
   (adapters, activation checkpointing, ``fully_shard``); ``to_empty`` then gives its shards storage on its device;
3. ``set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)`` sends rank 0's tensors one at a time,
   each rank keeping its shard.

Rank 0 still holds one full copy (in the loaded dtype) while it loads, the others only their shards and one tensor
in flight. ``lean=False`` is the old path, every rank loading the whole model before sharding
(``bench/lean_init.py`` measures both).
"""

from __future__ import annotations

from pathlib import Path

import torch

from agentflow.trainer.lora import LoraConfig, with_adapters
from agentflow.trainer.placement import Placement, World


def load_placement(path: str | Path, *, loaded: str, world: World, frozen: bool = False, lean: bool = True,
                   **placement) -> Placement:
    """The model in ``path`` loaded in ``loaded`` ("float32", "bfloat16") and placed (``placement``: ``Placement``'s
    keywords); ``frozen``: nothing in it trains (the KL reference). Collective when ``world`` is sharded."""
    if world.sharded and lean:
        return _broadcast_placement(path, loaded=loaded, world=world, frozen=frozen, **placement)
    from agentflow.llm import models

    lm = models.load_causal_lm(path, dtype=loaded)
    if frozen:
        lm.requires_grad_(False)
    return Placement(lm, world=world, **placement)


def _broadcast_placement(path, *, loaded: str, world: World, frozen: bool, **placement) -> Placement:
    from agentflow.llm import models

    full = None
    if world.main:
        full = _full_weights(path, loaded, placement.get("lora", LoraConfig()), placement["dtype"])
    with torch.random.fork_rng(devices=[]):  # the skeleton's adapters draw from the RNG: rank 0's stays one process's
        skeleton = models.empty_causal_lm(path, dtype=loaded)
        if frozen:
            skeleton.requires_grad_(False)
        placed = Placement(skeleton, world=world, **placement)
    placed.load_full_state(full)
    return placed


def _full_weights(path, loaded: str, lora: LoraConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The weights one process would place: the checkpoint's, with LoRA's adapters as ``Placement`` adds them."""
    from agentflow.llm import models

    lm = models.load_causal_lm(path, dtype=loaded)
    if lora.enabled:
        lm = with_adapters(lm, lora, dtype)
    return lm.state_dict()


__all__ = ["load_placement"]
