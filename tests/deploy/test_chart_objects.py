"""Assertions on the rendered objects: probes, resources, security contexts, RBAC scope, NetworkPolicies, labels,
and that the commands, flags and AGENTFLOW_* variables the chart sets are the ones the code reads."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from .conftest import RELEASE, SERVICES

FULLNAME = "agentflow"  # release "agentflow": the chart name is not repeated
RELEASE_SELECTOR = {"app.kubernetes.io/name": "agentflow", "app.kubernetes.io/instance": RELEASE}


def deployment(render, name: str) -> dict:
    return render.get("Deployment", f"{FULLNAME}-{name}")


def pod(dep: dict) -> dict:
    return dep["spec"]["template"]["spec"]


def container(dep: dict) -> dict:
    (main,) = [c for c in pod(dep)["containers"]]
    return main


def env_of(render, dep: dict) -> dict[str, str]:
    """The container's environment: its ConfigMap(s) first, then env entries (value or a source marker)."""
    env: dict[str, str] = {}
    for source in container(dep).get("envFrom", []):
        if "configMapRef" in source:
            env.update(render.get("ConfigMap", source["configMapRef"]["name"])["data"])
    for item in container(dep).get("env", []):
        env[item["name"]] = item.get("value", "<from %s>" % next(iter(item.get("valueFrom", {"?": 0}))))
    return env


# ------------------------------------------------------------------------------------------------- services


@pytest.mark.parametrize("name", SERVICES)
def test_service_deployment_has_native_grpc_probes(render_profile, profile, name):
    dep = deployment(render_profile(profile), name)
    main = container(dep)
    grpc_port = next(p["containerPort"] for p in main["ports"] if p["name"] == "grpc")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert main[probe]["grpc"] == {"port": grpc_port}, f"{name} {probe}"
        assert main[probe]["periodSeconds"] >= 1 and main[probe]["failureThreshold"] >= 1
    # Liveness is lenient (health follows Kafka reachability); startup covers changelog replay and group join.
    live, ready, start = main["livenessProbe"], main["readinessProbe"], main["startupProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] > ready["periodSeconds"] * ready["failureThreshold"]
    assert start["periodSeconds"] * start["failureThreshold"] >= 120


@pytest.mark.parametrize("name", SERVICES)
def test_service_deployment_runs_the_serve_command(render_profile, profile, name):
    from agentflow.services.serving import add_parsers

    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    main = container(deployment(render_profile(profile), name))
    args = parser.parse_args(main["args"])  # every flag the chart passes exists
    assert (args.command, args.name) == ("serve", name)
    assert args.port == next(p["containerPort"] for p in main["ports"] if p["name"] == "grpc")
    assert args.metrics_port == next(p["containerPort"] for p in main["ports"] if p["name"] == "metrics")
    if name in ("planner", "executor", "verifier", "generator"):
        assert args.tools


@pytest.mark.parametrize("name", SERVICES)
def test_service_has_resources_and_a_matching_service(render_profile, profile, name):
    render = render_profile(profile)
    dep = deployment(render, name)
    resources = container(dep)["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"]), name
    assert "memory" in resources["limits"], name
    svc = render.get("Service", f"{FULLNAME}-{name}")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in svc["spec"]["selector"].items())
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    grpc = next(p for p in svc["spec"]["ports"] if p["name"] == "grpc")
    assert grpc["appProtocol"] == "grpc" and grpc["targetPort"] == "grpc"


