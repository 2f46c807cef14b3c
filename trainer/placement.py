"""Where the planner being trained lives: device, precision, LoRA, activation checkpointing, FSDP2 shards.

Precision (``--dtype bfloat16``, the default on GPUs): the weights that train, and AdamW's state, stay float32 (the
"master" copy; a 1e-6 learning rate times a bf16 weight would round to no update at all); the forward and backward
run in bf16 — ``torch.autocast`` on one process, FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=float32)`` across processes, so gradients are summed in float32. Frozen weights (LoRA's base, the
full-parameter KL reference) are stored in bf16, since nothing updates them. Log-softmax, the importance ratio, the
KL and the loss are float32 (``batch.ResponseLogProbs`` casts each chunk of logits; ``grpo.policy_loss`` works on
those). Versions are written in the training dtype: what vLLM serves.

Sharding (torchrun with WORLD_SIZE > 1): ``fully_shard`` on every decoder layer, then on the root
(``ResponseLogProbs`` around the model: the embeddings, the final norm and the LM head, tied or not, are one unit that
stays gathered while the chunked head runs). Gradients are summed over ranks, not averaged
(``set_gradient_divide_factor(1)``): each rank's loss is already divided by the global count, as in
``trainer/distributed.py``. A model built on the meta device (trainer/init.py: the ranks' skeletons) gets empty
storage on its device after sharding (``to_empty``, its real buffers kept) and its weights from rank 0
(``load_full_state``).

LoRA (``--lora-rank`` > 0, ``peft``): only the adapters train; the reference policy is the same model with its
adapters disabled, so there is no second copy of the weights.
"""

from __future__ import annotations

import contextlib
import os
import resource
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from agentflow.errors import InvalidInput
from agentflow.trainer.batch import ResponseLogProbs
from agentflow.trainer.lora import LoraConfig, merge_lora, with_adapters

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(name: str = "") -> torch.device:
    """``name`` ("cpu", "cuda", "cuda:1"), or CUDA when available; under torchrun each rank takes LOCAL_RANK's GPU."""
    if not name:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidInput(f"device {name!r}: this torch build or machine has no CUDA")
        if device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``name``, or bf16 on a GPU and float32 on a CPU."""
    name = name or ("bfloat16" if device.type == "cuda" else "float32")
    if name not in DTYPES:
        raise InvalidInput(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


# --- the process group -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    """This process's place among the trainer's ranks. ``control`` is a gloo group with a long timeout for the
    records rank 0 hands out: the other ranks wait there while rank 0 waits for Kafka."""

    rank: int = 0
    size: int = 1
    control: object = None

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        return self.size > 1

    def broadcast(self, obj=None):
        """Rank 0's ``obj`` on every rank."""
        if not self.sharded:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def max(self, value: int) -> int:
        if not self.sharded:
            return value
        t = torch.tensor([value], dtype=torch.long)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control)
        return int(t)

    def barrier(self) -> None:
        if self.sharded:
            dist.barrier(group=self.control)


