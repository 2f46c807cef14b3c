"""The shipped trainer profiles, run as the chart renders them (agentflow/chart_run.py; values-gpu.yaml with its CPU
overlay, charts/agentflow/ci/gpu-on-cpu.yaml): every workload with its own command, arguments, environment, secrets
and volumes on a loopback address of its own, production traffic without ground truth, simulated users rating half
the answers (a fifth of the ratings wrong). The loop must turn: the trainer trains on replays of that traffic, its
versions reach the driver's `latest` rollouts without one failing, the controller canaries them, no production query
fails, and `agentflow status` shows it. (Promotion at the profiles' canary sizes takes longer than CI affords:
bench/chart_loop.py measures it.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from agentflow import chart
from agentflow.chart_run import plan
from bench.chart_loop import Loop

pytestmark = pytest.mark.slow
CPU_TRAIN = ["values-dev-cpu.yaml", "values-cpu-train.yaml"]


def test_the_plan_localises_names_addresses_and_paths(tmp_path):
    objects = chart.render([chart.CHART / f for f in CPU_TRAIN], {"kafka": {"bootstrapServers": "127.0.0.1:9"}})
    workloads = plan(objects, tmp_path)
    llm, trainer, planner = (workloads[f"agentflow-{n}"] for n in ("llm", "trainer", "planner"))
    (serve,) = llm.containers
    assert f"--host={llm.address}" in serve.argv
    store = str(tmp_path / "claims" / "agentflow-checkpoints")
    assert f"--model-store={store}" in serve.argv  # one claim, one folder, for every workload that mounts it
    assert trainer.containers[0].env["AGENTFLOW_TRAINER_MODEL_STORE"] == store
    assert planner.containers[0].env["AGENTFLOW_PLANNER_ENDPOINT"] == f"http://{llm.address}:8000/v1"
    assert planner.containers[0].env["AGENTFLOW_RPC_HOST"] == planner.address
    assert llm.init and llm.init[0].argv[-1] == str(tmp_path / "volumes" / "agentflow-llm" / "models" / "tiny")


# profile -> trained steps to wait for: values-gpu.yaml's steps take 256 trajectories (the cpu one's 48)
STEPS = {"cpu-train": 5, "gpu": 1}


@pytest.mark.parametrize("profile", STEPS)
def test_the_rendered_profile_turns_the_loop(tmp_path, profile):
    with Loop(profile, tmp_path, rated_share=0.5, rating_noise=0.2, traffic_qps=3.0,
              progress=lambda line: None) as loop:
        t0 = time.monotonic()
        seen = loop.observe()
        # a budget in evidence, not seconds: wait for the steps and a canary, at most 15 minutes
        while time.monotonic() - t0 < 900 and not (seen["trainer_steps"].get("trained", 0) >= STEPS[profile]
                                                   and seen["decisions"].get("canary", 0) >= 1
                                                   and seen["production"]["answered"] >= 50):
            time.sleep(5)
            seen = loop.observe()
        assert seen["trainer_steps"].get("trained", 0) >= STEPS[profile], seen
        assert seen["decisions"].get("canary", 0) >= 1, seen  # a trained version on production traffic
        # `latest` always resolved (a loaded machine may still time a rollout out: that is no missing version)
        assert seen["driver_sent"] > 0 and "NOT_FOUND" not in seen["driver_failed"], seen
        assert seen["production"]["failed"] == 0 and seen["production"]["answered"] >= 50, seen
        assert seen["feedback"]["sent"] > 0 and seen["feedback"]["failed"] == 0, seen

        # an operator's view of the same loop: `agentflow status` from the broker and the controller's metrics
        done = subprocess.run([sys.executable, "-m", "agentflow.cli", "status", "--json",
                               "--bootstrap", loop.run.broker.bootstrap,
                               "--rollout-metrics", loop.run.address(loop.name("rollout"), 9090)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
        trainer = status["trainer"]
        assert trainer["trained_steps"] >= STEPS[profile] and trainer["updated_s_ago"] < 600, status
        assert status["newest_version"] and status["last_decision"], status  # the controller's decisions, read
        assert status["canary"] is None or "samples" in status["canary"]["canary_arm"], status
