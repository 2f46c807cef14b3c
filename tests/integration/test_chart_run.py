"""The shipped CPU training profile, run as the chart renders it (agentflow/chart_run.py): every workload with its own
command, arguments, environment and volumes on a loopback address of its own, production traffic without ground
truth, simulated users rating half the answers (a fifth of the ratings wrong). The loop must turn: the trainer trains
on replays of that traffic, its versions reach the driver's `latest` rollouts without one failing, the controller
canaries them, and no production query fails. (Promotion at the profile's 200 trajectories an arm takes longer than
CI affords: bench/chart_loop.py measures it.)"""

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


def test_the_rendered_cpu_training_profile_turns_the_loop(tmp_path):
    with Loop("cpu-train", tmp_path, rated_share=0.5, rating_noise=0.2, traffic_qps=3.0,
              progress=lambda line: None) as loop:
        t0 = time.monotonic()
        seen = loop.observe()
        # a budget in evidence, not seconds: wait while the trainer keeps stepping, at most 10 minutes
        while time.monotonic() - t0 < 600 and not (seen["trainer_steps"].get("trained", 0) >= 5
                                                   and seen["decisions"].get("canary", 0) >= 1
                                                   and seen["production"]["answered"] >= 50):
            time.sleep(5)
            seen = loop.observe()
        assert seen["trainer_steps"].get("trained", 0) >= 5, seen
        assert seen["decisions"].get("canary", 0) >= 1, seen  # a trained version on production traffic
        assert seen["driver_sent"] > 0 and not seen["driver_failed"], seen  # `latest` always resolved
        assert seen["production"]["failed"] == 0 and seen["production"]["answered"] >= 50, seen
        assert seen["feedback"]["sent"] > 0 and seen["feedback"]["failed"] == 0, seen

        # an operator's view of the same loop: `agentflow status` from the broker and the controller's metrics
        done = subprocess.run([sys.executable, "-m", "agentflow.cli", "status", "--json",
                               "--bootstrap", loop.run.broker.bootstrap,
                               "--rollout-metrics", loop.run.address(loop.name("rollout"), 9090)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
        assert status["trainer"]["trained_steps"] >= 5 and status["trainer"]["updated_s_ago"] < 60, status
        assert status["canary"] or status["last_promotion"], status
        assert status["canary"] is None or status["canary"]["canary_arm"]["samples"] > 0, status
