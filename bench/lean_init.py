"""Issue 33 item 1: host memory per rank of a sharded trainer, every rank loading the whole model before sharding
(the old path) against rank 0 alone reading it and broadcasting the shards (trainer/init.py, the lean path).

  .venv/bin/python bench/lean_init.py --shape qwen05b [--lora RANK] [--dtype float32|bfloat16] [--beta 0.001]
                                      [--ranks 2] [--repeats 3] [--steps 1] [--work DIR]

The model is a random-init Qwen2 shape (bench/trainer.py's ``SHAPES`` and ``build_model``: bf16 safetensors as
version 0 of a model store), built once in a child process. Each run is one ``torchrun --standalone`` of
``--ranks`` gloo processes on the CPU (``OMP_NUM_THREADS=1``), on a fresh store holding that version 0: every rank
builds the ``Trainer`` (the policy and, with ``--beta`` > 0 and no LoRA, the full-parameter KL reference) with
``TrainConfig(lean_init=False)`` (old) or the default (new), then trains ``--steps`` step(s) on a few synthetic
trajectories (bench/trainer.py's records; no optimizer state written). Each rank reports its peak resident set size
(``ru_maxrss``) after building the Trainer and after the step (the step's ``peak_host_rss_gb``); the step includes
the version's checkpoint, for which rank 0 gathers the full weights. The runs alternate old, new, new, old, ...

Prints progress to stderr and, last, one JSON object: per path the median over repeats of each rank's peak (GB,
10^9 bytes), new / old per rank, every run's numbers, and ``weights_max_abs_diff``: the largest difference between
the two paths' first versions after the step (every tensor of their safetensors; 0 when they are the same).
Memory: the old path holds a full copy of the policy (and then of the reference) on every rank; at 1.5B in float32
that is 6 GB a rank, so run one shape at a time and mind the machine's RAM (``--lora`` with ``--dtype bfloat16``
keeps a 1.5B run to a bf16 base). Every process a run starts is killed when the bench ends, however it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _proc import kill_tree  # noqa: E402  (bench/_proc.py)

from agentflow.children import spawn_tied  # noqa: E402

BENCH = Path(__file__).resolve()
PATHS = ("old", "new")  # TrainConfig.lean_init False / True


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen05b",
                   help="a bench/trainer.py SHAPES name (qwen05b, qwen15b, qwen7b), or tiny (a smoke test)")
    p.add_argument("--lora", type=int, default=0, metavar="RANK", help="LoRA rank, alpha 2*RANK (0: every weight)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="the training dtype: the frozen weights' (LoRA's base, the reference) and the compute's")
    p.add_argument("--beta", type=float, default=0.001, help="KL weight (> 0: a full-parameter run has a reference)")
    p.add_argument("--ranks", type=int, default=2, help="torchrun processes")
    p.add_argument("--repeats", type=int, default=3, help="runs of each path (medians reported)")
    p.add_argument("--steps", type=int, choices=[0, 1], default=1, help="1: train one step after building")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="a run that takes longer is killed")
    p.add_argument("--work", default=None, help="folder for the model and the runs' stores (default: a temporary one)")
    # the roles this script plays in its own children
    p.add_argument("--build", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank-of", choices=PATHS, default=None, help=argparse.SUPPRESS)
    p.add_argument("--model", default=None, help=argparse.SUPPRESS)
    p.add_argument("--store", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def progress(message: str) -> None:
    print(f"[bench/lean_init] {message}", file=sys.stderr, flush=True)


# --- the children -------------------------------------------------------------------------------------------------


def build(args) -> None:
    """(child) The random-init model as version 0 of ``<work>/base/store``; prints its folder."""
    from trainer import build_model  # bench/trainer.py

    shape = SimpleNamespace(shape=args.shape, seed=0, hidden=64, layers=2, device="cpu")
    folder = build_model(Path(args.work) / "base", shape)
    if args.shape == "tiny":  # a plain folder (a smoke test's model): made version 0 of a store
        from transformers import AutoTokenizer

        from agentflow.llm.models import load_causal_lm
        from agentflow.trainer.checkpoint import ModelStore

        folder = ModelStore(folder.parent / "store").save(load_causal_lm(folder), AutoTokenizer.from_pretrained(folder),
                                                          parent=None, extra={"export": "full"}).path
    print(folder, flush=True)


def rank_main(args) -> None:
    """(child, one rank under torchrun) Build the Trainer, step, and have rank 0 write every rank's peaks."""
    import torch

    from trainer import synthetic_records  # bench/trainer.py

    from agentflow.trainer.checkpoint import ModelStore
    from agentflow.trainer.grpo import GRPOConfig
    from agentflow.trainer.lora import LoraConfig
    from agentflow.trainer.loop import TrainConfig, Trainer
    from agentflow.trainer.placement import peak_memory

    lora = LoraConfig(rank=args.lora, alpha=2.0 * args.lora) if args.lora else LoraConfig()
    config = TrainConfig(grpo=GRPOConfig(group_size=2, batch_trajectories=4, beta=args.beta, max_staleness=None),
                         micro_batch_rows=2, dtype=args.dtype, lora=lora, save_optimizer_state=False,
                         lean_init=args.rank_of == "new")
    started = time.monotonic()
    trainer = Trainer(args.model, ModelStore(args.store), config)
    mine = {"built_gb": peak_memory(torch.device("cpu"))["peak_host_rss_gb"], "build_s": time.monotonic() - started}
    if args.steps:
        batch = SimpleNamespace(seed=0, batch=4, group_size=2, prompt_len=32, completion_len=16)
        metrics = trainer.step(synthetic_records(batch, trainer.policy.config.vocab_size))
        if metrics.get("skipped"):
            raise SystemExit(f"the step was skipped: {metrics}")
        mine.update(stepped_gb=metrics["peak_host_rss_gb"], step_s=metrics["step_s"])
    ranks = [None] * trainer.world.size
    torch.distributed.all_gather_object(ranks, mine, group=trainer.world.control)
    if trainer.world.main:
        Path(args.out).write_text(json.dumps(ranks))
    torch.distributed.destroy_process_group()


