"""The rollout driver in the chart (docs/deploy.md, "The rollout driver"): `agentflow drive` as a Deployment wherever
the trainer runs, one per query source (production traffic, a labelled dataset), calling the gateway with the key of
its own Secret; its settings are DriveSettings fields; a KafkaUser that may only read what it follows (the trainer's
progress, and `trajectories` for the traffic driver); a bound on how far it runs ahead of the trainer; ingress for
metrics only and egress to the gateway and Kafka only; and a render that fails when the gateway would refuse its
training rollouts."""

from __future__ import annotations

import argparse
import dataclasses
import shlex

import jsonschema
import pytest
import yaml

from .conftest import CHART, Render, parse, run, template, template_command
from .test_chart_objects import FULLNAME, container, env_of, pod, selects
from .test_chart_validate import K8S_VERSION, check_validation_output
from .test_chart_values import SCHEMA, merged

GPU = CHART / "values-gpu.yaml"
TRAFFIC, DATASET = f"{FULLNAME}-driver", f"{FULLNAME}-driver-dataset"
ANONYMOUS = {"trainer": {"enabled": True}, "driver": {"allowAnonymousTraining": True}}
# variant -> (values files, values on top)
VARIANTS = {
    "gpu": ([GPU], {}),
    # both sources; the dataset from a ConfigMap; the gateway admits only one namespace
    "both": ([GPU], {"driver": {"dataset": {"path": "train.jsonl", "configMap": "agentflow-train-set"}},
                     "networkPolicy": {"gatewayFrom": [{"namespaceSelector": {"matchLabels": {
                         "kubernetes.io/metadata.name": "web"}}}]}}),
    # the dataset only, from a claim; the trainer's group size, the LLM token set (never given to the driver)
    "dataset-pvc": ([GPU], {"driver": {"fromTraffic": False, "dataset": {"path": "sets/train.jsonl",
                                                                          "persistentVolumeClaim": "datasets"}},
                            "trainer": {"settings": {"grpo_group_size": 6, "grpo_batch_trajectories": 240}},
                            "llm": {"apiKeySecret": "llm-token"}}),
    # development: no gateway keys, anonymous training explicitly allowed, the synthetic environment
    "anonymous": ([], {**ANONYMOUS, "driver": {**ANONYMOUS["driver"], "dataset": {"path": "synthetic:3"}}}),
    "no-trainer": ([GPU], {"trainer": {"enabled": False}}),
    "driver-off": ([GPU], {"driver": {"enabled": False}}),
}


@pytest.fixture(scope="module")
def variant_command(helm, tmp_path_factory):
    folder = tmp_path_factory.mktemp("driver-variants")

    def command(variant: str) -> list[str]:
        files, extra = VARIANTS[variant]
        path = folder / f"{variant}.yaml"
        path.write_text(yaml.safe_dump(extra))
        return template_command(helm, [*files, path])

    return command


@pytest.fixture(scope="module")
def render_variant(variant_command):
    cache: dict[str, Render] = {}

    def render(variant: str) -> Render:
        if variant not in cache:
            text = run(variant_command(variant)).stdout
            cache[variant] = Render(text, parse(text))
        return cache[variant]

    return render


def is_driver(doc: dict) -> bool:
    return doc["metadata"]["labels"]["app.kubernetes.io/component"].startswith("driver")


def drive_parser() -> argparse.ArgumentParser:
    from agentflow.trainer.cli import add_parsers

    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    return parser


def labels_of(dep: dict) -> dict:
    return dep["spec"]["template"]["metadata"]["labels"]


# ------------------------------------------------------------------------------------------------- on with the trainer


def test_on_by_default_wherever_the_trainer_is(render_profile, render_variant):
    assert render_profile("gpu").has("Deployment", TRAFFIC)  # values-gpu.yaml enables the trainer, not the driver
    for profile in ("default", "dev-cpu"):  # no trainer: no driver, nothing of it
        assert not [d for d in render_profile(profile).docs if is_driver(d)], profile
    for variant in ("no-trainer", "driver-off"):
        assert not [d for d in render_variant(variant).docs if is_driver(d)], variant
    assert not render_variant("no-trainer").has("Deployment", f"{FULLNAME}-trainer")
    assert render_variant("driver-off").has("Deployment", f"{FULLNAME}-trainer")
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in render_profile("gpu").docs if is_driver(d))
    assert kinds == [("Deployment", TRAFFIC), ("KafkaUser", TRAFFIC), ("NetworkPolicy", f"{TRAFFIC}-egress")]


