"""What ships is what is demonstrated: every shipped trainer profile renders settings its trainer, drivers and rollout
controller accept, a controller that could never reward a canary is refused by the chart and at start, and
`agentflow demo` runs the CPU training profile with nothing but the differences agentflow/demo/differences.yaml
lists, each with its reason."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from agentflow import chart
from agentflow.config import from_env
from agentflow.demo import processes, settings as demo
from agentflow.demo.settings import DemoSettings
from agentflow.errors import InvalidInput
from agentflow.rollout import cli as rollout_cli
from agentflow.rollout.settings import RolloutSettings
from agentflow.trainer.drive import DriveSettings
from agentflow.trainer.service import trainer_settings

#: every shipped profile that runs a trainer, as installed (docs/deploy.md)
TRAINER_PROFILES = {"cpu-train": ["values-dev-cpu.yaml", "values-cpu-train.yaml"], "gpu": ["values-gpu.yaml"],
                    "gpu-lora-7b": ["values-gpu.yaml", "values-gpu-lora-7b.yaml"],
                    "gpu-8-full-7b": ["values-gpu.yaml", "values-gpu-8-full-7b.yaml"]}
VARIANTS = [DemoSettings(), DemoSettings(unlabeled=True), DemoSettings(profile="smol"),
            DemoSettings(serving="lora", unlabeled=True), DemoSettings(serving="separate", traffic_qps=2)]


def rendered(files: list[str], overlay: dict | None = None) -> dict[str, dict[str, str]]:
    return chart.behaviour(chart.render([chart.CHART / f for f in files], overlay))


def with_prefix(env: dict[str, str], prefix: str) -> dict[str, str]:
    return {name: value for name, value in env.items() if name.startswith(prefix)}


@pytest.mark.parametrize("profile", TRAINER_PROFILES)
def test_every_trainer_profile_renders_settings_its_components_accept_and_never_the_rule_reward(helm, profile):
    components = rendered(TRAINER_PROFILES[profile])
    rollout = from_env(RolloutSettings, "ROLLOUT_", environ=components["rollout"])
    trainer_settings(environ=components["trainer"])
    for driver in ("driver", "driver-dataset"):
        if driver in components:
            drive = from_env(DriveSettings, "DRIVE_", environ=components[driver])
            assert drive.planner_version == "latest"
    # production traffic has no ground truth: a canary is decided on a reward the traffic can carry
    assert rollout.reward_source != "rule" and not rollout.traffic_ground_truth
    assert rollout.supersede_s > 0 and rollout.supersede_min_rewarded > 0 and rollout.timeout_action == "rollback"


def test_the_gpu_profile_runs_a_judge_with_a_named_model(helm):
    objects = chart.render([chart.CHART / "values-gpu.yaml"])
    judge = [o for o in objects if o["kind"] == "Deployment"
             and o["metadata"]["labels"].get("app.kubernetes.io/component") == "judge"]
    assert len(judge) == 1
    env = {v["name"]: v.get("value") for v in judge[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env.get("AGENTFLOW_MODEL") == "frozen" or env.get("AGENTFLOW_JUDGE_MODEL") == "frozen", env


@pytest.mark.parametrize("profile", TRAINER_PROFILES)
def test_a_rule_reward_on_unlabeled_traffic_refuses_to_render_naming_the_setting(helm, profile):
    with pytest.raises(InvalidInput, match="rollout.settings.reward_source is rule.*traffic_ground_truth"):
        chart.render([chart.CHART / f for f in TRAINER_PROFILES[profile]],
                     {"rollout": {"settings": {"reward_source": "rule"}}})
    labelled = rendered(TRAINER_PROFILES[profile],
                        {"rollout": {"settings": {"reward_source": "rule", "traffic_ground_truth": True}}})
    assert from_env(RolloutSettings, "ROLLOUT_", environ=labelled["rollout"]).reward_source == "rule"


def test_a_controller_on_the_rule_reward_without_ground_truth_refuses_to_start():
    with pytest.raises(InvalidInput, match="AGENTFLOW_ROLLOUT_REWARD_SOURCE=rule.*TRAFFIC_GROUND_TRUTH=false"):
        from_env(RolloutSettings, "ROLLOUT_", environ={"AGENTFLOW_ROLLOUT_REWARD_SOURCE": "rule"})
    assert RolloutSettings().reward_source == "any"
    assert RolloutSettings(reward_source="rule", traffic_ground_truth=True).reward_source == "rule"


def test_every_difference_has_a_reason_and_every_computed_value_is_listed():
    listed = demo.differences()
    assert set(listed) == {"always", "labelled", "unlabeled", "smol", "lora"}
    for section, entries in listed.items():
        for path, entry in entries.items():
            assert set(entry) in ({"value", "reason"}, {"computed", "reason"}), (section, path)
            assert len(entry["reason"].split()) >= 5, (section, path)
    computed = {path for path, entry in listed["always"].items() if "computed" in entry}
    for settings in VARIANTS:
        assert set(demo.computed(settings)) == computed


class FakeCluster:
    bootstrap, llm_url, admin_token, api_token, env = "127.0.0.1:1", "http://127.0.0.1:2/v1", "admin", "api", {}

    def endpoint(self, name):
        return "127.0.0.1:3"

    def spawn(self, name, argv, timeout_s, env):
        return argparse.Namespace(info={"url": "http://127.0.0.1:4/v1"})


@pytest.mark.parametrize("settings", VARIANTS, ids=lambda s: f"{s.profile}-{s.serving}-unlabeled={s.unlabeled}")
def test_the_demo_runs_the_profile_with_only_its_listed_differences(helm, monkeypatch, tmp_path, settings):
    started: dict[str, tuple[list[str], dict]] = {}
    monkeypatch.setattr("agentflow.services.cluster.start_cluster", lambda **kw: FakeCluster())
    monkeypatch.setattr("agentflow.llm.models.build_tiny", lambda out, seed: Path(out))
    monkeypatch.setattr("agentflow.llm.models.smollm2_dir", lambda: tmp_path)
    monkeypatch.setattr(processes.Processes, "_tied",
                        lambda self, name, argv, env=None: started.setdefault(name, (argv, env or {})))
    run = processes.Processes(settings, tmp_path, progress=lambda line: None)
    run.start_ring()
    run.start_driver()

    expected = rendered(list(demo.PROFILE_FILES), demo.overlay(settings))
    driver = "driver" if settings.unlabeled else "driver-dataset"
    for name, component, prefix in (("trainer", "trainer", "AGENTFLOW_TRAINER_"), ("drive", driver, "AGENTFLOW_DRIVE_"),
                                    ("rollout", "rollout", "AGENTFLOW_ROLLOUT_")):
        argv, env = started[name]
        flags = {a.split("=")[0] for a in argv if a.startswith("--")}
        assert flags <= processes.PLACEMENT_FLAGS, f"{name}: {flags - processes.PLACEMENT_FLAGS} are not the profile's"
        behaviour = {k: v for k, v in with_prefix(env, prefix).items() if k.removeprefix(prefix) not in chart.PLACEMENT}
        assert behaviour == expected[component], name
    assert expected[driver]["AGENTFLOW_DRIVE_MAX_STEPS"] == str(demo.MAX_STEPS)  # every query the demo sends


def test_the_demo_overlay_is_exactly_the_listed_values(helm):
    settings = DemoSettings(unlabeled=True, profile="smol", serving="lora")
    flat: dict[str, object] = {}

    def walk(node, path=""):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{path}{key}.")
            else:
                flat[f"{path}{key}"] = value
    walk(demo.overlay(settings))
    listed = {path: entry.get("value") for section in demo.sections(settings)
              for path, entry in demo.differences()[section].items()}
    assert set(flat) == set(listed)
    assert all(flat[path] == value for path, value in listed.items() if value is not None)


@pytest.mark.parametrize("settings, timeout_s, supersede_s", [
    (DemoSettings(), 120, 60),
    (DemoSettings(traffic_qps=2.5), 240, 120),  # half the rate: the same evidence takes twice as long
    (DemoSettings(traffic_qps=10), 120, 60),  # never shorter than at the rate they were set for
    (DemoSettings(unlabeled=True), 600, 90),
    (DemoSettings(unlabeled=True, traffic_qps=1), 3000, 450),
])
def test_a_slower_traffic_stretches_the_canarys_time_limits(helm, settings, timeout_s, supersede_s):
    parser = argparse.ArgumentParser()
    rollout_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["rollout", "--backend", "local", "--llm-admin-url", "http://127.0.0.1:1"])
    s = rollout_cli.settings_from(args, environ=demo.behaviour(settings)["rollout"])
    assert (s.timeout_s, s.supersede_s) == (timeout_s, supersede_s)
    assert s.supersede_min_rewarded == (250 if settings.unlabeled else 100)  # evidence, not time: unchanged
    assert s.reward_source == "any" and s.reward_margin == (0.09 if settings.unlabeled else 0.15)