def restricted(pod_spec: dict, main: dict) -> None:
    """The pod and its containers meet the 'restricted' Pod Security Standard, plus a read-only root."""
    psc = pod_spec["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] >= 1000
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"
    for c in pod_spec["containers"] + pod_spec.get("initContainers", []):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add"), c["name"]
        assert not sc.get("privileged"), c["name"]
    assert pod_spec.get("hostNetwork") is not True and pod_spec.get("hostPID") is not True


def test_security_contexts(render_profile, profile):
    render = render_profile(profile)
    names = [d["metadata"]["name"].removeprefix(f"{FULLNAME}-") for d in render.of_kind("Deployment")]
    expected = {"default": SERVICES + ("llm",), "dev-cpu": SERVICES + ("llm",),
                "gpu": SERVICES + ("judge", "trainer", "rollout", "driver", "planner-fleet")}
    assert sorted(names) == sorted(expected[profile])
    for name in names:
        check_security_context(render, profile, name)


def check_security_context(render, profile: str, name: str) -> None:
    dep = deployment(render, name)
    spec, main = pod(dep), container(dep)
    restricted(spec, main)
    mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]], f"{name} needs a writable /tmp on a read-only root"
    assert "sizeLimit" in volumes[mounts["/tmp"]]["emptyDir"]
    if name == "executor" and profile == "gpu":
        # Namespaces for the python sandbox: a Localhost seccomp profile, the pod in its own user namespace.
        assert main["securityContext"]["seccompProfile"]["type"] == "Localhost"
        assert main["securityContext"]["seccompProfile"]["localhostProfile"]
        assert spec["hostUsers"] is False
    else:
        assert "hostUsers" not in spec
        assert main["securityContext"].get("seccompProfile", {"type": "RuntimeDefault"})["type"] == "RuntimeDefault"
    assert spec["automountServiceAccountToken"] is (name == "rollout")


def test_executor_sandbox_gets_a_larger_tmp(render_profile):
    dep = deployment(render_profile("default"), "executor")
    tmp = next(v for v in pod(dep)["volumes"] if v["name"] == "tmp")
    assert tmp["emptyDir"]["sizeLimit"] == "512Mi"


def test_memory_is_a_single_recreated_replica(render_profile, profile):
    dep = deployment(render_profile(profile), "memory")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}


def test_termination_grace_covers_the_drain(render_profile, profile):
    for name in SERVICES:
        dep = deployment(render_profile(profile), name)
        grace = float(env_of(render_profile(profile), dep)["AGENTFLOW_RPC_GRACE_S"])
        assert pod(dep)["terminationGracePeriodSeconds"] >= 2 * grace + 5


# ------------------------------------------------------------------------------------------------- settings


def test_environment_names_are_settings_the_code_reads(render_profile, profile):
    """Every AGENTFLOW_* variable the chart sets for the services maps onto a field of the settings dataclass the
    service reads (agentflow/bus/config.py, rpc/server.py, config.py, flow/loop.py, services/gateway), the log
    format (telemetry/logs.py), or a search tool's endpoint, provider or key (agentflow/tools)."""
    from agentflow.bus.config import BusConfig
    from agentflow.config import EngineSettings
    from agentflow.flow.loop import LoopConfig
    from agentflow.rpc.server import RpcConfig
    from agentflow.services.gateway import GatewayConfig

    from agentflow.telemetry.logs import LOG_FORMAT_ENV
    from agentflow.tools import search, web_search, wikipedia

    known = {LOG_FORMAT_ENV, wikipedia.ENV_ENDPOINT, web_search.ENV_PROVIDER, web_search.ENV_ENDPOINT,
             web_search.ENV_API_KEY, search.RETRIEVER_ENV, search.RETRIEVER_TOKEN_ENV}  # the search tools'
    for prefix, cls in (("KAFKA_", BusConfig), ("RPC_", RpcConfig), ("", EngineSettings), ("PLANNER_", EngineSettings),
                        ("LOOP_", LoopConfig), ("GATEWAY_", GatewayConfig)):
        known |= {f"AGENTFLOW_{prefix}{f.name}".upper() for f in fields(cls)}
    render = render_profile(profile)
    for name in SERVICES:
        env = env_of(render, deployment(render, name))
        unknown = {k for k in env if k.startswith("AGENTFLOW_")} - known
        assert not unknown, f"{name}: {unknown} are read by nothing"


