"""How a Flow-GRPO batch is split across ranks (``trainer/placement.py`` shards the model with FSDP2).

Every rank gets the same records (rank 0 consumes them and hands them out), builds the same batch, and trains on a
contiguous share of *whole trajectories*. The update equals the single-process update on the whole batch when

1. each rank divides its summed per-token losses by the **global** count of the aggregation mode — trajectories for
   "trajectory" (1/N Σ_i ...), response tokens for "token_mean" — which every rank knows, since it holds the whole
   batch (``Trainer._updates``);
2. the ranks' gradients are **summed**, not averaged (FSDP2 with ``set_gradient_divide_factor(1)``).

Rule 1 is why a rank must hold all turns of a trajectory: the weight of a turn is 1/(T_i · tokens of the turn),
and T_i is only known where all of the trajectory's turns are. The same two rules make gradient accumulation over
micro-batches exact (``TrainBatch.micro_batches``).
"""

from __future__ import annotations


def shard_trajectories(num_trajectories: int, rank: int, world_size: int) -> list[int]:
    """The trajectory indices rank ``rank`` trains on: contiguous, sizes differing by at most one.

    Pass the result to ``TrainBatch.select_trajectories``. A rank may get none (fewer trajectories than ranks): it
    still runs as many (idle) passes as the others, so that FSDP's collectives line up.
    """
    base, extra = divmod(num_trajectories, world_size)
    start = rank * base + min(rank, extra)
    return list(range(start, start + base + (1 if rank < extra else 0)))