def join_world(device: torch.device, wait_hours: float = 24.0) -> World:
    """The process group ``torchrun`` describes (NCCL on GPUs, gloo on CPUs), or a world of one without it."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return World()
    if not dist.is_initialized():
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=_attempt_store(rank, size),
                                rank=rank, world_size=size, device_id=device if device.type == "cuda" else None)
    control = dist.new_group(backend="gloo", timeout=timedelta(hours=wait_hours))
    return World(dist.get_rank(), dist.get_world_size(), control)


def _attempt_store(rank: int, size: int):
    """The rendezvous store of torchrun's current attempt. torchrun keeps one store across the restarts of its
    workers, and the keys a process group writes there (its ranks' addresses) would outlive an attempt: a restarted
    rank could read a dead rank's address and fail to connect (seen with gloo). A prefix per attempt keeps them
    apart."""
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size,
                          is_master=not agent_hosts and rank == 0, timeout=timedelta(minutes=10))
    return dist.PrefixStore(f"agentflow/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


# --- the placed model --------------------------------------------------------------------------------------------


class Placement:
    """The policy (``lm``: a transformers causal LM, or a peft model around one) on its device, in its precision,
    wrapped for chunked log-probs (``root``, what ``batch.sequence_logprobs`` takes) and, with a world of several
    ranks, sharded by FSDP2."""

    def __init__(self, lm, *, device: torch.device, dtype: torch.dtype, world: World = World(),
                 lora: LoraConfig = LoraConfig(), gradient_checkpointing: bool = False, chunk_tokens: int = 512):
        self.device, self.dtype, self.world, self.lora = device, dtype, world, lora
        lm.eval()  # no dropout: log-probs must match what the engine served
        if lora.enabled:
            lm = with_adapters(lm, lora, dtype)
        if gradient_checkpointing:
            _checkpoint_layers(lm)
        self.lm = lm
        # bf16 compute: autocast on one process; FSDP2 casts the gathered weights itself
        autocast = dtype if dtype != torch.float32 and not world.sharded else None
        self.root = ResponseLogProbs(lm, chunk_tokens=chunk_tokens, autocast=autocast)
        if world.sharded:
            _shard(self.root, lm, device, dtype)
        else:
            self.root.to(device)

    def parameters(self) -> list[torch.nn.Parameter]:
        """What the optimizer updates."""
        return [p for p in self.root.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def adapters_disabled(self):
        """The base model's log-probs (LoRA's reference policy)."""
        with self.lm.disable_adapter():
            yield

    def clip_grad_norm(self, max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def sync_gradients(self, enabled: bool) -> None:
        """Whether the next backward reduces gradients across ranks (only the last micro-batch's needs to)."""
        if self.world.sharded:
            self.root.set_requires_gradient_sync(enabled)

    # --- state -----------------------------------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Every weight, gathered on CPU on rank 0 (None on the others), names as the unwrapped model has them."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if self.world.sharded:
            state = get_model_state_dict(self.root, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        else:
            state = {k: v.detach().cpu() for k, v in self.root.state_dict().items()}
        if not self.world.main:
            return None
        return {k.removeprefix("lm."): v for k, v in state.items()}

    def serving_state_dict(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The plain model's weights (LoRA merged into its base) in the training dtype."""
        merged = merge_lora(full, self.lora.alpha / self.lora.rank) if self.lora.enabled else full
        return {k: v.to(self.dtype) for k, v in merged.items()}

    def resume_state(self, optimizer) -> dict:
        """The trainable weights and the optimizer, for ``torch.distributed.checkpoint`` (sharded across ranks)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        model, optim = get_state_dict(self.root, optimizer, options=StateDictOptions(ignore_frozen_params=True))
        return {"model": model, "optim": optim}

    def load_full_state(self, full: dict[str, torch.Tensor] | None) -> None:
        """Rank 0's ``full`` weights (names as ``full_state_dict`` gives them; None on the other ranks) broadcast into
        every rank's shards, one tensor at a time. Collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if self.world.main and full is None:
            raise InvalidInput("load_full_state: rank 0 must give the full weights")
        state = {f"lm.{k}": v for k, v in full.items()} if self.world.main else {}
        set_model_state_dict(self.root, state,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))

    def load_resume_state(self, optimizer, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(self.root, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(ignore_frozen_params=True, strict=False))


def _checkpoint_layers(lm) -> None:
    """transformers' activation checkpointing on the decoder layers. It engages only on layers in training mode:
    the layers get that flag alone, their sub-modules stay in eval mode (no dropout)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    for module in lm.modules():
        if isinstance(module, GradientCheckpointingLayer):
            module.training = True


def decoder_layers(lm) -> list[torch.nn.Module]:
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in lm.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise InvalidInput(f"{type(lm).__name__}: no decoder layers found to shard")
    return layers


def _shard(root, lm, device: torch.device, dtype: torch.dtype) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    precision = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    units = [*decoder_layers(lm), root]
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=precision)
    _to_device(root, device)
    for unit in units:  # a sum: each rank's loss is divided by the global count already
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no pre-multiplied sum)


def _to_device(root, device: torch.device) -> None:
    """``root`` on ``device``. Built on the meta device, its parameters get empty storage there (``to_empty``: the
    values come from ``Placement.load_full_state``) and its real buffers, computed when it was built (the rotary
    ``inv_freq``, in no checkpoint), are moved over as they are."""
    if not any(p.device.type == "meta" for p in root.parameters()):
        root.to(device)
        return
    buffers = [(module, name, buffer) for module in root.modules() for name, buffer in module._buffers.items()
               if buffer is not None and buffer.device.type != "meta"]
    root.to_empty(device=device)
    for module, name, buffer in buffers:
        module._buffers[name] = buffer.to(device)


def peak_memory(device: torch.device) -> dict[str, float]:
    """This process's peak memory so far, GB (10^9 bytes): resident host memory (``ru_maxrss``, KiB on Linux) and,
    on CUDA, what PyTorch allocated on the device."""
    peak = {"peak_host_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}
    if device.type == "cuda":
        peak["peak_device_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
    return peak


__all__ = ["DTYPES", "Placement", "World", "decoder_layers", "join_world", "peak_memory",
           "resolve_device", "resolve_dtype"]