def test_one_deployment_per_source(render_variant):
    assert {d["metadata"]["name"] for d in render_variant("both").of_kind("Deployment") if is_driver(d)} == {
        TRAFFIC, DATASET}
    assert {d["metadata"]["name"] for d in render_variant("dataset-pvc").of_kind("Deployment") if is_driver(d)} == {
        DATASET}


@pytest.mark.parametrize("variant, name", [("gpu", TRAFFIC), ("both", TRAFFIC), ("both", DATASET),
                                           ("dataset-pvc", DATASET), ("anonymous", DATASET)])
def test_settings_are_drive_settings_and_pass_its_validation(render_variant, variant, name):
    """`agentflow drive` with AGENTFLOW_DRIVE_* variables that are all DriveSettings fields (the prefix DriveSettings
    is read with: trainer/cli.py), valid together; the gateway's Service and gRPC port; its /metrics port."""
    from agentflow.config import from_env
    from agentflow.trainer.drive import DriveSettings

    render = render_variant(variant)
    dep = render.get("Deployment", name)
    main = container(dep)
    args = drive_parser().parse_args(main["args"])
    assert args.command == "drive" and main["image"] == "agentflow:0.1.0"  # the CPU image
    env = {k: v for k, v in env_of(render, dep).items() if k.startswith("AGENTFLOW_DRIVE_")}
    known = {f"AGENTFLOW_DRIVE_{f.name.upper()}" for f in dataclasses.fields(DriveSettings)}
    assert set(env) <= known, f"{set(env) - known} are read by nothing"
    env = {k: ("afk_test" if v.startswith("<from") else v) for k, v in env.items()}
    settings = from_env(DriveSettings, "DRIVE_", environ=env)
    gateway = render.get("Service", f"{FULLNAME}-gateway")
    port = next(p["port"] for p in gateway["spec"]["ports"] if p["name"] == "grpc")
    assert settings.gateway == f"{FULLNAME}-gateway.agentflow.svc.cluster.local:{port}"
    assert settings.from_traffic is (name == TRAFFIC)
    assert settings.planner_version == "latest"
    assert settings.metrics_port == next(p["containerPort"] for p in main["ports"] if p["name"] == "metrics")
    assert settings.metrics_host == "0.0.0.0"
    loop = render.get("ConfigMap", f"{FULLNAME}-env")["data"]
    assert settings.max_steps == int(loop["AGENTFLOW_LOOP_MAX_STEPS"])
    assert settings.max_time_s == float(loop["AGENTFLOW_LOOP_MAX_TIME_S"])
    # SIGTERM: drive waits for the rollouts in flight, each bounded by max_time_s + 15
    assert pod(dep)["terminationGracePeriodSeconds"] >= settings.max_time_s + 15
    assert settings.group_size == (6 if variant == "dataset-pvc" else 8)  # the trainer's


def test_group_size_and_rates_from_values(helm, tmp_path):
    values = tmp_path / "v.yaml"
    values.write_text(yaml.safe_dump({"driver": {"groupSize": 8, "concurrency": 3, "rate": 0.5, "maxSteps": 4,
                                                 "maxTimeSeconds": 45, "plannerVersion": "",
                                                 "settings": {"temperature": 0.7, "traffic_window": 1000000}}}))
    render = Render("", parse(template(helm, [GPU, values]).stdout))
    env = env_of(render, render.get("Deployment", TRAFFIC))
    assert (env["AGENTFLOW_DRIVE_GROUP_SIZE"], env["AGENTFLOW_DRIVE_CONCURRENCY"], env["AGENTFLOW_DRIVE_RATE"],
            env["AGENTFLOW_DRIVE_MAX_STEPS"], env["AGENTFLOW_DRIVE_MAX_TIME_S"]) == ("8", "3", "0.5", "4", "45")
    assert env["AGENTFLOW_DRIVE_PLANNER_VERSION"] == ""
    assert (env["AGENTFLOW_DRIVE_TEMPERATURE"], env["AGENTFLOW_DRIVE_TRAFFIC_WINDOW"]) == ("0.7", "1000000")


