"""The trainer sharded by FSDP2 over 2 gloo processes under torchrun (trainer/placement.py).

* one step on 2 ranks gives the single-process gradients and weights (tests/integration/fsdp_worker.py trains; the
  ranks get unequal shards and unequal numbers of micro-batches), full-parameter and LoRA;
* the lean start (trainer/init.py): only rank 0 reads the checkpoint, the other gets its shards by broadcast, the
  LoRA adapters start where one process's do, and the full-parameter KL reference is sharded too;
* kill -9 of one rank mid-run: torchrun restarts the ranks, they resume from the newest version (its
  torch.distributed.checkpoint ``resume/``), and the versions go on with no gap and no step trained twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow
WORKER = Path(__file__).with_name("fsdp_worker.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")


def torchrun(tmp_path: Path, model_dir, store: Path, out: Path, steps: int, *, env: dict | None = None,
             max_restarts: int = 0) -> subprocess.CompletedProcess:
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "--max-restarts", str(max_restarts), str(WORKER),
           str(model_dir), str(store), str(out), str(steps)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path,
                         env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    return run


def single_process(tmp_path: Path, model_dir, steps: int, *, env: dict | None = None) -> None:
    """The worker as one process: single.pt (and the store single/), suffixed per configuration."""
    run = subprocess.run([sys.executable, str(WORKER), str(model_dir), str(tmp_path / "single"),
                          str(tmp_path / "single.pt"), str(steps)], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path, env={**os.environ, **(env or {})})
    assert run.returncode == 0, run.stderr[-4000:]


def max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def one_step(tmp_path_factory, tiny_model_dir):
    """One step, full-parameter then LoRA (rank 4), on 2 ranks and in one process: {lora rank: (sharded, single)}.
    One launch of each runs both configurations."""
    tmp_path = tmp_path_factory.mktemp("one-step")
    env = {"AGENTFLOW_TEST_LORA": "0,4"}
    torchrun(tmp_path, tiny_model_dir, tmp_path / "sharded", tmp_path / "sharded.pt", 1, env=env)
    single_process(tmp_path, tiny_model_dir, 1, env=env)
    return {lora: (torch.load(tmp_path / f"sharded.pt-lora{lora}"), torch.load(tmp_path / f"single.pt-lora{lora}"))
            for lora in (0, 4)} | {"start": tmp_path / "single-lora0" / "v000000" / "model.safetensors"}


def test_two_ranks_equal_one_process(one_step):
    """Gradients to 1e-6, and weights to 1e-5 after one AdamW step of lr 1e-4 (Adam's first step is about
    lr x sign(g), so weights whose gradient is near Adam's eps magnify float-order differences by lr / eps: 1.7e-6
    measured on one CPU, under 1e-6 on another). The gradients are what proves the sharding: Adam's step hides
    their scale."""
    from safetensors.torch import load_file

    sharded, single = one_step[0]
    assert max_diff(sharded["grads"], single["grads"]) <= 1e-6
    assert max_diff(sharded["weights"], single["weights"]) <= 1e-5
    start = load_file(one_step["start"])
    moved = max(float((single["weights"][k] - v).abs().max()) for k, v in start.items())
    assert moved > 5e-5  # the step moved the weights by about lr
    main, other = sharded["ranks"]
    assert other["loads"] == [], "rank 1 read a checkpoint: the lean start broadcasts rank 0's weights"
    assert main["loads"], "rank 0 reads the weights it broadcasts"
    for rank in (main, other):  # the KL reference: bf16 on a GPU, float32 here, and sharded like the policy
        reference = rank["reference"]
        assert reference["dtensors"] and 0 < reference["local"] < reference["full"], reference
        assert rank["peak_host_rss_gb"] > 0


def test_lora_two_ranks_equal_one_process(one_step):
    """The adapters' random start (lora_A) is rank 0's, broadcast: after one step every weight equals one process's."""
    sharded, single = one_step[4]
    assert max_diff(sharded["grads"], single["grads"]) <= 1e-6
    assert max_diff(sharded["weights"], single["weights"]) <= 1e-6
    adapters = {k: v for k, v in single["weights"].items() if ".lora_" in k}
    assert adapters and set(single["grads"]) == set(adapters)  # only the adapters train
    assert max(float(v.abs().max()) for k, v in adapters.items() if ".lora_B." in k) > 0  # B starts at 0: it moved
    assert sharded["ranks"][1]["loads"] == []
    assert [rank["reference"] for rank in sharded["ranks"]] == [None, None]  # the base, adapters disabled


def test_a_killed_rank_resumes_without_gap_or_repeat(tmp_path, tiny_model_dir):
    store = tmp_path / "store"
    torchrun(tmp_path, tiny_model_dir, store, tmp_path / "out.pt", 4, max_restarts=1,
                   env={"AGENTFLOW_TEST_DIE_AT": "1:2"})
    assert (store / ".died").exists(), "rank 1 was to kill itself before step 2 (and torchrun restart both)"
    versions = sorted(p.name for p in store.iterdir() if (p / "agentflow.json").is_file())
    assert versions == [f"v{v:06d}" for v in range(5)]
    meta = [json.loads((store / v / "agentflow.json").read_text()) for v in versions[1:]]
    assert [m["trained_step"] for m in meta] == [0, 1, 2, 3]
    assert [m["parent"] for m in meta] == [0, 1, 2, 3]
    resumable = [v for v in versions if (store / v / "resume" / ".metadata").is_file()]
    assert resumable == versions[-2:]  # every rank's share, in the newest two versions (keep_resume)
    assert not [p for p in store.iterdir() if p.name.startswith(".resume-")]