def test_settings_parse_with_the_code(render_profile, profile, monkeypatch):
    """The ConfigMap's values pass the services' own start-up validation."""
    from agentflow.bus.config import BusConfig
    from agentflow.config import EngineSettings, from_env
    from agentflow.flow.loop import LoopConfig
    from agentflow.rpc.server import RpcConfig

    render = render_profile(profile)
    env = env_of(render, deployment(render, "planner"))
    assert env.pop("AGENTFLOW_RPC_SERVICE_TOKEN") == "<from secretKeyRef>"
    env = {k: v for k, v in env.items() if not v.startswith("<from")} | {"AGENTFLOW_RPC_SERVICE_TOKEN": "t"}
    for mounted in ("CAFILE", "CERTFILE", "KEYFILE"):  # mounted files: checked for existence at start-up
        env.pop(f"AGENTFLOW_KAFKA_TLS_{mounted}", None)
    if env.get("AGENTFLOW_KAFKA_SECURITY_PROTOCOL") in ("SSL", "SASL_SSL"):
        env["AGENTFLOW_KAFKA_SECURITY_PROTOCOL"] = "SSL"
    bus = BusConfig.from_env(environ=env)
    engine = from_env(EngineSettings, environ=env)
    planner = from_env(EngineSettings, "PLANNER_", engine, environ=env)
    loop = from_env(LoopConfig, "LOOP_", environ=env)
    rpc = from_env(RpcConfig, "RPC_", environ=env)
    assert engine.engine == planner.engine == "openai" and engine.endpoint and planner.endpoint
    assert rpc.host == "0.0.0.0" and loop.max_steps >= 1 and bus.servers()