def test_settings_values_are_the_drive_settings_no_other_value_sets():
    from agentflow.trainer.drive import DriveSettings

    dedicated = {"gateway", "dataset", "group_size", "rate", "concurrency", "max_steps", "max_time_s", "api_key",
                 "planner_version", "from_traffic", "bootstrap", "metrics_port", "metrics_host", "max_ahead_groups",
                 "groups"}  # groups: a Deployment's driver runs until stopped
    allowed = set(SCHEMA["properties"]["driver"]["properties"]["settings"]["propertyNames"]["enum"])
    assert allowed == {f.name for f in dataclasses.fields(DriveSettings)} - dedicated


# ------------------------------------------------------------------------------------------------- the API key


def test_the_key_comes_from_the_drivers_own_secret(render_variant, helm, tmp_path):
    for variant, name in (("gpu", TRAFFIC), ("both", DATASET), ("dataset-pvc", DATASET)):
        main = container(render_variant(variant).get("Deployment", name))
        env = {e["name"]: e for e in main["env"]}
        assert env["AGENTFLOW_DRIVE_API_KEY"]["valueFrom"]["secretKeyRef"] == {
            "name": "agentflow-driver-api-key", "key": "api-key"}, variant
        # the driver calls only the gateway: the chart's LLM token is not in its environment
        assert "AGENTFLOW_API_KEY" not in env, variant
    assert "AGENTFLOW_API_KEY" in env_of(render_variant("dataset-pvc"),
                                         render_variant("dataset-pvc").get("Deployment", f"{FULLNAME}-planner"))
    values = tmp_path / "v.yaml"
    values.write_text(yaml.safe_dump({"driver": {"apiKeySecret": "rollouts", "apiKeyKey": "key"}}))
    main = container(Render("", parse(template(helm, [GPU, values]).stdout)).get("Deployment", TRAFFIC))
    (key,) = [e for e in main["env"] if e["name"] == "AGENTFLOW_DRIVE_API_KEY"]
    assert key["valueFrom"]["secretKeyRef"] == {"name": "rollouts", "key": "key"}


def test_the_gateway_keeps_its_anonymous_scopes_unless_training_is_allowed(render_variant, render_profile):
    from agentflow.config import from_env
    from agentflow.services.gateway import GatewayConfig
    from agentflow.services.gateway.keys import KeyRing

    render = render_variant("anonymous")
    gateway = env_of(render, render.get("Deployment", f"{FULLNAME}-gateway"))
    config = from_env(GatewayConfig, "GATEWAY_", environ={k: v for k, v in gateway.items()
                                                          if k.startswith("AGENTFLOW_GATEWAY_")})
    assert config.allow_anonymous and not config.api_keys
    assert "train" in KeyRing(config.api_keys, config.anonymous_scopes).caller("").scopes
    assert "AGENTFLOW_DRIVE_API_KEY" not in env_of(render, render.get("Deployment", DATASET))
    for profile in ("default", "dev-cpu", "gpu"):
        env = env_of(render_profile(profile), render_profile(profile).get("Deployment", f"{FULLNAME}-gateway"))
        assert "AGENTFLOW_GATEWAY_ANONYMOUS_SCOPES" not in env, profile


