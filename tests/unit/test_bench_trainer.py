"""``bench/trainer.py`` runs in-process on a tiny setting and reports both trainers' update throughput."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")  # a test-only dependency
pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench" / "trainer.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_trainer", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_bench_reports_both_trainers(capsys):
    result = load_bench().main(["--batch", "4", "--group-size", "2", "--micro-batch", "2", "--prompt-len", "12",
                                "--completion-len", "6", "--hidden", "32", "--layers", "1", "--updates", "1",
                                "--repeats", "1", "--device", "cpu"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == json.loads(json.dumps(result))
    for key in ("ours_tokens_per_s", "trl_tokens_per_s", "ratio", "settings", "torch_threads", "model"):
        assert key in last
    assert last["ours_tokens_per_s"] > 0 and last["trl_tokens_per_s"] > 0
    assert last["ratio"] == pytest.approx(last["ours_tokens_per_s"] / last["trl_tokens_per_s"])
    # the same first update from the same weights on the same batch: the two objectives agree
    assert last["first_loss"]["ours"] == pytest.approx(last["first_loss"]["trl"], abs=1e-6)