def test_llm_endpoints(render_profile):
    default = render_profile("default").get("ConfigMap", f"{FULLNAME}-env")["data"]
    assert default["AGENTFLOW_PLANNER_ENDPOINT"] == default["AGENTFLOW_ENDPOINT"]
    assert default["AGENTFLOW_ENDPOINT"].startswith(f"http://{FULLNAME}-llm.") and default["AGENTFLOW_ENDPOINT"].endswith(":8000/v1")
    gpu = render_profile("gpu").get("ConfigMap", f"{FULLNAME}-env")["data"]
    assert gpu["AGENTFLOW_PLANNER_ENDPOINT"].startswith(f"http://{FULLNAME}-planner-llm-predictor.")
    assert gpu["AGENTFLOW_ENDPOINT"].startswith(f"http://{FULLNAME}-frozen-llm-predictor.")
    assert gpu["AGENTFLOW_PLANNER_MODEL"] == "planner" and gpu["AGENTFLOW_MODEL"] == "frozen"
    assert gpu["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith("http") and gpu["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
    assert gpu["AGENTFLOW_KAFKA_CREATE_TOPICS"] == "false"  # Strimzi owns the topics
    assert default["AGENTFLOW_KAFKA_CREATE_TOPICS"] == "true"
    assert default["OTEL_TRACES_EXPORTER"] == "none"


def test_llm_server_runs_serve_llm(render_profile, tmp_path):
    from agentflow.services.serving import add_parsers

    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    for profile, model in (("default", "smollm2"), ("dev-cpu", "/models/tiny")):
        dep = deployment(render_profile(profile), "llm")
        argv = container(dep)["args"]
        assert f"--model={model}" in argv
        # --model must name an existing folder when parsed: the pod's volume is a local folder here
        args = parser.parse_args([f"--model={tmp_path}" if a == "--model=/models/tiny" else a for a in argv])
        assert args.command == "serve-llm" and args.host == "0.0.0.0"
        assert container(dep)["readinessProbe"]["httpGet"]["path"] == "/health"
        assert "nvidia.com/gpu" not in str(dep)
    init = pod(deployment(render_profile("dev-cpu"), "llm"))["initContainers"][0]
    assert init["args"][:2] == ["model", "tiny"]
    assert not render_profile("gpu").has("Deployment", f"{FULLNAME}-llm")


# ------------------------------------------------------------------------------------------------- KServe


def test_inference_services(render_profile):
    render = render_profile("gpu")
    runtime = render.of_kind("ServingRuntime")[0]
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    for which in ("planner", "frozen"):
        isvc = render.get("InferenceService", f"{FULLNAME}-{which}-llm")
        assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Knative"
        predictor = isvc["spec"]["predictor"]
        model = predictor["model"]
        assert model["runtime"] == runtime["metadata"]["name"] and model["modelFormat"]["name"] in formats
        assert model["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert predictor["nodeSelector"]["nvidia.com/gpu.present"] == "true"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in predictor["tolerations"]
        assert f"--served-model-name={which}" in model["args"]
        assert model["storageUri"].startswith("s3://")
        assert "canaryTrafficPercent" not in predictor  # the rollout controller owns it
    assert "vllm.entrypoints.openai.api_server" in runtime["spec"]["containers"][0]["command"]


@pytest.mark.parametrize("name", SERVICES)
def test_services_authenticate_callers_by_default(render_profile, profile, name):
    """Every service reads the shared gRPC token from the Secret NOTES.txt names; none may skip the check."""
    (item,) = [e for e in container(deployment(render_profile(profile), name))["env"]
               if e["name"] == "AGENTFLOW_RPC_SERVICE_TOKEN"]
    assert item["valueFrom"]["secretKeyRef"] == {"name": f"{FULLNAME}-rpc-token", "key": "token"}
    env = env_of(render_profile(profile), deployment(render_profile(profile), name))
    assert "AGENTFLOW_RPC_ALLOW_UNAUTHENTICATED" not in env


def test_unauthenticated_services_only_when_asked(helm, tmp_path):
    from .conftest import parse, template

    values = tmp_path / "v.yaml"
    values.write_text("rpc:\n  allowUnauthenticated: true\n")
    docs = parse(template(helm, [values]).stdout)
    for dep in (d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == f"{FULLNAME}-planner"):
        names = {e["name"]: e.get("value") for e in container(dep)["env"]}
        assert names.get("AGENTFLOW_RPC_ALLOW_UNAUTHENTICATED") == "true" and "AGENTFLOW_RPC_SERVICE_TOKEN" not in names


def test_canary_percent_is_rendered(helm, tmp_path):
    from .conftest import CHART, parse, template

    values = tmp_path / "v.yaml"
    values.write_text("kserve:\n  planner:\n    canaryTrafficPercent: 10\n")
    docs = parse(template(helm, [CHART / "values-gpu.yaml", values]).stdout)
    isvc = next(d for d in docs if d["kind"] == "InferenceService" and d["metadata"]["name"].endswith("planner-llm"))
    assert isvc["spec"]["predictor"]["canaryTrafficPercent"] == 10


# ------------------------------------------------------------------------------------------------- Kafka


def test_topics_are_the_rings_topics(render_profile):
    from agentflow.bus import topics

    render = render_profile("gpu")
    kafka_topics = {t["spec"]["topicName"]: t for t in render.of_kind("KafkaTopic")}
    assert set(kafka_topics) == set(topics.ALL)
    for name, topic in kafka_topics.items():
        assert topic["metadata"]["labels"]["strimzi.io/cluster"] == "agentflow"
        assert topic["metadata"]["namespace"] == "kafka"
        for key, value in topics.topic_configs(name).items():
            assert topic["spec"]["config"][key] == value
        assert topic["spec"]["replicas"] == 3
    assert kafka_topics["deadletter"]["spec"]["partitions"] == 3
    assert kafka_topics["plans"]["spec"]["partitions"] == 12
    assert not render_profile("default").of_kind("KafkaTopic")


def test_scaled_objects_follow_consumer_lag(render_profile):
    import importlib

    render = render_profile("gpu")
    partitions = {t["spec"]["topicName"]: t["spec"]["partitions"] for t in render.of_kind("KafkaTopic")}
    scaled = {s["spec"]["scaleTargetRef"]["name"]: s for s in render.of_kind("ScaledObject")}
    assert set(scaled) == {f"{FULLNAME}-{n}" for n in ("planner", "executor", "verifier", "generator", "judge")}
    bootstrap = render.get("ConfigMap", f"{FULLNAME}-env")["data"]["AGENTFLOW_KAFKA_BOOTSTRAP_SERVERS"]
    for target, so in scaled.items():
        name = target.removeprefix(f"{FULLNAME}-")
        assert render.has("Deployment", target)
        assert not render.has("HorizontalPodAutoscaler", target)  # KEDA owns the HPA
        assert "replicas" not in render.get("Deployment", target)["spec"]
        service = importlib.import_module(f"agentflow.services.{name}")
        inputs = next(getattr(service, a).input_topics for a in dir(service)
                      if a.endswith("Service") and hasattr(getattr(service, a), "input_topics"))
        triggers = so["spec"]["triggers"]
        assert {t["metadata"]["topic"] for t in triggers} == set(inputs)
        for t in triggers:
            assert t["metadata"]["consumerGroup"] == name  # the worker's group: topic_prefix + name
            assert t["metadata"]["bootstrapServers"] == bootstrap
            assert so["spec"]["maxReplicaCount"] <= partitions[t["metadata"]["topic"]]
            assert t["authenticationRef"]["name"] == f"{FULLNAME}-kafka"
    assert render.has("HorizontalPodAutoscaler", f"{FULLNAME}-gateway")


# ------------------------------------------------------------------------------------------------- trainer, rollout


def test_trainer(render_profile):
    render = render_profile("gpu")
    dep = deployment(render, "trainer")
    main = container(dep)
    assert main["args"] == ["train"] and main["image"] == "agentflow:0.1.0-cuda"
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    env = env_of(render, dep)
    assert env["AGENTFLOW_TRAINER_MODEL_STORE"].startswith("s3://")
    assert env["AGENTFLOW_TRAINER_GRPO_GROUP_SIZE"] == "8"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod(dep)["tolerations"]
    assert not render_profile("default").has("Deployment", f"{FULLNAME}-trainer")
    assert not render_profile("default").has("Deployment", f"{FULLNAME}-rollout")


def test_trainer_checkpoint_volume(helm, tmp_path):
    from .conftest import parse, template

    values = tmp_path / "v.yaml"
    values.write_text("trainer:\n  enabled: true\ndriver:\n  enabled: false\n")  # its driver: test_chart_driver.py
    docs = parse(template(helm, [values]).stdout)
    pvc = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-trainer"))
    claim = next(v for v in pod(dep)["volumes"] if v["name"] == "checkpoints")
    assert claim["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    store = next(e for e in container(dep)["env"] if e["name"] == "AGENTFLOW_TRAINER_MODEL_STORE")
    assert store["value"] == "/checkpoints"


def test_rollout_rbac_is_limited_to_its_inference_service(render_profile):
    render = render_profile("gpu")
    assert not render.of_kind("ClusterRole") and not render.of_kind("ClusterRoleBinding")
    (role,) = render.of_kind("Role")
    (rule,) = role["rules"]
    isvc = render.get("InferenceService", f"{FULLNAME}-planner-llm")
    assert rule["apiGroups"] == ["serving.kserve.io"]
    assert rule["resources"] == ["inferenceservices"]
    assert rule["resourceNames"] == [isvc["metadata"]["name"]]
    assert set(rule["verbs"]) == {"get", "watch", "patch"}
    (binding,) = render.of_kind("RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{FULLNAME}-rollout", "namespace": "agentflow"}]
    dep = deployment(render, "rollout")
    assert pod(dep)["serviceAccountName"] == f"{FULLNAME}-rollout"
    assert container(dep)["args"] == ["rollout"]
    env = env_of(render, dep)
    assert env["AGENTFLOW_ROLLOUT_INFERENCE_SERVICE"] == isvc["metadata"]["name"]
    for name in SERVICES + ("trainer",):
        assert pod(deployment(render, name))["serviceAccountName"] != f"{FULLNAME}-rollout"


# ------------------------------------------------------------------------------------------------- network


def selects(policy: dict, labels: dict) -> bool:
    selector = policy["spec"]["podSelector"]
    if not all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        if expr["operator"] == "In" and labels.get(expr["key"]) not in expr["values"]:
            return False
        if expr["operator"] == "NotIn" and labels.get(expr["key"]) in expr["values"]:
            return False
        if expr["operator"] == "Exists" and expr["key"] not in labels:
            return False
    return True


def pod_labels(render) -> dict[str, dict]:
    return {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"] for d in render.of_kind("Deployment")}


def test_default_deny_covers_every_pod(render_profile, profile):
    render = render_profile(profile)
    deny = render.get("NetworkPolicy", f"{FULLNAME}-default-deny")
    assert not deny["spec"].get("ingress") and "Ingress" in deny["spec"]["policyTypes"]
    for name, labels in pod_labels(render).items():
        assert selects(deny, labels), name
    assert ("Egress" in deny["spec"]["policyTypes"]) is (profile == "gpu")


def test_ingress_rules(render_profile, profile):
    render = render_profile(profile)
    policies = render.of_kind("NetworkPolicy")
    labels = pod_labels(render)
    for name in SERVICES:
        policy = render.get("NetworkPolicy", f"{FULLNAME}-{name}-ingress")
        assert selects(policy, labels[f"{FULLNAME}-{name}"])
        grpc_rule = policy["spec"]["ingress"][0]
        assert grpc_rule["ports"] == [{"port": 50051, "protocol": "TCP"}]
        if name == "gateway":
            assert grpc_rule["from"] == [{"podSelector": {}}]  # clients in the namespace (networkPolicy.gatewayFrom)
        else:
            assert grpc_rule["from"] == [{"podSelector": {"matchLabels": RELEASE_SELECTOR}}]  # release pods only
        metrics_rule = policy["spec"]["ingress"][1]
        assert metrics_rule["ports"] == [{"port": 9090, "protocol": "TCP"}]
    # The trainer, the rollout controller and the rollout driver accept connections to their metrics port only.
    for name in ("trainer", "rollout", "driver"):
        if f"{FULLNAME}-{name}" in labels:
            allowing = [p for p in policies if p["spec"].get("ingress") and selects(p, labels[f"{FULLNAME}-{name}"])]
            assert [p["metadata"]["name"] for p in allowing] == [f"{FULLNAME}-metrics-ingress"], name
            assert [r["ports"] for r in allowing[0]["spec"]["ingress"]] == [[{"port": 9090, "protocol": "TCP"}]]


def test_gpu_network_policies(render_profile):
    render = render_profile("gpu")
    isvc_policy = render.get("NetworkPolicy", f"{FULLNAME}-llm-isvc-ingress")
    expr = isvc_policy["spec"]["podSelector"]["matchExpressions"][0]
    assert expr["key"] == "serving.kserve.io/inferenceservice"
    assert set(expr["values"]) == {f"{FULLNAME}-planner-llm", f"{FULLNAME}-frozen-llm"}
    egress = render.get("NetworkPolicy", f"{FULLNAME}-egress")["spec"]["egress"]
    assert {"port": 53, "protocol": "UDP"} in egress[0]["ports"]
    kafka = next(r for r in egress if r.get("ports") == [{"port": 9093, "protocol": "TCP"}])
    assert kafka["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kafka"}}}]
    apiserver = render.get("NetworkPolicy", f"{FULLNAME}-rollout-apiserver-egress")
    assert selects(apiserver, pod_labels(render)[f"{FULLNAME}-rollout"])
    assert not selects(apiserver, pod_labels(render)[f"{FULLNAME}-planner"])


