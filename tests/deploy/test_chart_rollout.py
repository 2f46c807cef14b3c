"""The rollout controller's backends as the chart renders them (rollout.backend, rollout.kserve.mode): the planner
InferenceService(s) and the RBAC of each KServe mode, the vLLM planner of the lora backend, the controller's
settings, and the routing table the planner follows (planner.routing, the URL patterns it may be sent to).

What a cluster would add and is out of reach here: that KServe reports the URLs the patterns expect (checked
against KServe's source in tests/unit/test_rollout_kserve*.py, with status written by the tests), that the API
server enforces the Role, that vLLM loads an adapter from the mounted store.
"""

from __future__ import annotations

import base64

import dataclasses
import shlex

import jsonschema
import pytest
import yaml

from .conftest import CHART, CRD_KINDS, NAMESPACE, Render, parse, run, template, template_command
from .crd_schemas import SCHEMAS
from .test_chart_objects import FULLNAME, container, deployment, env_of, pod, pod_labels, selects
from .test_chart_validate import K8S_VERSION, check_validation_output

GPU = CHART / "values-gpu.yaml"
LORA = CHART / "values-gpu-lora-7b.yaml"
ISVC = f"{FULLNAME}-planner-llm"
CANARY = f"{ISVC}-canary"
VLLM = f"{FULLNAME}-planner-vllm"
LOCAL = f"{NAMESPACE}.svc.cluster.local"
PAIR = {"rollout": {"kserve": {"mode": "pair"}}}
# mode -> (values files, values on top)
MODES = {
    "canary": ([GPU], {}),
    "pair": ([GPU], PAIR),
    "pair-standard": ([GPU], {**PAIR, "kserve": {"deploymentMode": "Standard"}}),
    "lora": ([GPU, LORA], {}),
    # full weights on KServe with the model store on a claim: a rollout fleet that replaces its weights in place
    "canary-fleet": ([GPU], {"trainer": {"modelStore": {"uri": "", "pvc": {"accessModes": ["ReadWriteMany"]}}},
                             "rollout": {"fleet": {"adminTokenSecret": "fleet-admin"}}}),
}
# mode -> OpenAI base URLs the backend names in the routing table (agentflow/rollout/kserve/): the Knative tag
# URLs and the predictor's address (canary), the InferenceServices' status.address.url (pair; a headless predictor
# Service gets the port), the vLLM Service (lora)
SERVED_AT = {
    "canary": [f"http://latest-{ISVC}-predictor.{LOCAL}/v1", f"http://prev-{ISVC}-predictor.{LOCAL}/v1",
               f"http://{ISVC}-predictor.{LOCAL}/v1"],
    "pair": [f"http://{ISVC}.{LOCAL}/v1", f"http://{CANARY}.{LOCAL}/v1"],
    "pair-standard": [f"http://{ISVC}-predictor.{LOCAL}/v1", f"http://{CANARY}-predictor.{LOCAL}:8080/v1"],
    "lora": [f"http://{VLLM}.{LOCAL}:8000/v1"],
}
SERVED_AT["canary-fleet"] = SERVED_AT["canary"]


