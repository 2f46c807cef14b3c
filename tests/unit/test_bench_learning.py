"""``bench/learning_inprocess.py --unlabeled``: the production-rewards loop in one process (no ground truth in
training: simulated ratings, the feedback ledger and the vote) runs steps and never replays an opted-out query."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "learning_inprocess.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_learning_inprocess", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_unlabeled_steps_train_on_ledger_rewards_only(tmp_path, capsys, monkeypatch):
    bench = load_bench()
    replayed, seen = [], []
    collect = bench.InProcessRollouts.collect

    def spy(self, tasks, group_size, **kw):
        records = collect(self, tasks, group_size, **kw)
        (seen if kw.get("source") == "traffic" else replayed).extend(t.query for t in tasks)
        return records

    monkeypatch.setattr(bench.InProcessRollouts, "collect", spy)
    steps = []
    train = bench.train

    def spy_train(trainer, fetch, **kw):
        def fetch_checked():
            records = fetch()
            steps.append(records)
            return records
        return train(trainer, fetch_checked, **kw)

    monkeypatch.setattr(bench, "train", spy_train)
    summary = bench.main(["--unlabeled", "--max-steps", "4", "--warmup-steps", "0", "--heldout", "6", "--minutes", "5",
                          "--traffic-per-step", "30", "--rated-share", "1.0", "--out", str(tmp_path / "out")])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["event"] == "summary"
    assert summary["steps"] == 4 and summary["settings"]["unlabeled"]["rated_share"] == 1.0
    assert seen and replayed and set(replayed) <= set(seen)  # replays come from production traffic
    records = [r for batch in steps for r in batch]
    assert records, "no rewarded replay in four steps with every answer rated"
    for r in records:  # no ground truth reached training: every reward is the ledger's or the vote's
        assert not r["ground_truth"] and {x["source"] for x in r["rewards"]} <= {"human", "vote"}, r["rewards"]
