"""The OpenMP thread count a process takes: the CPUs it may use, capped by its cgroup quota (agentflow/cpus.py)."""

import json
import os
import subprocess
import sys

import pytest

from agentflow import cpus

AFFINITY = len(os.sched_getaffinity(0))


@pytest.mark.parametrize("text, expected", [
    ("max 100000\n", AFFINITY),  # no quota
    ("150000 100000\n", 1),  # 1.5 CPUs: whole ones only
    ("50000 100000\n", 1),  # below one CPU: still one thread
    (f"{(AFFINITY + 8) * 100000} 100000\n", AFFINITY),  # a quota above the affinity mask: the mask
    ("garbage\n", AFFINITY),
    ("100000 0\n", AFFINITY),
])
def test_the_quota_caps_the_affinity_mask(tmp_path, text, expected):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text(text)
    assert cpus.usable_cpus(cpu_max) == expected


def test_no_cgroup_file_means_the_affinity_mask(tmp_path):
    assert cpus.usable_cpus(tmp_path / "absent") == AFFINITY


def test_a_value_already_set_is_kept():
    env = {"OMP_NUM_THREADS": "3"}
    assert cpus.default_threads(env) == "3" and env == {"OMP_NUM_THREADS": "3"}
    env = {}
    assert cpus.default_threads(env) == str(cpus.usable_cpus()) == env["OMP_NUM_THREADS"]


@pytest.mark.parametrize("preset", [None, "1"])
def test_the_command_sets_the_threads_before_torch_loads(preset):
    """`agentflow env` reports the threads torch runs: usable_cpus() when OMP_NUM_THREADS is unset, else its value."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if preset:
        env["OMP_NUM_THREADS"] = preset
    out = subprocess.run([sys.executable, "-m", "agentflow.cli", "env", "--json"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["torch"]["threads"] == int(preset or cpus.usable_cpus())