# The render-time rule: a driver whose rollouts the gateway would refuse is not deployed.
REFUSED = {
    "anonymous-gateway": ([], {"trainer": {"enabled": True}},
                          ["gateway.apiKeysSecret is empty", "train", "driver.allowAnonymousTraining=true",
                           "agentflow keys new driver --scopes solve,train", "driver.enabled=false"]),
    "no-driver-key": ([GPU], {"driver": {"apiKeySecret": ""}},
                      ["driver.apiKeySecret is empty", "gateway.apiKeysSecret",
                       "agentflow keys new driver --scopes solve,train"]),
    "no-source": ([GPU], {"driver": {"fromTraffic": False}}, ["no query source", "driver.dataset.path"]),
    "file-without-volume": ([GPU], {"driver": {"dataset": {"path": "train.jsonl"}}},
                            ["driver.dataset.path train.jsonl", "configMap", "persistentVolumeClaim"]),
    "two-volumes": ([GPU], {"driver": {"dataset": {"path": "t.jsonl", "configMap": "a",
                                                   "persistentVolumeClaim": "b"}}}, ["not both"]),
    "configmap-key-with-slash": ([GPU], {"driver": {"dataset": {"path": "sets/t.jsonl", "configMap": "a"}}},
                                 ["key in the ConfigMap"]),
    "group-size-mismatch": ([GPU], {"driver": {"groupSize": 4}}, ["driver.groupSize (4)", "trainer's group size (8,"]),
    # the schema
    "unknown-key": ([GPU], {"driver": {"replicas": 2}}, ["replicas"]),
    "unknown-setting": ([GPU], {"driver": {"settings": {"groups": 10}}}, ["groups"]),
    "group-of-one": ([GPU], {"driver": {"groupSize": 1}}, ["groupSize"]),
    "negative-rate": ([GPU], {"driver": {"rate": -1}}, ["rate"]),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_with_a_clear_message(helm, tmp_path, case):
    files, values, words = REFUSED[case]
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump(values))
    result = template(helm, [*files, path], check=False)
    assert result.returncode != 0, f"{case} rendered:\n{result.stdout[:1000]}"
    for word in words:
        assert word in result.stderr, f"{case}: {word!r} not in:\n{result.stderr}"


# ------------------------------------------------------------------------------------------------- Kafka


def followed_by_drive(monkeypatch, from_traffic: bool) -> tuple[set[str], set]:
    """The topics a driver follows and their consumer groups, from the code: every driver the trainer's progress
    (trainer/pace.py), the traffic driver also `trajectories` (trainer/drive.py)."""
    import threading

    from agentflow.bus import clients
    from agentflow.trainer.drive import DriveSettings, TrafficPool, drive_bus, follow_traffic
    from agentflow.trainer.pace import TrainerPace, follow_progress

    followed, groups = set(), set()

    class Recorder(clients.Follower):  # the real one, but it does not start
        def start(self):
            followed.update(self.topics)
            groups.add(self.group_id)
            return self

    monkeypatch.setattr(clients, "Follower", Recorder)
    follow_progress(drive_bus(DriveSettings(bootstrap="kafka:9092")), TrainerPace(1), threading.Event())
    if from_traffic:
        follow_traffic(DriveSettings(from_traffic=True, bootstrap="kafka:9092"), TrafficPool(), threading.Event())
    return followed, groups


def test_each_driver_may_only_read_what_it_follows(render_variant, monkeypatch):
    """What the drivers consume, outside any consumer group; they produce nothing."""
    from .test_kafka_access import allowed

    for variant, names in (("gpu", (TRAFFIC,)), ("both", (TRAFFIC, DATASET)), ("dataset-pvc", (DATASET,))):
        render = render_variant(variant)
        for name in names:
            followed, groups = followed_by_drive(monkeypatch, from_traffic=name == TRAFFIC)
            assert groups == {None} and followed == ({"trajectories", "trainer.progress"} if name == TRAFFIC
                                                     else {"trainer.progress"})
            user = render.get("KafkaUser", name)
            assert user["spec"]["authentication"]["type"] == "tls"
            assert allowed(user, "Read") == followed
            assert allowed(user, "Write") == set() and allowed(user, "Read", "group") == set()
            assert {op for acl in user["spec"]["authorization"]["acls"] for op in acl["operations"]} == {
                "Read", "Describe"}
            spec = pod(render.get("Deployment", name))
            (volume,) = [v for v in spec["volumes"] if v["name"] == "kafka-user"]
            assert volume["secret"]["secretName"] == name
        assert render.has("KafkaUser", DATASET) == (DATASET in names)