# --- the runs -----------------------------------------------------------------------------------------------------


def run_child(command: list[str], log: Path, timeout_s: float, env: dict | None = None) -> subprocess.Popen:
    """``command`` tied to this process, its output into ``log``; killed with all it started if it outlives
    ``timeout_s`` or this bench stops first."""
    with log.open("w") as out:
        process = spawn_tied(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        progress(f"{log.parent.name}: over {timeout_s:.0f} s, killed")
    finally:
        kill_tree(process)
    if process.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise SystemExit(f"{' '.join(command[:6])} ... exited with {process.returncode}; {log}:\n{tail}")
    return process


def build_base(args, work: Path) -> Path:
    log = work / "build.log"
    run_child([sys.executable, str(BENCH), "--build", "--shape", args.shape, "--work", str(work)], log,
              args.timeout_s)
    return Path(log.read_text().strip().splitlines()[-1])


def run_path(path: str, repeat: int, base: Path, args, work: Path) -> tuple[list[dict], Path]:
    """One torchrun of ``path``: every rank's peaks, and the store it trained into."""
    folder = work / f"{path}-{repeat}"
    shutil.rmtree(folder, ignore_errors=True)
    store = folder / "store"
    shutil.copytree(base, store / base.name, copy_function=os.link)  # version 0, hard-linked
    out = folder / "ranks.json"
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", "--nproc-per-node", str(args.ranks), str(BENCH), "--rank-of", path,
               "--model", str(store / base.name), "--store", str(store), "--out", str(out), "--shape", args.shape,
               "--lora", str(args.lora), "--dtype", args.dtype, "--beta", str(args.beta), "--steps", str(args.steps)]
    started = time.monotonic()
    run_child(command, folder / "run.log", args.timeout_s,
              env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    ranks = json.loads(out.read_text())
    progress(f"{path} #{repeat}: {time.monotonic() - started:.0f} s, peak GB per rank built "
             f"{[round(r['built_gb'], 2) for r in ranks]}, after the step "
             f"{[round(r.get('stepped_gb') or 0, 2) for r in ranks]}")
    return ranks, store


def weights_max_abs_diff(a: Path, b: Path) -> float:
    """The largest |a - b| over every tensor of the two version folders' safetensors files (read one at a time)."""
    from safetensors import safe_open

    files = sorted(p.name for p in a.glob("*.safetensors"))
    if not files or files != sorted(p.name for p in b.glob("*.safetensors")):
        raise SystemExit(f"{a} and {b} do not hold the same safetensors files")
    worst = 0.0
    for name in files:
        with safe_open(a / name, "pt") as fa, safe_open(b / name, "pt") as fb:
            if set(fa.keys()) != set(fb.keys()):
                raise SystemExit(f"{name}: the two versions hold different tensors")
            for key in fa.keys():
                worst = max(worst, float((fa.get_tensor(key).float() - fb.get_tensor(key).float()).abs().max()))
    return worst


def summarise(args, runs: dict[str, list[list[dict]]], diff: float | None) -> dict:
    keys = ["built_gb"] + (["stepped_gb"] if args.steps else [])
    median = {path: {k: [round(statistics.median(run[r][k] for run in runs[path]), 3) for r in range(args.ranks)]
                     for k in keys} for path in PATHS}
    ratio = {k: [round(n / o, 3) for n, o in zip(median["new"][k], median["old"][k])] for k in keys}
    return {"shape": args.shape, "lora": args.lora, "dtype": args.dtype, "beta": args.beta, "ranks": args.ranks,
            "repeats": args.repeats, "steps": args.steps, "median_peak_rss_gb": median, "new_over_old": ratio,
            "weights_max_abs_diff": diff, "runs": runs}


def bench(args) -> dict:
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="agentflow-lean-init-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        progress(f"building the random-init {args.shape} in {work}")
        base = build_base(args, work)
        runs: dict[str, list] = {path: [] for path in PATHS}
        firsts: dict[str, Path] = {}
        for repeat in range(args.repeats):
            for path in PATHS if repeat % 2 == 0 else PATHS[::-1]:
                ranks, store = run_path(path, repeat, base, args, work)
                runs[path].append(ranks)
                if path in firsts:
                    shutil.rmtree(store.parent, ignore_errors=True)
                else:
                    firsts[path] = store / "v000001"
        diff = weights_max_abs_diff(firsts["old"], firsts["new"]) if args.steps else None
        return summarise(args, runs, diff)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.build:
        build(args)
        return 0
    if args.rank_of:
        rank_main(args)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # no finalization: gloo threads may still release tensors (tests/integration/fsdp_worker.py)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a SIGTERM runs the clean-up (the children's kill)
    print(json.dumps(bench(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