# ------------------------------------------------------------------------------------------------- labels


def test_every_object_is_labelled_consistently(render_profile, profile):
    for doc in render_profile(profile).docs:
        labels = doc["metadata"]["labels"]
        what = f"{doc['kind']} {doc['metadata']['name']}"
        assert labels["app.kubernetes.io/name"] == "agentflow", what
        assert labels["app.kubernetes.io/instance"] == RELEASE, what
        assert labels["app.kubernetes.io/part-of"] == "agentflow", what
        assert labels["app.kubernetes.io/managed-by"] == "Helm", what
        assert labels["app.kubernetes.io/version"] == "0.1.0", what
        assert labels["app.kubernetes.io/component"], what
        assert labels["helm.sh/chart"] == "agentflow-0.1.0", what
        if doc["kind"] == "Deployment":
            template_labels = doc["spec"]["template"]["metadata"]["labels"]
            assert template_labels["app.kubernetes.io/component"] == labels["app.kubernetes.io/component"]


def test_pdbs_select_their_deployment(render_profile, profile):
    render = render_profile(profile)
    labels = pod_labels(render)
    pdbs = render.of_kind("PodDisruptionBudget")
    assert len(pdbs) == {"dev-cpu": 0, "gpu": len(SERVICES) + 1}.get(profile, len(SERVICES))  # gpu: the judge
    for pdb in pdbs:
        target = labels[pdb["metadata"]["name"]]
        assert all(target[k] == v for k, v in pdb["spec"]["selector"]["matchLabels"].items())
        assert pdb["spec"]["maxUnavailable"] == 1


