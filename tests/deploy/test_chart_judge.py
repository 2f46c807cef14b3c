"""The LLM judge in the chart (docs/judge.md, "In the chart"): off by default, and with judge.enabled one Deployment
and Service running `agentflow serve judge` shaped like the ring services, its settings as AGENTFLOW_JUDGE_*, the
engine it judges with, a KafkaUser that reads `trajectories` and writes `feedback`, KEDA on its lag, NetworkPolicies,
and a schema that refuses bad judge values."""

from __future__ import annotations

import argparse
import dataclasses
import shlex

import jsonschema
import pytest
import yaml

from .conftest import CHART, CRD_KINDS, SERVICES, Render, parse, run, template, template_command
from .crd_schemas import SCHEMAS
from .test_chart_objects import FULLNAME, container, env_of, pod, selects
from .test_chart_validate import K8S_VERSION, check_validation_output
from .test_chart_values import SCHEMA

GPU = CHART / "values-gpu.yaml"
NAME = f"{FULLNAME}-judge"
SETTINGS = {"traffic_share": 0.25, "judge_training": False, "max_calls_per_s": 2, "timeout_s": 7.5, "attempts": 3,
            "backoff_s": 0.25, "cache_size": 1000000, "max_tokens": 64, "name": "chart-judge"}
