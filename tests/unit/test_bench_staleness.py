"""``bench/staleness.py``: the runs it starts and the medians it reports (no run is started here)."""

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "staleness.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_staleness", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_grid_and_compare_runs_pass_the_right_flags(tmp_path):
    bench = load_bench()
    args = bench.parse_args(["--seeds", "0,1", "--staleness", "0,8", "--objectives", "flow_grpo,tis", "--minutes", "2",
                             "--", "--heldout", "6"])
    runs = bench.grid_runs(args)
    assert [r.name for r in runs[:4]] == ["flow_grpo-s0-seed0", "tis-s0-seed0", "flow_grpo-s8-seed0", "tis-s8-seed0"]
    assert len(runs) == 8 and args.parallel == 2
    cmd = bench.command(runs[3], args, tmp_path)
    assert cmd[cmd.index("--objective") + 1] == "tis" and cmd[cmd.index("--staleness") + 1] == "8"
    assert cmd[cmd.index("--threads") + 1] == "1" and cmd[-2:] == ["--heldout", "6"] and "--async" not in cmd

    args = bench.parse_args(["--compare-async", "--seeds", "3", "--objective", "decoupled_ppo",
                             "--async-staleness", "2"])
    sync, asynchronous = bench.compare_runs(args)
    assert args.parallel == 1 and (sync.group, asynchronous.group) == (("sync",), ("async",))
    assert "--async" not in bench.command(sync, args, tmp_path) and sync.threads == 2
    cmd = bench.command(asynchronous, args, tmp_path)
    assert "--async" in cmd and cmd[cmd.index("--staleness") + 1] == "2" and asynchronous.threads == 1


def test_medians_count_a_run_that_never_reached_as_infinitely_slow():
    bench = load_bench()
    assert bench._median([30, None, 50]) == 50
    assert bench._median([30, None, None]) is None
    assert bench._median([10, 20]) == 15


def test_aggregate_and_the_async_ratio():
    bench = load_bench()
    results = [
        {"mode": "sync", "seed": 0, "versions_to_0.8": 40, "rl_s_to_0.8": 100.0, "heldout_after": 1.0,
         "trajectories_per_min": 600.0, "trajectories_per_cpu_min": 1200.0, "rl_cores": 0.5},
        {"mode": "sync", "seed": 1, "versions_to_0.8": None, "rl_s_to_0.8": None, "heldout_after": 0.7,
         "trajectories_per_min": 500.0, "trajectories_per_cpu_min": 1000.0, "rl_cores": 0.5},
        {"mode": "async", "seed": 0, "versions_to_0.8": 45, "rl_s_to_0.8": 80.0, "heldout_after": 1.0,
         "trajectories_per_min": 900.0, "trajectories_per_cpu_min": 1100.0, "rl_cores": 0.8},
        {"mode": "async", "seed": 1, "versions_to_0.8": 50, "rl_s_to_0.8": 90.0, "heldout_after": 0.9,
         "trajectories_per_min": 800.0, "trajectories_per_cpu_min": 1000.0, "rl_cores": 0.8},
    ]
    rows = bench.aggregate(results, ("mode",))
    by = {r["mode"]: r for r in rows}
    assert by["sync"]["reached"] == "1/2" and by["sync"]["median_versions_to_0.8"] is None
    assert by["async"]["median_rl_s_to_0.8"] == 85.0 and by["async"]["rl_s_to_0.8"] == [80.0, 90.0]
    ratios = bench.compare(rows, results)
    assert ratios["async_over_sync"]["trajectories_per_min"] == round(850 / 550, 3)
    assert ratios["per_seed"][0]["rl_s_to_0.8"] == 0.8 and ratios["per_seed"][1]["rl_s_to_0.8"] is None