def test_a_driver_runs_at_most_max_staleness_steps_ahead_of_the_trainer(render_variant, helm, tmp_path):
    """AGENTFLOW_DRIVE_MAX_AHEAD_GROUPS: (max_staleness + 1) x the trainer's groups per step, shared among the
    drivers but never below one step's groups; driver.maxAheadGroups sets it (0: no bound)."""
    def ahead(render, name):
        return int(env_of(render, render.get("Deployment", name))["AGENTFLOW_DRIVE_MAX_AHEAD_GROUPS"])

    assert ahead(render_variant("gpu"), TRAFFIC) == (4 + 1) * 256 // 8  # values-gpu: 256 trajectories of 8 a step
    both = render_variant("both")
    assert ahead(both, TRAFFIC) == ahead(both, DATASET) == (4 + 1) * 32 // 2
    assert ahead(render_variant("dataset-pvc"), DATASET) == (4 + 1) * (240 // 6)
    for settings, expected in (({"grpo_max_staleness": 0}, 32), ({"grpo_max_staleness": 2}, 96)):
        values = tmp_path / "v.yaml"
        values.write_text(yaml.safe_dump({"trainer": {"settings": settings}}))
        assert ahead(Render("", parse(template(helm, [GPU, values]).stdout)), TRAFFIC) == expected, settings
    for set_to in (0, 7):
        values = tmp_path / "v.yaml"
        values.write_text(yaml.safe_dump({"driver": {"maxAheadGroups": set_to}}))
        assert ahead(Render("", parse(template(helm, [GPU, values]).stdout)), TRAFFIC) == set_to


def test_scram_driver_user(helm, tmp_path):
    values = tmp_path / "v.yaml"
    values.write_text("kafka:\n  securityProtocol: SASL_SSL\n")
    render = Render("", parse(template(helm, [GPU, values]).stdout))
    assert render.get("KafkaUser", TRAFFIC)["spec"]["authentication"]["type"] == "scram-sha-512"
    env = {e["name"]: e for e in container(render.get("Deployment", TRAFFIC))["env"]}
    assert env["AGENTFLOW_KAFKA_SASL_USERNAME"]["value"] == TRAFFIC
    assert env["AGENTFLOW_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": TRAFFIC, "key": "password"}


# ------------------------------------------------------------------------------------------------- the dataset


def test_dataset_volumes(render_variant):
    render = render_variant("both")
    main, spec = container(render.get("Deployment", DATASET)), pod(render.get("Deployment", DATASET))
    assert env_of(render, render.get("Deployment", DATASET))["AGENTFLOW_DRIVE_DATASET"] == "/dataset/train.jsonl"
    assert {"name": "dataset", "mountPath": "/dataset", "readOnly": True} in main["volumeMounts"]
    assert {"name": "dataset", "configMap": {"name": "agentflow-train-set"}} in spec["volumes"]
    render = render_variant("dataset-pvc")
    dep = render.get("Deployment", DATASET)
    assert env_of(render, dep)["AGENTFLOW_DRIVE_DATASET"] == "/dataset/sets/train.jsonl"
    assert {"name": "dataset", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}} in pod(
        dep)["volumes"]
    render = render_variant("anonymous")  # synthetic:SEED: generated, no volume
    dep = render.get("Deployment", DATASET)
    assert env_of(render, dep)["AGENTFLOW_DRIVE_DATASET"] == "synthetic:3"
    assert [v["name"] for v in pod(dep)["volumes"]] == ["tmp"]


# ------------------------------------------------------------------------------------------------- like the others


