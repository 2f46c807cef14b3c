"""One rank of the sharded-trainer tests (tests/integration/test_fsdp.py), started by torchrun.

    torchrun --nproc-per-node 2 fsdp_worker.py MODEL_DIR STORE OUT STEPS [LR]

Trains ``STEPS`` steps on ``records(step)`` with ``Trainer`` (FSDP2 over gloo; run as a plain script it is one
process), then rank 0 saves the gathered weights, the last update's gradients and what each rank saw of its own
loading (``ranks``: how many times it read a checkpoint, how its KL reference is sharded, its peak memory) to OUT.
A step whose version already exists in STORE is skipped, so a restarted run resumes where the store says;
``AGENTFLOW_TEST_DIE_AT`` = "rank:step" makes that rank kill itself (SIGKILL) before that step, once;
``AGENTFLOW_TEST_LORA`` = a rank trains LoRA adapters instead of every weight; several, comma-separated, are run one
after the other in the same processes (STORE-lora<rank>, OUT-lora<rank>), which saves a launch per configuration.
"""

import os
import random
import signal
import sys
from pathlib import Path

import torch

from agentflow.llm import models
from agentflow.trainer.checkpoint import ModelStore
from agentflow.trainer.grpo import GRPOConfig
from agentflow.trainer.lora import LoraConfig
from agentflow.trainer.loop import TrainConfig, Trainer


def records(step: int, vocab: int = 500) -> list[dict]:
    """Two groups (G = 4) of multi-turn trajectories with ragged turns: unequal shards across 2 ranks."""
    rng = random.Random(step)
    out = []
    for g, rewards in enumerate(([1.0, 0.0, 0.0, 1.0], [0.5, 0.0, 1.0, 0.0])):
        for j, reward in enumerate(rewards):
            turns = [{"planner": {"prompt_token_ids": [rng.randrange(5, vocab) for _ in range(rng.randint(5, 20))],
                                  "token_ids": [rng.randrange(5, vocab) for _ in range(rng.randint(2, 8))],
                                  "model_version": f"v{step}"}}
                     for _ in range(1 + (3 * g + j) % 3)]
            out.append({"trajectory_id": f"{step}-{g}-{j}", "group_id": f"{step}-g{g}", "turns": turns,
                        "rewards": [{"value": reward, "source": "rule"}]})
    return out


def config(lr: float = 1e-4, lora: int = 0) -> TrainConfig:
    """Micro-batches of 3 rows: the ranks get different numbers of them (the idle passes are exercised)."""
    return TrainConfig(grpo=GRPOConfig(group_size=4, batch_trajectories=8, beta=0.01, lr=lr, max_staleness=None),
                       micro_batch_rows=3, lora=LoraConfig(rank=lora))


def counting_loads() -> list:
    """Every checkpoint read by ``load_causal_lm`` in this process, from now on."""
    loads, load = [], models.load_causal_lm

    def counted(path, **kwargs):
        loads.append(str(path))
        return load(path, **kwargs)

    models.load_causal_lm = counted
    return loads


def sharding(placement) -> dict | None:
    """How a placement's parameters are held on this rank: DTensors or not, elements here and in all."""
    if placement is None:
        return None
    params = list(placement.root.parameters())
    return {"dtensors": all(hasattr(p, "to_local") for p in params),
            "local": sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in params),
            "full": sum(p.numel() for p in params), "dtypes": sorted({str(p.dtype) for p in params})}


def main(model_dir: str, store: str, out: str, steps: str, lr: str = "1e-4", lora: int = 0) -> None:
    loads = counting_loads()
    trainer = Trainer(model_dir, ModelStore(store), config(float(lr), lora))
    reference = sharding(trainer.reference)  # as loaded (FSDP2 keeps the root unit gathered after a forward)
    grads = {}  # the last update's gradients, as the optimizer gets them (the trainer frees them after a step)
    trainer.optimizer.register_step_pre_hook(lambda *_: grads.update(
        {name: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad.clone()
         for name, p in trainer.placement.root.named_parameters() if p.grad is not None}))
    die_rank, _, die_step = os.environ.get("AGENTFLOW_TEST_DIE_AT", "-1:-1").partition(":")
    marker = Path(store) / ".died"
    metrics = {}
    for step in range(trainer.version, int(steps)):
        if trainer.world.rank == int(die_rank) and step == int(die_step) and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        metrics = trainer.step(records(step), checkpoint_extra={"trained_step": step})
    mine = {"loads": loads, "reference": reference,
            "peak_host_rss_gb": metrics.get("peak_host_rss_gb")}
    ranks = [mine]
    if trainer.world.sharded:
        ranks = [None] * trainer.world.size
        torch.distributed.all_gather_object(ranks, mine, group=trainer.world.control)
    weights = trainer.placement.full_state_dict()
    if trainer.world.main:
        torch.save({"weights": weights, "grads": {k.removeprefix("lm."): v for k, v in grads.items()},
                    "ranks": ranks}, out)


def exit_now() -> None:
    """Leave without the interpreter's finalization: a gloo worker thread may still be releasing the last
    collective's tensors, which takes the GIL, and during finalization that aborts the process ("terminate called
    without an active exception": ProcessGroupGloo::runLoop, ~AsyncAllgatherCoalescedWork; pytorch/pytorch#190489).
    Everything this worker writes is written and closed by then."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    model_dir, store, out, *rest = sys.argv[1:]
    ranks = os.environ.get("AGENTFLOW_TEST_LORA", "0").split(",")
    for lora in ranks:
        suffix = f"-lora{lora}" if len(ranks) > 1 else ""
        main(model_dir, store + suffix, out + suffix, *rest, lora=int(lora))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    exit_now()