EXTERNAL = "https://judge.example.com/v1"
# variant -> (values files, judge values on top)
VARIANTS = {
    # the dev defaults: Kafka by address, llmServer as the LLM
    "dev": ([], {"judge": {"enabled": True, "settings": SETTINGS}, "llm": {"apiKeySecret": "llm-token"}}),
    # production: Strimzi users over mTLS, KEDA, restricted egress; the judge on its own endpoint and key
    "gpu": ([GPU], {"judge": {"enabled": True, "endpoint": EXTERNAL, "model": "judge-70b",
                              "apiKeySecret": "judge-llm", "apiKeyKey": "token",
                              "egressTo": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
                              "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 3}},
                    "llm": {"apiKeySecret": "llm-token"},
                    # the fleet's own token, not one the chart draws at random on each render
                    "rollout": {"fleet": {"adminTokenSecret": "fleet-admin"}}}),
    # an in-cluster endpoint with a port, prefixed topics and groups; no key of its own: none is sent
    "prefixed": ([GPU], {"judge": {"enabled": True, "endpoint": "http://vllm.models.svc:8001/v1", "model": ""},
                         "kafka": {"topicPrefix": "prod."}, "llm": {"apiKeySecret": "llm-token"},
                         "rollout": {"fleet": {"adminTokenSecret": "fleet-admin"}}}),
}


def write_values(folder, name: str, values: dict):
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.fixture(scope="session")
def variant_command(helm, tmp_path_factory):
    """variant_command(variant, enabled=True) -> its `helm template` command line; enabled=False: the same values
    with judge.enabled false."""
    folder = tmp_path_factory.mktemp("judge-variants")

    def command(variant: str, enabled: bool = True) -> list[str]:
        files, extra = VARIANTS[variant]
        extra = {**extra, "judge": {**extra["judge"], "enabled": enabled}}
        return template_command(helm, [*files, write_values(folder, f"{variant}-{enabled}", extra)])

    return command


@pytest.fixture(scope="session")
def render_variant(variant_command):
    cache: dict[tuple[str, bool], Render] = {}

    def render(variant: str, enabled: bool = True) -> Render:
        if (variant, enabled) not in cache:
            text = run(variant_command(variant, enabled)).stdout
            cache[variant, enabled] = Render(text, parse(text))
        return cache[variant, enabled]

    return render


def is_judge(doc: dict) -> bool:
    return (doc["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "judge"
            or "judge" in doc["metadata"]["name"])


def key(doc: dict) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def judge_env(render) -> dict[str, str]:
    return env_of(render, render.get("Deployment", NAME))


# ------------------------------------------------------------------------------------------------- off by default


def test_only_the_gpu_profile_runs_a_judge(render_profile, profile):
    render = render_profile(profile)
    judged = [key(d) for d in render.docs if is_judge(d)]
    if profile == "gpu":  # its canaries are decided on ratings and the judge's verdicts (docs/rewards.md)
        assert ("Deployment", NAME) in judged
        return
    assert judged == []
    assert "serve judge" not in render.text and "- judge\n" not in render.text
    assert not any("AGENTFLOW_JUDGE_" in line for line in render.text.splitlines())


@pytest.mark.parametrize("variant", ["dev", "gpu"])
def test_enabling_only_adds_judge_objects(render_variant, variant):
    """Every object of the same values without the judge is unchanged, the six services' text included; every new
    object is the judge's."""
    off, on = render_variant(variant, enabled=False), render_variant(variant)
    assert [key(d) for d in off.docs if is_judge(d)] == []
    before, after = {key(d): d for d in off.docs}, {key(d): d for d in on.docs}
    added = set(after) - set(before)
    assert set(before) <= set(after)
    assert {("Deployment", NAME), ("Service", NAME), ("NetworkPolicy", f"{NAME}-ingress")} <= added
    assert all(is_judge(after[k]) for k in added), sorted(added)
    for k, doc in before.items():
        assert after[k] == doc, k
    for name in SERVICES:  # character for character (but the blank tail Helm trims off a template's last document)
        assert _source_of(off.text, "Deployment", f"{FULLNAME}-{name}") == _source_of(
            on.text, "Deployment", f"{FULLNAME}-{name}"), name


def _source_of(text: str, kind: str, name: str) -> str:
    (doc,) = [d for d in text.split("\n---\n") if f"\nkind: {kind}\n" in d and f"\n  name: {name}\n" in d]
    return doc.rstrip()


# ------------------------------------------------------------------------------------------------- the Deployment


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_enabled_passes_kubernetes_validate_strict(kubernetes_validate, variant_command, render_variant, variant):
    pipeline = (f"set -o pipefail; {shlex.join(variant_command(variant))} | "
                f"{shlex.join(kubernetes_validate)} --strict -k {K8S_VERSION} -")
    result = run(["bash", "-c", pipeline], check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    check_validation_output(result.stdout, render_variant(variant).docs)
    assert f"passed for resource deployment/{NAME}" in result.stdout
    for doc in render_variant(variant).docs:
        if doc["kind"] in CRD_KINDS:
            jsonschema.validate(doc, SCHEMAS[doc["kind"]])


@pytest.mark.parametrize("variant", ["dev", "gpu"])
def test_runs_agentflow_serve_judge_like_the_ring_services(render_variant, variant):
    from agentflow.services.serving import add_parsers

    render = render_variant(variant)
    dep = render.get("Deployment", NAME)
    main = container(dep)
    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(main["args"])  # every flag the chart passes exists
    assert (args.command, args.name) == ("serve", "judge")
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert args.port == ports["grpc"] and args.metrics_port == ports["metrics"]
    assert args.tools is None  # the judge calls no tools
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert main[probe]["grpc"] == {"port": ports["grpc"]}, probe
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(ports["metrics"])
    # the same shape as a ring service: security, token, config, resources
    planner = render.get("Deployment", f"{FULLNAME}-planner")
    assert pod(dep)["securityContext"] == pod(planner)["securityContext"]
    assert main["securityContext"] == container(planner)["securityContext"]
    assert pod(dep)["automountServiceAccountToken"] is False
    assert main["envFrom"] == container(planner)["envFrom"]
    env = {e["name"]: e for e in main["env"]}
    assert env["AGENTFLOW_RPC_SERVICE_TOKEN"] == {e["name"]: e for e in container(planner)["env"]}[
        "AGENTFLOW_RPC_SERVICE_TOKEN"]
    assert len(env) == len(main["env"]), "duplicate env names"
    assert {"cpu", "memory"} <= set(main["resources"]["requests"]) and "memory" in main["resources"]["limits"]
    svc = render.get("Service", NAME)
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == ports
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert dep["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]


def test_settings_become_agentflow_judge_variables_the_code_reads(render_variant):
    from agentflow.config import from_env
    from agentflow.services.judge import JudgeSettings

    env = judge_env(render_variant("dev"))
    assert {k: v for k, v in env.items() if k.startswith("AGENTFLOW_JUDGE_")} == {
        f"AGENTFLOW_JUDGE_{k.upper()}": str(v).lower() if isinstance(v, bool) else str(v) for k, v in SETTINGS.items()}
    assert from_env(JudgeSettings, "JUDGE_", environ=env) == JudgeSettings(**SETTINGS)


def test_schema_knows_exactly_the_judge_settings():
    from agentflow.services.judge import JudgeSettings

    allowed = set(SCHEMA["properties"]["judge"]["properties"]["settings"]["properties"])
    assert allowed == {f.name for f in dataclasses.fields(JudgeSettings)}


# ------------------------------------------------------------------------------------------------- the engine


def test_without_an_endpoint_the_judge_uses_the_frozen_llm(render_variant):
    from agentflow.config import EngineSettings, from_env

    render = render_variant("dev")
    env = judge_env(render)
    engine = from_env(EngineSettings, environ=env)
    executor = from_env(EngineSettings, environ=env_of(render, render.get("Deployment", f"{FULLNAME}-executor")))
    assert engine.engine == "openai" and engine.endpoint == executor.endpoint
    assert engine.endpoint == f"http://{FULLNAME}-llm.agentflow.svc.cluster.local:8000/v1"
    assert engine.model == executor.model
    assert env["AGENTFLOW_API_KEY"] == "<from secretKeyRef>"
    key_ref = {e["name"]: e for e in container(render.get("Deployment", NAME))["env"]}["AGENTFLOW_API_KEY"]
    assert key_ref["valueFrom"]["secretKeyRef"]["name"] == "llm-token"  # the chart's LLMs: the chart's token


def test_judge_endpoint_model_and_key(render_variant):
    from agentflow.config import EngineSettings, from_env

    render = render_variant("gpu")
    engine = from_env(EngineSettings, environ=judge_env(render))
    assert (engine.engine, engine.endpoint, engine.model) == ("openai", EXTERNAL, "judge-70b")
    env = {e["name"]: e for e in container(render.get("Deployment", NAME))["env"]}
    assert env["AGENTFLOW_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "judge-llm", "key": "token"}
    # the other services keep the chart's LLMs and token
    executor = from_env(EngineSettings, environ=env_of(render, render.get("Deployment", f"{FULLNAME}-executor")))
    assert executor.endpoint != EXTERNAL
    ring = {e["name"]: e for e in container(render.get("Deployment", f"{FULLNAME}-executor"))["env"]}
    assert ring["AGENTFLOW_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "llm-token"


def test_another_endpoint_never_gets_the_charts_llm_token(render_variant):
    from agentflow.config import EngineSettings, from_env

    render = render_variant("prefixed")
    env = judge_env(render)
    assert "AGENTFLOW_API_KEY" not in env
    engine = from_env(EngineSettings, environ=env)
    assert engine.endpoint == "http://vllm.models.svc:8001/v1" and engine.model == ""  # the server's first model


# ------------------------------------------------------------------------------------------------- Kafka


@pytest.mark.parametrize("variant, prefix", [("gpu", ""), ("prefixed", "prod.")])
def test_kafka_user_reads_trajectories_and_writes_feedback(render_variant, variant, prefix):
    from agentflow.bus import topics
    from agentflow.services.judge import JudgeService

    from .test_kafka_access import allowed

    render = render_variant(variant)
    user = render.get("KafkaUser", NAME)
    assert user["spec"]["authentication"]["type"] == "tls"
    assert allowed(user, "Read") == {prefix + t for t in JudgeService.input_topics} == {prefix + "trajectories"}
    assert allowed(user, "Write") == {prefix + topics.FEEDBACK, prefix + topics.DEADLETTER}
    assert allowed(user, "Read", "group") == {prefix + JudgeService.name}
    every = {op for acl in user["spec"]["authorization"]["acls"] for op in acl["operations"]}
    assert every <= {"Read", "Write", "Describe"}
    # the pod authenticates as its own user
    dep = render.get("Deployment", NAME)
    env = {e["name"]: e.get("value") for e in container(dep)["env"]}
    assert env["AGENTFLOW_KAFKA_TLS_CERTFILE"] == "/etc/agentflow/kafka-user/user.crt"
    (volume,) = [v for v in pod(dep)["volumes"] if v["name"] == "kafka-user"]
    assert volume["secret"]["secretName"] == NAME
    assert any(m["name"] == "kafka-user" for m in container(dep)["volumeMounts"])


def test_keda_scales_the_judge_on_its_trajectories_lag(render_variant):
    scaled = render_variant("gpu").get("ScaledObject", NAME)
    assert scaled["spec"]["scaleTargetRef"]["name"] == NAME
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (1, 3)
    (trigger,) = scaled["spec"]["triggers"]
    assert (trigger["metadata"]["topic"], trigger["metadata"]["consumerGroup"]) == ("trajectories", "judge")
    assert "replicas" not in render_variant("gpu").get("Deployment", NAME)["spec"]  # KEDA owns them


# ------------------------------------------------------------------------------------------------- network


def test_network_policies_admit_health_and_metrics(render_variant):
    render = render_variant("gpu")
    labels = render.get("Deployment", NAME)["spec"]["template"]["metadata"]["labels"]
    ingress = render.get("NetworkPolicy", f"{NAME}-ingress")
    assert selects(ingress, labels)
    ports = {p["port"] for rule in ingress["spec"]["ingress"] for p in rule["ports"]}
    assert ports == {50051, 9090}
    egress = [d for d in render.of_kind("NetworkPolicy") if "Egress" in d["spec"]["policyTypes"] and selects(d, labels)]
    rules = [rule for policy in egress for rule in policy["spec"].get("egress", [])]
    brokers = yaml.safe_load(GPU.read_text())["networkPolicy"]["egress"]["kafka"]
    assert {"ports": [{"port": p, "protocol": "TCP"} for p in brokers["ports"]], "to": brokers["to"]} in rules
    (own,) = [rule for rule in render.get("NetworkPolicy", f"{NAME}-egress")["spec"]["egress"]]
    assert own == {"ports": [{"port": 443, "protocol": "TCP"}], "to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}]}
    # no other pod gets the judge's way out
    for name in SERVICES:
        other = render.get("Deployment", f"{FULLNAME}-{name}")["spec"]["template"]["metadata"]["labels"]
        assert not selects(render.get("NetworkPolicy", f"{NAME}-egress"), other), name


def test_egress_to_the_endpoints_own_port(render_variant):
    (own,) = render_variant("prefixed").get("NetworkPolicy", f"{NAME}-egress")["spec"]["egress"]
    assert own == {"ports": [{"port": 8001, "protocol": "TCP"}]}  # no egressTo: any destination on that port


def test_without_an_endpoint_no_judge_egress_policy(render_variant):
    render = render_variant("dev")
    assert not render.has("NetworkPolicy", f"{NAME}-egress")  # the frozen LLM is reached like the modules reach it
    assert render.has("NetworkPolicy", f"{NAME}-ingress")


# ------------------------------------------------------------------------------------------------- bad values

BAD = {
    "traffic-share-over-1": ({"settings": {"traffic_share": 1.5}}, ["traffic_share"]),
    "unknown-setting": ({"settings": {"trafic_share": 0.5}}, ["trafic_share"]),
    "attempts-zero": ({"settings": {"attempts": 0}}, ["attempts"]),
    "bad-name": ({"settings": {"name": "my judge"}}, ["name"]),
    "endpoint-not-http": ({"endpoint": "ftp://llm/v1"}, ["endpoint"]),
    "enabled-not-bool": ({"enabled": "yes"}, ["enabled"]),
    "unknown-key": ({"endpiont": "http://llm/v1"}, ["endpiont"]),
    "negative-replicas": ({"replicas": -1}, ["replicas"]),
    # the chart's own checks cover the judge too
    "replicas-beyond-partitions": ({"autoscaling": {"enabled": True, "maxReplicas": 8}},
                                   ["judge.autoscaling.maxReplicas", "partitions"]),
    "grace-period-too-short": ({"graceSeconds": 30, "terminationGracePeriodSeconds": 30},
                               ["judge.terminationGracePeriodSeconds"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_judge_values_are_rejected(helm, tmp_path, case):
    judge, words = BAD[case]
    values = {"judge": {"enabled": True, **judge}, "kafka": {"partitions": 4}}
    result = template(helm, [write_values(tmp_path, "bad", values)], check=False)
    assert result.returncode != 0, f"{case} rendered"
    for word in words:
        assert word in result.stderr, f"{case}: {word!r} not in {result.stderr}"


def test_good_judge_values_render(helm, tmp_path):
    """The bad cases fail for their value alone: the same keys with good values render."""
    values = {"judge": {"enabled": True, "settings": {"traffic_share": 1, "attempts": 1, "name": "a.b_c-1"},
                        "endpoint": "http://llm/v1", "replicas": 0,
                        "autoscaling": {"enabled": True, "maxReplicas": 4}}, "kafka": {"partitions": 4}}
    docs = parse(template(helm, [write_values(tmp_path, "good", values)]).stdout)
    assert any(key(d) == ("Deployment", NAME) for d in docs)
