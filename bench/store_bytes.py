"""Model-store bytes per version and kept after N versions: every version's files kept (the settings before
issue 33: ``keep_last`` 0, ``keep_resume`` 0) against the defaults (``keep_last`` 10, ``keep_resume`` 2).

  .venv/bin/python bench/store_bytes.py [--shape qwen05b] [--versions 20] [--before-versions 5] [--dtype bfloat16]

Each mode runs ``Trainer.step`` on a small synthetic batch (bench/trainer.py's records, the model's shape as there,
random init) until it has written its versions, and measures after each step the bytes of the version just written
(its serving folder and ``resume/``, before pruning) and the bytes of the whole store. Keeping everything at 0.5B
writes ~7 GB a version, so ``--before-versions`` (default 5) bounds that run's disk and the summary projects it to
``--versions`` (nothing is pruned, so the store grows by one version's bytes a step). Prints one JSON line per
step and a JSON summary. The arithmetic for 7B is in docs/deploy.md, "The trainer's disk".
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer import SHAPES, build_model, synthetic_records  # noqa: E402  (bench/trainer.py)

from agentflow.trainer.checkpoint import ModelStore  # noqa: E402
from agentflow.trainer.grpo import GRPOConfig  # noqa: E402
from agentflow.trainer.loop import TrainConfig, Trainer  # noqa: E402

GB = 1e9
MODES = {"before": {"keep_last": None, "keep_resume": 0}, "after": {"keep_last": 10, "keep_resume": 2}}


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_mode(mode: str, versions: int, args, work: Path) -> dict:
    """Train ``versions`` steps into a fresh store; per-step rows to stdout; the mode's numbers."""
    shape = SimpleNamespace(shape=args.shape, seed=0, hidden=64, layers=2, device="cpu", batch=4, group_size=2,
                            prompt_len=16, completion_len=8)
    base = build_model(work / "base", shape)
    store = ModelStore(work / "store")
    config = TrainConfig(grpo=GRPOConfig(group_size=2, batch_trajectories=4, max_staleness=0), dtype=args.dtype,
                         **MODES[mode])
    trainer = Trainer(base, store, config)
    records = synthetic_records(shape, trainer.policy.config.vocab_size)
    written = []
    for step in range(versions):
        for record in records:
            record["turns"][0]["planner"]["model_version"] = f"v{trainer.version}"
        metrics = trainer.step(records)
        new = store.get(trainer.version).path
        written.append(folder_bytes(new) if metrics.get("checkpoint") else 0)
        row = {"mode": mode, "step": step + 1, "version": trainer.version, "written_gb": written[-1] / GB,
               "kept_gb": folder_bytes(store.root) / GB, "versions_kept": len(store.versions())}
        print(json.dumps(row), flush=True)
        print(f"[bench/store_bytes] {mode} step {step + 1}/{versions}: {row['kept_gb']:.1f} GB kept",
              file=sys.stderr, flush=True)
    v0 = folder_bytes(store.get(0).path) / GB
    return {"versions": versions, "v0_gb": v0, "written_per_version_gb": statistics.median(written) / GB,
            "kept_gb": folder_bytes(store.root) / GB, "versions_kept": len(store.versions())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=list(SHAPES), default="qwen05b")
    p.add_argument("--versions", type=int, default=20, help="versions the defaults run writes")
    p.add_argument("--before-versions", type=int, default=5, help="versions the keep-everything run writes")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                   help="the training dtype, and so the versions' (bfloat16: what a GPU trainer writes)")
    args = p.parse_args(argv)
    results = {}
    for mode, versions in (("before", args.before_versions), ("after", args.versions)):
        work = Path(tempfile.mkdtemp(prefix=f"agentflow-store-{mode}-"))
        try:
            results[mode] = run_mode(mode, versions, args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    before, after = results["before"], results["after"]
    before[f"kept_gb_at_{args.versions}_projected"] = before["v0_gb"] + args.versions * before["written_per_version_gb"]
    summary = {"shape": args.shape, "dtype": args.dtype, **results,
               "kept_ratio_after_to_before": after["kept_gb"] / before[f"kept_gb_at_{args.versions}_projected"]}
    print(json.dumps({"summary": summary}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
