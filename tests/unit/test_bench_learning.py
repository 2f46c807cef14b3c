"""``bench/learning_inprocess.py --unlabeled``: the production-rewards loop in one process (no ground truth in
training: simulated ratings, the feedback ledger and the vote) runs steps and never replays an opted-out query."""

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest
import torch

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


@pytest.mark.slow
def test_the_hard_environment_with_branches_sets_its_deadline_and_adds_turn_level_groups(tmp_path, monkeypatch):
    bench = load_bench()
    branched = []
    collect_branches = bench.InProcessRollouts.collect_branches

    def spy(self, points, group_size):
        records = collect_branches(self, points, group_size)
        branched.append((points, records))
        return records

    monkeypatch.setattr(bench.InProcessRollouts, "collect_branches", spy)
    rewards = {}
    collect = bench.InProcessRollouts.collect

    def spy_collect(self, tasks, group_size, **kw):
        records = collect(self, tasks, group_size, **kw)
        rewards.update((r["trajectory_id"], bench.Record(r).reward()) for r in records)
        return records

    monkeypatch.setattr(bench.InProcessRollouts, "collect", spy_collect)
    summary = bench.main(["--env", "hard", "--max-steps", "3", "--warmup-steps", "0", "--heldout", "6", "--queries",
                          "3", "--group-size", "2", "--branch-groups", "2", "--branch-from", "failed",
                          "--untrained-evals", "2", "--out", str(tmp_path / "out")])
    assert summary["heldout_untrained"] == [summary["heldout_before"]] * 2  # greedy: an evaluation repeats itself
    settings = summary["settings"]
    assert settings["env"]["mode"] == "hard" and settings["max_turns"] == 4 and settings["branch_groups"] == 2
    assert "three_hop" in summary["by_kind_before"] and summary["steps"] == 3
    assert branched[0] == ([], [])  # the first step has no batch before it to branch from
    later = [record for points, records in branched[1:] for record in records]
    assert later, "no trajectory of two turns or more to branch from"
    assert summary["rollouts"] == 3 * 3 * 2 + len(later)
    assert all(rewards[point.trajectory_id] == 0.0 for points, _ in branched for point in points)  # failed ones only
    for record in later:  # continuations: their own turns only, after the branch state's steps
        origin_turn = int(record["group_id"].split("/")[2])
        assert record["turns"][0]["step"] == origin_turn
        assert len(record["memory"]["steps"]) == origin_turn + len(record["turns"])


# --- issue 31: the staleness bookkeeping of --staleness and --async (pure functions, a fake sampler) ---------------


def test_serving_version_lags_by_staleness_from_the_first_rl_version():
    bench = load_bench()
    # first RL version 1 (after the format warm-up), S = 2: step k trains v(k) and samples with v(k) - 2, never < v1
    trained = [1, 2, 3, 4, 5, 6]
    assert [bench.serving_version(v, 2, 1) for v in trained] == [1, 1, 1, 2, 3, 4]
    assert [bench.serving_version(v, 0, 1) for v in trained] == trained  # on-policy: the newest version
    assert [bench.serving_version(v, 8, 1) for v in (1, 9, 10, 20)] == [1, 1, 2, 12]
    with pytest.raises(ValueError):
        bench.serving_version(3, -1, 0)


def test_may_sample_bounds_the_producer():
    bench = load_bench()
    # staleness 0 is the synchronous loop: batch i only once i steps are done
    assert [bench.may_sample(i, 2, 0) for i in range(4)] == [True, True, True, False]
    # staleness 2: batches 0..2 at once, batch 3 after the first step
    assert [bench.may_sample(i, 0, 2) for i in range(4)] == [True, True, True, False]
    assert bench.may_sample(3, 1, 2) and not bench.may_sample(4, 1, 2)


def test_lagged_weights_keep_the_last_s_plus_one_versions_as_copies():
    bench = load_bench()
    live = {"w": torch.zeros(2)}
    lagged = bench.LaggedWeights(2, 1, live)
    assert (lagged.serving, lagged.versions()) == (1, [1])
    for version in (2, 3, 4, 5):
        live["w"] += 1  # an optimizer step changes the live tensor in place
        lagged.push(version, live)
    assert lagged.versions() == [3, 4, 5] and lagged.serving == 3
    assert lagged.weights["w"].tolist() == [2.0, 2.0]  # v3's weights, untouched by the later steps
    assert lagged.newest["w"].tolist() == [4.0, 4.0]
    lagged.push(5, {"w": torch.full((2,), 9.0)})  # a skipped step writes no version: nothing changes
    assert lagged.newest["w"].tolist() == [4.0, 4.0] and lagged.versions() == [3, 4, 5]
    with pytest.raises(ValueError):
        lagged.push(7, live)
    on_policy = bench.LaggedWeights(0, 1, live)
    on_policy.push(2, live)
    assert on_policy.versions() == [2] and on_policy.serving == 2


class _FakeRollouts:
    """What AsyncRollouts needs of InProcessRollouts: sync, collect (one record per trajectory) and an engine."""

    def __init__(self, delay_s: float = 0.0):
        self.version, self.collected, self.closed, self.delay_s = None, 0, False, delay_s
        self.engine = self

    def sync(self, weights, version):
        self.version = version

    def collect(self, tasks, group_size):
        time.sleep(self.delay_s)
        self.collected += 1
        return [{"sampled_by": self.version} for _ in tasks for _ in range(group_size)]

    def close(self, cancel=False):
        self.closed = True


@pytest.mark.parametrize("staleness", [0, 2])
def test_async_producer_stays_within_staleness(staleness):
    bench = load_bench()
    fake = _FakeRollouts()
    producer = bench.AsyncRollouts(fake, lambda: ["a", "b"], 2, staleness, 1, {})
    producer.start()
    version, lags = 1, []
    try:
        for step in range(1, 9):
            records, sampled = producer.fetch()
            assert len(records) == 4 and {r["sampled_by"] for r in records} == {sampled}
            lags.append(version - sampled)
            time.sleep(0.05)  # the update; every step but the fourth writes a version
            version += step != 4
            producer.publish(version, {}, steps_done=step)
    finally:
        producer.close()
    assert fake.closed and max(lags) <= staleness
    assert lags == [0] * 8 if staleness == 0 else staleness in lags


def test_async_producer_samples_nothing_while_paused():
    bench = load_bench()
    fake = _FakeRollouts(delay_s=0.01)  # 300 groups until the queue is full: it is not while this runs
    producer = bench.AsyncRollouts(fake, lambda: ["a"] * 3, 2, 100, 1, {})
    producer.start()
    try:
        deadline = time.monotonic() + 10
        while fake.collected < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        with producer.paused():
            held = fake.collected
            time.sleep(0.2)
            assert fake.collected == held
        while fake.collected == held and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fake.collected > held
    finally:
        producer.close()


def test_learning_rates_default_by_model_and_stay_as_given():
    parse = load_bench().parse_args
    assert (parse([]).lr, parse([]).warmup_lr) == (1e-3, 3e-3)  # a random tiny planner
    assert (parse(["--model", "smollm2"]).lr, parse(["--model", "smollm2"]).warmup_lr) == (1e-5, 3e-5)
    given = parse(["--model", "smollm2", "--lr", "2e-6", "--warmup-lr", "1e-4"])
    assert (given.lr, given.warmup_lr) == (2e-6, 1e-4)
