"""Data-parallel Flow-GRPO over torch.distributed (gloo on CPU, NCCL on GPUs; launch with ``torchrun``).

Every rank holds a full copy of the planner and a shard of the global batch made of *whole trajectories*. The
update equals the single-process update on the whole batch when:

1. each rank divides its summed per-token losses by the **global** count of the aggregation mode — trajectories for
   "trajectory" (1/N Σ_i ...), response tokens for "token_mean" — not by its own count (``global_denominator``);
2. the ranks' gradients are **summed**, not averaged (``all_reduce_gradients``). With ``DistributedDataParallel``,
   which averages over the world size, multiply the loss by ``world_size`` instead.

Rule 1 is why a rank must hold all turns of a trajectory: the weight of a turn is 1/(T_i · tokens of the turn),
and T_i is only known where all of the trajectory's turns are. The same two rules make gradient accumulation
over micro-batches exact (``TrainBatch.micro_batches``). FSDP follows the same rules (its reduce-scatter also
averages: scale the loss by ``world_size``).
"""

from __future__ import annotations

import os
from typing import Iterable

import torch
import torch.distributed as dist
from torch import Tensor

from agentflow.trainer.grpo import aggregation_count


def init_from_env(backend: str | None = None) -> tuple[int, int]:
    """Join the process group ``torchrun`` describes in the environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT).

    Returns ``(rank, world_size)``; ``(0, 1)`` without a launcher. ``backend`` defaults to NCCL with CUDA, else gloo.
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    dist.init_process_group(backend or ("nccl" if torch.cuda.is_available() else "gloo"))
    return dist.get_rank(), dist.get_world_size()


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shard_trajectories(num_trajectories: int, rank: int, world_size: int) -> list[int]:
    """The trajectory indices rank ``rank`` trains on: contiguous, sizes differing by at most one.

    Pass the result to ``TrainBatch.select_trajectories``. A rank may get none (fewer trajectories than ranks): it
    skips the forward and backward but still joins ``global_denominator`` and ``all_reduce_gradients`` (which
    counts its missing gradients as zeros).
    """
    base, extra = divmod(num_trajectories, world_size)
    start = rank * base + min(rank, extra)
    return list(range(start, start + base + (1 if rank < extra else 0)))


def global_denominator(mask: Tensor, traj_index: Tensor | None, aggregation: str) -> Tensor:
    """This rank's aggregation count summed over all ranks: pass it to ``policy_loss(denominator=...)``."""
    count = aggregation_count(mask, traj_index, aggregation).to(torch.float64)
    if _world()[1] > 1:
        dist.all_reduce(count, op=dist.ReduceOp.SUM)
    return count


def all_reduce_gradients(parameters: Iterable[torch.nn.Parameter]) -> None:
    """Sum every parameter's gradient over the ranks, in place (one flat buffer per dtype and device).

    A parameter without a gradient on this rank contributes zeros (and gets the sum of the others').
    """
    if _world()[1] <= 1:
        return
    params = [p for p in parameters if p.requires_grad]
    buckets: dict[tuple, list[torch.nn.Parameter]] = {}
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        buckets.setdefault((p.grad.dtype, p.grad.device), []).append(p)
    for bucket in buckets.values():
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in bucket:
            n = p.grad.numel()
            p.grad.copy_(flat[offset: offset + n].view_as(p.grad))
            offset += n