def write_values(tmp_path, values: dict, name: str = "v.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.fixture(scope="session")
def mode_command(helm, tmp_path_factory):
    folder = tmp_path_factory.mktemp("rollout-modes")

    def command(mode: str) -> list[str]:
        files, extra = MODES[mode]
        if extra:
            files = [*files, write_values(folder, extra, f"{mode}.yaml")]
        return template_command(helm, files)

    return command


@pytest.fixture(scope="session")
def render_mode(mode_command):
    cache: dict[str, Render] = {}

    def render(mode: str) -> Render:
        if mode not in cache:
            text = run(mode_command(mode)).stdout
            cache[mode] = Render(text, parse(text))
        return cache[mode]

    return render


def rollout_settings(render):
    """The controller's settings from its rendered environment, through the code's own parsing."""
    from agentflow.config import from_env
    from agentflow.rollout.settings import RolloutSettings

    env = {k: v for k, v in env_of(render, deployment(render, "rollout")).items() if k.startswith("AGENTFLOW_ROLLOUT_")}
    known = {f"AGENTFLOW_ROLLOUT_{f.name.upper()}" for f in dataclasses.fields(RolloutSettings)}
    assert not set(env) - known, f"{set(env) - known} are read by nothing"
    if env.get("AGENTFLOW_ROLLOUT_NAMESPACE") == "<from fieldRef>":
        env["AGENTFLOW_ROLLOUT_NAMESPACE"] = NAMESPACE
    env = {k: v for k, v in env.items() if not v.startswith("<from")}
    return from_env(RolloutSettings, "ROLLOUT_", environ=env)


def planner_engine(render):
    from agentflow.config import EngineSettings, from_env

    env = env_of(render, deployment(render, "planner"))
    return from_env(EngineSettings, "PLANNER_", from_env(EngineSettings, environ=env), environ=env)


def allowed(engine, url: str) -> bool:
    from agentflow.errors import InvalidInput
    from agentflow.llm.routing import Route, RoutingTable, check_table

    table = RoutingTable(deployment="planner", routes=(Route("v000001", url, "planner", 100),))
    try:
        check_table(table, engine.routing_endpoints)
        return True
    except InvalidInput:
        return False


# ------------------------------------------------------------------------------------------------- every mode


@pytest.mark.parametrize("mode", list(MODES))
def test_the_controller_reads_its_settings(render_mode, mode):
    settings = rollout_settings(render_mode(mode))
    assert settings.deployment == "planner"
    if mode == "lora":
        assert settings.backend == "lora" and settings.llm_url == f"http://{VLLM}.{LOCAL}:8000"
    else:
        assert settings.backend == "kserve" and settings.kserve_mode == mode.split("-")[0]
        assert settings.inference_service == ISVC and settings.namespace == NAMESPACE
        assert settings.kserve_openai_path == "/v1"  # kserve.runtime.openaiPath: vLLM's own server
        assert settings.served_model_name == "planner"


@pytest.mark.parametrize("mode", list(MODES))
def test_the_planner_follows_the_routing_table(render_mode, mode):
    """The planner's client follows the controller's deployment, and may be sent exactly where the backend says
    versions are served."""
    render = render_mode(mode)
    engine = planner_engine(render)
    assert engine.routing == rollout_settings(render).deployment == "planner"
    for url in SERVED_AT[mode]:
        assert allowed(engine, url), url
    assert allowed(engine, engine.endpoint)  # the configured endpoint too (calls before the first table)
    for url in ("http://attacker.example.com/v1", f"http://{ISVC}.{LOCAL}.attacker.example.com/v1",
                f"https://{FULLNAME}-frozen-llm-predictor.{LOCAL}/v1"):
        assert not allowed(engine, url), url
    for name in ("executor", "verifier", "generator", "gateway", "memory"):  # only the planner routes
        assert not any(k.startswith("AGENTFLOW_PLANNER_ROUTING") for k in env_of(render, deployment(render, name)))


def test_more_routing_endpoints_are_added(helm, tmp_path):
    values = write_values(tmp_path, {"rollout": {"routingEndpoints": [f"http://*-planner-llm-predictor.{NAMESPACE}"
                                                                      f".example.com/*"]}})
    render = Render("", parse(template(helm, [GPU, values]).stdout))
    engine = planner_engine(render)
    assert allowed(engine, f"http://latest-{ISVC}-predictor.{NAMESPACE}.example.com/v1")
    assert allowed(engine, f"http://prev-{ISVC}-predictor.{LOCAL}/v1")


def test_without_the_controller_nothing_routes(render_profile):
    for profile in ("default", "dev-cpu"):
        render = render_profile(profile)
        assert not any(k.startswith("AGENTFLOW_PLANNER_ROUTING") for k in env_of(render, deployment(render, "planner")))


@pytest.mark.parametrize("mode", ["pair", "pair-standard", "lora"])
def test_mode_passes_kubernetes_validate_strict(kubernetes_validate, mode_command, render_mode, mode):
    pipeline = (f"set -o pipefail; {shlex.join(mode_command(mode))} | "
                f"{shlex.join(kubernetes_validate)} --strict -k {K8S_VERSION} -")
    result = run(["bash", "-c", pipeline], check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    check_validation_output(result.stdout, render_mode(mode).docs)


@pytest.mark.parametrize("mode", list(MODES))
def test_custom_resources_of_each_mode_match_their_schemas(render_mode, mode):
    for doc in render_mode(mode).docs:
        if doc["kind"] in CRD_KINDS:
            jsonschema.validate(doc, SCHEMAS[doc["kind"]])


def test_planner_routing_is_a_compacted_topic_only_the_controller_writes(render_profile):
    render = render_profile("gpu")
    (topic,) = [t for t in render.of_kind("KafkaTopic") if t["spec"]["topicName"] == "planner.routing"]
    assert topic["spec"]["config"]["cleanup.policy"] == "compact"
    users = {u["metadata"]["name"].removeprefix(f"{FULLNAME}-"): u for u in render.of_kind("KafkaUser")}
    access = {name: {op for acl in user["spec"]["authorization"]["acls"]
                     if acl["resource"]["name"] == "planner.routing" for op in acl["operations"]}
              for name, user in users.items()}
    assert {name for name, ops in access.items() if ops} == {"planner", "rollout"}
    assert access["planner"] == {"Read", "Describe"} and access["rollout"] == {"Write", "Describe"}


# ------------------------------------------------------------------------------------------------- kserve canary


def test_canary_mode_tags_the_planners_revisions(render_mode):
    render = render_mode("canary")
    planner = render.get("InferenceService", ISVC)
    assert planner["metadata"]["annotations"]["serving.kserve.io/enable-tag-routing"] == "true"
    frozen = render.get("InferenceService", f"{FULLNAME}-frozen-llm")
    assert "serving.kserve.io/enable-tag-routing" not in frozen["metadata"]["annotations"]
    (role,) = render.of_kind("Role")
    assert role["rules"] == [{"apiGroups": ["serving.kserve.io"], "resources": ["inferenceservices"],
                              "resourceNames": [ISVC], "verbs": ["get", "watch", "patch"]}]
    assert not render.has("InferenceService", CANARY)


# ------------------------------------------------------------------------------------------------- kserve pair


@pytest.mark.parametrize("mode", ["pair", "pair-standard"])
def test_pair_mode_may_create_and_delete_its_canary(render_mode, mode):
    render = render_mode(mode)
    (role,) = render.of_kind("Role")
    by_verbs = {tuple(rule["verbs"]): rule for rule in role["rules"]}
    assert by_verbs[("get", "watch", "patch")]["resourceNames"] == [ISVC]
    assert by_verbs[("get", "watch", "patch", "delete")]["resourceNames"] == [CANARY]  # never the stable's
    assert "resourceNames" not in by_verbs[("create",)]  # RBAC cannot restrict a create by name
    assert all(rule["apiGroups"] == ["serving.kserve.io"] and rule["resources"] == ["inferenceservices"]
               for rule in role["rules"])
    assert not any(verb in rule["verbs"] for rule in role["rules"] for verb in ("list", "update", "*"))
    planner = render.get("InferenceService", ISVC)
    assert "serving.kserve.io/enable-tag-routing" not in planner["metadata"]["annotations"]
    assert "canaryTrafficPercent" not in planner["spec"]["predictor"]
    policy = render.get("NetworkPolicy", f"{FULLNAME}-llm-isvc-ingress")
    assert CANARY in policy["spec"]["podSelector"]["matchExpressions"][0]["values"]


@pytest.mark.parametrize("mode", ["pair", "pair-standard"])
def test_the_canary_the_controller_creates_is_valid_and_selected_like_the_stable(render_mode, mode):
    """The object KServePairBackend creates from the rendered stable InferenceService passes the same CRD schema,
    keeps the deployment mode, and carries the release's labels (KServe puts them on its pods, which the
    NetworkPolicies select)."""
    from agentflow.rollout.backends import Version
    from agentflow.rollout.kserve.pair import KServePairBackend

    render = render_mode(mode)
    stable = render.get("InferenceService", ISVC)
    stable["metadata"]["uid"] = "0b5c3a3e-uid"
    backend = KServePairBackend(None, NAMESPACE, ISVC)
    canary = backend._canary_object(stable, Version("v000007", "s3://agentflow-models/planner/versions/v000007"))
    jsonschema.validate(canary, SCHEMAS["InferenceService"])
    assert canary["metadata"]["name"] == CANARY
    mode_annotation = "serving.kserve.io/deploymentMode"
    assert canary["metadata"]["annotations"][mode_annotation] == stable["metadata"]["annotations"][mode_annotation]
    labels = {**canary["metadata"]["labels"], "serving.kserve.io/inferenceservice": CANARY}
    assert selects(render.get("NetworkPolicy", f"{FULLNAME}-default-deny"), labels)
    assert selects(render.get("NetworkPolicy", f"{FULLNAME}-llm-isvc-ingress"), labels)
    assert canary["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "agentflow-rollout"  # not Helm's


def test_pair_mode_needs_a_short_enough_name(helm, tmp_path):
    values = write_values(tmp_path, {**PAIR, "fullnameOverride": "a-very-long-release-name-xxxxx"})
    result = template(helm, [GPU, values], check=False)
    assert result.returncode != 0 and "longer than 45" in result.stderr, result.stderr


# ------------------------------------------------------------------------------------------------- lora


def test_lora_mode_serves_the_planner_from_vllm_with_runtime_adapters(render_mode):
    render = render_mode("lora")
    dep = deployment(render, "planner-vllm")
    main = container(dep)
    args = main["args"]
    assert main["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--enable-lora" in args and "--max-lora-rank=64" in args and "--served-model-name=v000000" in args
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # the model store is mounted where the trainer writes it, from the same claim: a version's URI is a folder here
    trainer = deployment(render, "trainer")
    store = env_of(render, trainer)["AGENTFLOW_TRAINER_MODEL_STORE"]
    mount = next(m for m in main["volumeMounts"] if m["name"] == "checkpoints")
    assert mount["mountPath"] == store == "/checkpoints" and mount["readOnly"] is True
    claim = next(v for v in pod(dep)["volumes"] if v["name"] == "checkpoints")["persistentVolumeClaim"]
    trainer_claim = next(v for v in pod(trainer)["volumes"] if v["name"] == "checkpoints")["persistentVolumeClaim"]
    assert claim["claimName"] == trainer_claim["claimName"]
    assert "ReadWriteMany" in render.get("PersistentVolumeClaim", claim["claimName"])["spec"]["accessModes"]
    assert f"--model={store}/v000000" in args
    assert env_of(render, trainer)["AGENTFLOW_TRAINER_EXPORT"] == "adapter"
    service = render.get("Service", VLLM)
    assert service["spec"]["ports"][0]["port"] == 8000
    # the planner calls it; no planner InferenceService; the controller has no Kubernetes API access
    config = render.get("ConfigMap", f"{FULLNAME}-env")["data"]
    assert config["AGENTFLOW_PLANNER_ENDPOINT"] == f"http://{VLLM}.{LOCAL}:8000/v1"
    assert config["AGENTFLOW_PLANNER_MODEL"] == "v000000"  # the base, by its version name (agentflow/rollout/lora.py)
    assert not render.has("InferenceService", ISVC) and render.has("InferenceService", f"{FULLNAME}-frozen-llm")
    assert not render.of_kind("Role") and not render.of_kind("RoleBinding")
    assert pod(deployment(render, "rollout"))["automountServiceAccountToken"] is False
    assert pod(dep)["automountServiceAccountToken"] is False
    policy = render.get("NetworkPolicy", f"{VLLM}-ingress")
    labels = pod_labels(render)
    assert selects(policy, labels[VLLM]) and selects(render.get("NetworkPolicy", f"{FULLNAME}-default-deny"),
                                                     labels[VLLM])
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod(dep)["securityContext"]["runAsNonRoot"] is True


def test_lora_mode_has_a_rollout_fleet_that_users_never_reach(render_mode, helm, tmp_path):
    """A second vLLM like the planner's, holding the newest versions (agentflow/rollout/fleet.py): the controller
    loads them there, the routing table may name it, and nothing sends users' traffic to it."""
    render = render_mode("lora")
    fleet, production = deployment(render, "planner-fleet"), deployment(render, "planner-vllm")
    settings = rollout_settings(render)
    assert settings.fleet_url == f"http://{FULLNAME}-planner-fleet.{LOCAL}:8000" and settings.fleet_type == "lora"
    assert f"--max-loras={settings.fleet_slots}" in container(fleet)["args"] and settings.fleet_slots >= 5
    same = [a for a in container(production)["args"] if not a.startswith("--max-loras")]
    assert same == [a for a in container(fleet)["args"] if not a.startswith("--max-loras")]
    assert render.get("Service", f"{FULLNAME}-planner-fleet")["spec"]["ports"][0]["port"] == 8000
    assert selects(render.get("NetworkPolicy", f"{FULLNAME}-planner-fleet-ingress"),
                   pod_labels(render)[f"{FULLNAME}-planner-fleet"])
    assert allowed(planner_engine(render), settings.fleet_url + "/v1")  # pinned calls may be routed there
    config = render.get("ConfigMap", f"{FULLNAME}-env")["data"]
    assert "planner-fleet" not in config["AGENTFLOW_PLANNER_ENDPOINT"]  # users' traffic: production's server
    off = parse(template(helm, [GPU, LORA, write_values(tmp_path, {"rollout": {"fleet": {"enabled": False}}})]).stdout)
    assert not Render("", off).has("Deployment", f"{FULLNAME}-planner-fleet")
    assert not rollout_settings(Render("", off)).fleet_url


def test_full_weights_on_a_claim_have_a_rollout_fleet_that_replaces_its_weights_in_place(render_mode, helm,
                                                                                         tmp_path):
    """Backend kserve with the model store on a claim: the fleet is one vLLM that loads each full-weight version in
    place (agentflow/rollout/vllm_fleet.py) through the plugin copied from the AgentFlow image, its admin routes
    behind the token of rollout.fleet.adminTokenSecret."""
    render = render_mode("canary-fleet")
    fleet = deployment(render, "planner-fleet")
    settings = rollout_settings(render)
    assert settings.fleet_url == f"http://{FULLNAME}-planner-fleet.{LOCAL}:8000" and settings.fleet_type == "vllm"
    assert settings.fleet_slots == 1
    main = container(fleet)
    assert {"--worker-extension-cls=agentflow_vllm.WeightsFromFolder", "--middleware=agentflow_vllm.AdminTokenMiddleware",
            "--served-model-name=planner-fleet", "--model=/checkpoints/v000000"} <= set(main["args"])
    assert not [a for a in main["args"] if "lora" in a]
    env = {e["name"]: e for e in main["env"]}
    token = {"secretKeyRef": {"name": "fleet-admin", "key": "token"}}
    assert env["AGENTFLOW_VLLM_ADMIN_TOKEN"]["valueFrom"] == token and env["VLLM_SERVER_DEV_MODE"]["value"] == "1"
    controller = {e["name"]: e for e in container(deployment(render, "rollout"))["env"]}
    assert controller["AGENTFLOW_ROLLOUT_FLEET_ADMIN_TOKEN"]["valueFrom"] == token
    (plugin,) = [c for c in pod(fleet)["initContainers"] if c["name"] == "agentflow-vllm-plugin"]
    assert plugin["image"] == container(deployment(render, "planner"))["image"]  # the AgentFlow image's plugin
    assert env["PYTHONPATH"]["value"] == plugin["args"][0]
    assert {"name": "plugin", "mountPath": plugin["args"][0], "readOnly": True} in main["volumeMounts"]
    assert allowed(planner_engine(render), settings.fleet_url + "/v1")
    assert not render.has("Deployment", VLLM)  # production stays on the InferenceService
    assert "AGENTFLOW_ROLLOUT_FLEET_MIRROR" not in controller  # it reads the claim's versions where they are
    # without a Secret of its own the chart makes one, with a random token, and both sides read it
    gpu = {"requests": {"cpu": "4", "memory": "24Gi", "nvidia.com/gpu": "1"},
           "limits": {"nvidia.com/gpu": "1", "memory": "24Gi"}}
    values = {"trainer": {"modelStore": {"uri": "", "pvc": {"accessModes": ["ReadWriteMany"]}}},
              "rollout": {"fleet": {"resources": gpu, "tolerations": [{"key": "gpu", "operator": "Exists"}],
                                    "adminTokenSecret": ""}}}
    made = Render("", parse(template(helm, [GPU, write_values(tmp_path, values)]).stdout))
    assert container(deployment(made, "planner-fleet"))["resources"] == gpu  # its own, over rollout.lora's
    assert pod(deployment(made, "planner-fleet"))["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert container(fleet)["resources"] == yaml.safe_load(GPU.read_text())["rollout"]["fleet"]["resources"]
    secret = made.get("Secret", f"{FULLNAME}-fleet-admin")
    assert len(base64.b64decode(secret["data"]["token"])) == 48
    for name in ("planner-fleet", "rollout"):
        assert {"name": f"{FULLNAME}-fleet-admin", "key": "token"} in [
            e["valueFrom"]["secretKeyRef"] for e in container(deployment(made, name))["env"]
            if "ADMIN_TOKEN" in e["name"]], name
    assert not render.has("Secret", f"{FULLNAME}-fleet-admin")  # the given Secret is used instead


def test_full_weights_in_an_object_store_reach_the_fleet_through_its_mirror(render_mode):
    """values-gpu.yaml as shipped (versions in s3://): the fleet's vLLM reads an emptyDir at the store's mount path,
    which the native sidecar `agentflow fleet-mirror` fills from the store with the trainer's credentials; vLLM
    starts once the base is there, counts it as loaded, and the controller loads each version from its copy."""
    render = render_mode("canary")
    fleet, values = deployment(render, "planner-fleet"), yaml.safe_load(GPU.read_text())
    store = values["trainer"]["modelStore"]
    settings = rollout_settings(render)
    assert settings.fleet_type == "vllm" and settings.fleet_mirror == "/checkpoints"
    (mirror,) = [c for c in pod(fleet)["initContainers"] if c["name"] == "fleet-mirror"]
    assert mirror["restartPolicy"] == "Always"  # a sidecar: it keeps running beside vLLM
    assert mirror["args"] == ["fleet-mirror", "--store", store["uri"], "--into", "/checkpoints", "--keep", "2"]
    assert mirror["envFrom"] == [{"secretRef": {"name": store["credentialsSecret"]}}]
    assert mirror["startupProbe"]["exec"]["command"][-1] == "/checkpoints/v000000/config.json"
    assert "wait-for-base-model" not in [c["name"] for c in pod(fleet)["initContainers"]]
    volume = {v["name"]: v for v in pod(fleet)["volumes"]}["checkpoints"]
    size = volume["emptyDir"]["sizeLimit"]
    assert mirror["resources"]["requests"]["ephemeral-storage"] == mirror["resources"]["limits"][
        "ephemeral-storage"] == size  # scheduled where the copies fit, and no more
    main = container(fleet)
    assert {"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True} in main["volumeMounts"]
    assert "--model=/checkpoints/v000000" in main["args"] and env_of(render, fleet)["AGENTFLOW_VLLM_START_VERSION"] == \
        "v000000"
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert allowed(planner_engine(render), settings.fleet_url + "/v1")


# ------------------------------------------------------------------------------------------------- bad values

BAD = {
    "canary-needs-knative": ([GPU], {"kserve": {"deploymentMode": "Standard"}}, ["mode pair works in Standard"]),
    "pair-has-no-canary-percent": ([GPU], {**PAIR, "kserve": {"planner": {"canaryTrafficPercent": 10}}},
                                   ["canaryTrafficPercent null"]),
    "unknown-mode": ([GPU], {"rollout": {"kserve": {"mode": "both"}}}, ["mode"]),
    "unknown-backend": ([GPU], {"rollout": {"backend": "argo"}}, ["backend"]),
    "bad-routing-endpoint": ([GPU], {"rollout": {"routingEndpoints": ["ftp://x/*"]}}, ["routingEndpoints"]),
    "lora-needs-a-claim": ([GPU, LORA], {"trainer": {"modelStore": {"uri": "s3://bucket/versions"}}},
                           ["ReadWriteMany"]),
    "lora-needs-read-write-many": ([GPU, LORA], {"trainer": {"modelStore": {"pvc": {"accessModes": ["ReadWriteOnce"]}}}},
                                   ["ReadWriteMany"]),
    "lora-without-planner-isvc": ([GPU, LORA], {"kserve": {"planner": {"enabled": True}}},
                                  ["kserve.planner.enabled=false"]),
    "lora-loads-adapters": ([GPU, LORA], {"trainer": {"settings": {"export": "merged"}}}, ["export"]),
    "lora-needs-the-trainer": ([GPU, LORA], {"trainer": {"enabled": False}}, ["enable the trainer"]),
    "lora-flag-owned-by-chart": ([GPU, LORA], {"rollout": {"lora": {"vllmArgs": ["--enable-lora"]}}}, ["vllmArgs"]),
    "fleet-slots-below-staleness": ([GPU, LORA], {"rollout": {"fleet": {"slots": 3}},
                                                  "trainer": {"settings": {"grpo_max_staleness": 4}}},
                                    ["rollout.fleet.slots (3)", "max staleness + 1 (5)"]),
    "full-weight-fleet-needs-read-write-many": ([GPU], {"trainer": {"modelStore": {"uri": ""}},
                                                       "rollout": {"fleet": {"adminTokenSecret": "fleet-admin"}}},
                                                ["ReadWriteMany", "rollout.fleet.enabled=false"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_rollout_values_are_rejected(helm, tmp_path, case):
    files, values, words = BAD[case]
    result = template(helm, [*files, write_values(tmp_path, values)], check=False)
    assert result.returncode != 0, f"{case} rendered"
    for word in words:
        assert word in result.stderr, f"{case}: {word!r} not in {result.stderr}"


@pytest.mark.parametrize("mode", ["canary", "lora", "canary-fleet"])
def test_with_priority_scheduling_every_vllm_schedules_by_priority_and_the_ring_sends_it(render_mode, mode):
    """llm.priorityScheduling (on in values-gpu.yaml): each vLLM the chart renders (the InferenceServices, the LoRA
    planner, the rollout fleet) runs --scheduling-policy=priority, which it needs to take the ring's background
    priority on training rollouts' calls (vLLM refuses a priority otherwise), and the ring's engines send it."""
    render = render_mode(mode)
    servers = [d["spec"]["predictor"]["model"]["args"] for d in render.of_kind("InferenceService")]
    servers += [c["args"] for d in render.of_kind("Deployment") for c in pod(d)["containers"] if c["name"] == "vllm"]
    assert servers and all("--scheduling-policy=priority" in args for args in servers), servers
    env = render.get("ConfigMap", f"{FULLNAME}-env")["data"]
    assert env["AGENTFLOW_PRIORITY_SCHEDULING"] == env["AGENTFLOW_PLANNER_PRIORITY_SCHEDULING"] == "true"


def test_without_priority_scheduling_no_server_is_asked_for_it(render_profile):
    render = render_profile("dev-cpu")
    assert "--scheduling-policy" not in render.text and "PRIORITY_SCHEDULING" not in render.text