def test_local_rollout_backend_gets_no_api_access(helm, tmp_path):
    from .conftest import parse, template

    values = tmp_path / "v.yaml"
    values.write_text("rollout:\n  enabled: true\n  backend: local\nllmServer:\n  adminTokenSecret: llm-admin\n")
    docs = parse(template(helm, [values]).stdout)
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")]
    dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == f"{FULLNAME}-rollout")
    assert pod(dep)["automountServiceAccountToken"] is False
    env = {e["name"]: e.get("value") for e in container(dep)["env"]}
    assert env["AGENTFLOW_ROLLOUT_BACKEND"] == "local" and env["AGENTFLOW_ROLLOUT_LLM_URL"].startswith("http://")


def test_cpu_autoscaling_without_keda(helm, tmp_path):
    from .conftest import parse, template

    values = tmp_path / "v.yaml"
    values.write_text("serviceDefaults:\n  autoscaling: {enabled: true, minReplicas: 2, maxReplicas: 4}\n"
                      "memory:\n  autoscaling: {enabled: false}\n")
    docs = parse(template(helm, [values]).stdout)
    hpas = {d["spec"]["scaleTargetRef"]["name"]: d for d in docs if d["kind"] == "HorizontalPodAutoscaler"}
    assert set(hpas) == {f"{FULLNAME}-{n}" for n in SERVICES if n != "memory"}
    assert not [d for d in docs if d["kind"] == "ScaledObject"]
    for name, hpa in hpas.items():
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 4)
        assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
        dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == name)
        assert "replicas" not in dep["spec"]  # the HPA owns the count; upgrades do not reset it