@pytest.mark.parametrize("variant", ["both", "dataset-pvc", "anonymous"])
def test_variant_passes_kubernetes_validate_strict(kubernetes_validate, variant_command, render_variant, variant):
    pipeline = (f"set -o pipefail; {shlex.join(variant_command(variant))} | "
                f"{shlex.join(kubernetes_validate)} --strict -k {K8S_VERSION} -")
    result = run(["bash", "-c", pipeline], check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    check_validation_output(result.stdout, render_variant(variant).docs)


def test_values_satisfy_the_schema():
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    for files, extra in VARIANTS.values():
        values = defaults
        for path in files:
            values = merged(values, yaml.safe_load(path.read_text()))
        jsonschema.validate(merged(values, extra), SCHEMA)


@pytest.mark.parametrize("variant, name", [("gpu", TRAFFIC), ("both", DATASET)])
def test_pod_like_the_other_deployables(render_variant, variant, name):
    """Restricted security context, read-only root with /tmp, no API token, resources, /metrics probes."""
    from .test_chart_objects import restricted

    dep = render_variant(variant).get("Deployment", name)
    spec, main = pod(dep), container(dep)
    restricted(spec, main)
    assert spec["automountServiceAccountToken"] is False
    tmp = next(v for v in spec["volumes"] if v["name"] == "tmp")
    assert {"name": "tmp", "mountPath": "/tmp"} in main["volumeMounts"] and tmp["emptyDir"]["sizeLimit"]
    assert {"cpu", "memory"} <= set(main["resources"]["requests"]) and "memory" in main["resources"]["limits"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert main[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert "startupProbe" not in main
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    assert spec["terminationGracePeriodSeconds"] > 0
    assert dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9090"


def test_no_probes_without_metrics(helm, tmp_path):
    values = tmp_path / "v.yaml"
    values.write_text("metrics:\n  enabled: false\n")
    main = container(Render("", parse(template(helm, [GPU, values]).stdout)).get("Deployment", TRAFFIC))
    assert "ports" not in main and "readinessProbe" not in main and "livenessProbe" not in main
    assert not {e["name"] for e in main["env"]} & {"AGENTFLOW_DRIVE_METRICS_PORT", "AGENTFLOW_DRIVE_METRICS_HOST"}


def test_network_policies(render_variant):
    render = render_variant("both")
    policies = render.of_kind("NetworkPolicy")
    deps = {name: render.get("Deployment", name) for name in (TRAFFIC, DATASET)}
    gateway_labels = labels_of(render.get("Deployment", f"{FULLNAME}-gateway"))
    for name, dep in deps.items():
        labels = labels_of(dep)
        assert selects(render.get("NetworkPolicy", f"{FULLNAME}-default-deny"), labels)
        # ingress: the metrics port only
        admitting = [p for p in policies if p["spec"].get("ingress") and selects(p, labels)]
        assert [p["metadata"]["name"] for p in admitting] == [f"{FULLNAME}-metrics-ingress"], name
        assert [r["ports"] for r in admitting[0]["spec"]["ingress"]] == [[{"port": 9090, "protocol": "TCP"}]]
        # egress: its own policy only (the release-wide one leaves it out): DNS, the gateway, Kafka for traffic
        egress = [p for p in policies if "Egress" in p["spec"]["policyTypes"] and p["spec"].get("egress")
                  and selects(p, labels)]
        assert [p["metadata"]["name"] for p in egress] == [f"{name}-egress"], name
        rules = egress[0]["spec"]["egress"]
        assert rules[0] == {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
        (to_gateway,) = rules[1]["to"]
        assert rules[1]["ports"] == [{"port": 50051, "protocol": "TCP"}]
        assert all(gateway_labels[k] == v for k, v in to_gateway["podSelector"]["matchLabels"].items())
        assert to_gateway["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "gateway"
        kafka = rules[2:]  # both follow the trainer's progress
        assert kafka == [{"ports": [{"port": 9093, "protocol": "TCP"}], "to": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kafka"}}}]}], name
        # the gateway admits the drivers although networkPolicy.gatewayFrom names only another namespace
        gateway_from = render.get("NetworkPolicy", f"{FULLNAME}-gateway-ingress")["spec"]["ingress"][0]["from"]
        assert any(selects({"spec": {"podSelector": peer["podSelector"]}}, labels)
                   for peer in gateway_from if "podSelector" in peer), name
    # every other pod keeps the release-wide egress
    release_wide = render.get("NetworkPolicy", f"{FULLNAME}-egress")
    for dep in render.of_kind("Deployment"):
        assert selects(release_wide, labels_of(dep)) is (dep["metadata"]["name"] not in deps), dep["metadata"]["name"]


def test_scraped_by_the_pod_monitor(helm, variant_command):
    text = run([*variant_command("both"), "--set", "monitoring.podMonitor.enabled=true"]).stdout
    render = Render(text, parse(text))
    monitor = render.get("PodMonitor", FULLNAME)  # the release's pods (another one scrapes KServe's predictors)
    for name in (TRAFFIC, DATASET):
        dep = render.get("Deployment", name)
        assert selects({"spec": {"podSelector": monitor["spec"]["selector"]}}, labels_of(dep))
        ports = {p["name"] for p in container(dep)["ports"]}
        assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} & ports == {"metrics"}