def test_the_dev_llm_servers_tokens(helm, tmp_path):
    """The admin API of the development LLM server is off without a token, so the local rollout backend needs one;
    the token reaches the server and the controller only through a Secret."""
    from .conftest import parse, template

    local = ["rollout.enabled=true", "rollout.backend=local"]
    refused = template(helm, set_values=local, check=False)
    assert refused.returncode != 0 and "llmServer.adminTokenSecret" in refused.stderr
    docs = parse(template(helm, set_values=[*local, "llmServer.adminTokenSecret=llm-admin",
                                            "llm.apiKeySecret=llm-api"]).stdout)
    by_name = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    server_env = {e["name"]: e for e in container(by_name[f"{FULLNAME}-llm"])["env"]}
    assert server_env["AGENTFLOW_LLM_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "llm-admin"
    assert server_env["AGENTFLOW_LLM_API_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "llm-api"
    rollout_env = {e["name"]: e for e in container(by_name[f"{FULLNAME}-rollout"])["env"]}
    assert rollout_env["AGENTFLOW_ROLLOUT_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "llm-admin"


def test_the_gateway_is_anonymous_only_without_api_keys(render_profile, profile):
    env = env_of(render_profile(profile), deployment(render_profile(profile), "gateway"))
    if profile == "gpu":  # values-gpu.yaml names an API key Secret
        assert env["AGENTFLOW_GATEWAY_API_KEYS"] == "<from secretKeyRef>"
        assert "AGENTFLOW_GATEWAY_ALLOW_ANONYMOUS" not in env
    else:
        assert env["AGENTFLOW_GATEWAY_ALLOW_ANONYMOUS"] == "true" and "AGENTFLOW_GATEWAY_API_KEYS" not in env
