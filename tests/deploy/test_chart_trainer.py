"""The trainer on GPUs (docs/deploy.md, "The trainer on GPUs"): one pod running `agentflow train`, one pod running
`torchrun --standalone`, and torchrun on several nodes as an indexed Job with a headless Service or as a Kubeflow
PyTorchJob. Each form renders from the GPU values files, passes kubernetes-validate --strict (the PyTorchJob against
crd_schemas.py, and its pod templates as Pods), and sets settings the trainer reads."""

from __future__ import annotations

import copy
import dataclasses
import shlex
import typing

import jsonschema
import pytest
import yaml

from .conftest import CHART, Render, parse, run, template, template_command
from .crd_schemas import SCHEMAS
from .test_chart_objects import FULLNAME, container, env_of, pod, selects
from .test_chart_validate import K8S_VERSION, check_validation_output
from .test_chart_values import SCHEMA, merged

GPU = CHART / "values-gpu.yaml"
LORA = CHART / "values-gpu-lora-7b.yaml"
FULL8 = CHART / "values-gpu-8-full-7b.yaml"
PYTORCHJOB_API = "kubeflow.org/v1/PyTorchJob"
NAME = f"{FULLNAME}-trainer"

# across nodes the store is a claim every node mounts (values-gpu.yaml's is an object store)
# (600Gi: what a full-weight 7B store keeps, docs/deploy.md "The trainer's disk")
SHARED_CLAIM = {"uri": "", "pvc": {"accessModes": ["ReadWriteMany"], "size": "600Gi"}}
# form -> (values files, values on top, API versions the cluster serves)
FORMS = {
    "one-gpu": ([GPU], {}, ()),
    "lora-7b": ([GPU, LORA], {}, ()),
    "full-7b-8-gpus": ([GPU, FULL8], {}, ()),
    "indexed-job": ([GPU, FULL8], {"trainer": {"nodes": 3, "modelStore": SHARED_CLAIM}}, ()),
    "pytorchjob": ([GPU, FULL8], {"trainer": {"nodes": 3, "modelStore": SHARED_CLAIM}}, (PYTORCHJOB_API,)),
}


@pytest.fixture(scope="session")
def form_command(helm, tmp_path_factory):
    """form_command(form) -> the `helm template` command line that renders it."""
    folder = tmp_path_factory.mktemp("trainer-forms")

    def command(form: str) -> list[str]:
        files, extra, apis = FORMS[form]
        if extra:
            (folder / f"{form}.yaml").write_text(yaml.safe_dump(extra))
            files = [*files, folder / f"{form}.yaml"]
        return template_command(helm, files, api_versions=apis)

    return command


@pytest.fixture(scope="session")
def render_form(form_command):
    cache: dict[str, Render] = {}

    def render(form: str) -> Render:
        if form not in cache:
            text = run(form_command(form)).stdout
            cache[form] = Render(text, parse(text))
        return cache[form]

    return render


def trainer_objects(render) -> list[tuple[str, str]]:
    return sorted((d["kind"], d["metadata"]["name"]) for d in render.docs
                  if d["metadata"]["labels"].get("app.kubernetes.io/component") == "trainer"
                  and d["kind"] not in ("KafkaUser", "NetworkPolicy"))


def gpus(main: dict) -> tuple[str, str]:
    resources = main["resources"]
    return resources["requests"].get("nvidia.com/gpu"), resources["limits"].get("nvidia.com/gpu")


def torchrun_multinode(nodes: int, gpus_per_node: int, host: str) -> list[str]:
    return ["--nnodes", str(nodes), "--nproc-per-node", str(gpus_per_node), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{host}:29400", "--rdzv-id", NAME, "--max-restarts", "3", "--no-python",
            "agentflow", "train"]


# ------------------------------------------------------------------------------------------------- the three forms


@pytest.mark.parametrize("form", ["one-gpu", "lora-7b"])
def test_one_gpu_runs_agentflow_train(render_form, form):
    render = render_form(form)
    dep = render.get("Deployment", NAME)
    main = container(dep)
    assert "command" not in main and main["args"] == ["train"]  # the image's entrypoint is `agentflow`
    assert gpus(main) == ("1", "1")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    # lora-7b keeps its versions on a claim the vLLM planner mounts (rollout.backend lora)
    claim = [("PersistentVolumeClaim", f"{FULLNAME}-checkpoints")] if form == "lora-7b" else []
    assert trainer_objects(render) == sorted([("Deployment", NAME), *claim])


def test_without_gpus_nothing_changes(helm, tmp_path):
    """trainer.gpusPerNode unset (0): the values' resources as they are, `agentflow train`, no GPU asked for."""
    values = tmp_path / "v.yaml"
    values.write_text("trainer:\n  enabled: true\ndriver:\n  enabled: false\n")  # the driver: test_chart_driver.py
    render = Render("", parse(template(helm, [values]).stdout))
    main = container(render.get("Deployment", NAME))
    assert main["args"] == ["train"] and "command" not in main
    assert main["resources"] == {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "8Gi"}}


def test_one_node_eight_gpus_runs_torchrun_standalone(render_form):
    render = render_form("full-7b-8-gpus")
    dep = render.get("Deployment", NAME)
    main = container(dep)
    assert main["command"] == ["torchrun"]
    assert main["args"] == ["--standalone", "--nproc-per-node", "8", "--max-restarts", "3", "--no-python",
                            "agentflow", "train"]
    assert gpus(main) == ("8", "8")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    shm = next(v for v in pod(dep)["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in main["volumeMounts"]
    assert trainer_objects(render) == [("Deployment", NAME)]
    assert not render.has("NetworkPolicy", f"{NAME}-ingress")  # one pod: nothing to admit


def test_multi_node_without_kubeflow_is_an_indexed_job(render_form):
    render = render_form("indexed-job")
    assert trainer_objects(render) == [("Job", NAME), ("PersistentVolumeClaim", f"{FULLNAME}-checkpoints"),
                                       ("Service", NAME)]
    job, service = render.get("Job", NAME), render.get("Service", NAME)
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 3
    assert spec["backoffLimit"] == 6
    pod_spec = spec["template"]["spec"]
    assert pod_spec["restartPolicy"] == "OnFailure"
    # pod 0 is <job>-0, resolvable in the Service its subdomain names, before it is ready too
    assert pod_spec["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    labels = spec["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in service["spec"]["selector"].items())
    (main,) = pod_spec["containers"]
    assert main["command"] == ["torchrun"]
    assert main["args"] == torchrun_multinode(3, 8, f"{NAME}-0.{NAME}")
    assert gpus(main) == ("8", "8")


def test_multi_node_with_kubeflow_is_a_pytorchjob(render_form):
    render = render_form("pytorchjob")
    assert trainer_objects(render) == [("PersistentVolumeClaim", f"{FULLNAME}-checkpoints"), ("PyTorchJob", NAME)]
    job = render.get("PyTorchJob", NAME)
    jsonschema.validate(job, SCHEMAS["PyTorchJob"])
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert {role: r["replicas"] for role, r in replicas.items()} == {"Master": 1, "Worker": 2}
    assert job["spec"]["nprocPerNode"] == "8" and job["spec"]["runPolicy"]["backoffLimit"] == 6
    for role, replica in replicas.items():
        assert replica["restartPolicy"] == "OnFailure"
        (main,) = replica["template"]["spec"]["containers"]
        assert main["name"] == "pytorch"  # the operator's webhook requires it and sets its env on it
        # the operator's MASTER_PORT and the Master's headless Service <job>-master-0 carry the rendezvous port
        assert main["ports"] == [{"name": "pytorchjob-port", "containerPort": 29400, "protocol": "TCP"},
                                 {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
        assert main["command"] == ["torchrun"], role
        assert main["args"] == torchrun_multinode(3, 8, f"{NAME}-master-0"), role
        assert gpus(main) == ("8", "8")


@pytest.mark.parametrize("kind, apis, expected", [
    ("indexedJob", (PYTORCHJOB_API,), "Job"),
    ("pytorchjob", (), "PyTorchJob"),
])
def test_distributed_kind_overrides_the_detection(helm, tmp_path, kind, apis, expected):
    values = tmp_path / "v.yaml"
    values.write_text(yaml.safe_dump({"trainer": {"nodes": 2, "distributed": {"kind": kind},
                                                  "modelStore": SHARED_CLAIM}}))
    render = Render("", parse(template(helm, [GPU, values], api_versions=apis).stdout))
    assert render.has(expected, NAME) and not render.has("Deployment", NAME)


@pytest.mark.parametrize("form", ["indexed-job", "pytorchjob"])
def test_multi_node_pods_admit_each_other(render_form, form):
    """NCCL, gloo and the rendezvous between the trainer's pods get through the default deny, from those pods only."""
    render = render_form(form)
    policy = render.get("NetworkPolicy", f"{NAME}-ingress")
    job = render.get("Job" if form == "indexed-job" else "PyTorchJob", NAME)
    templates = ([job["spec"]["template"]] if form == "indexed-job"
                 else [r["template"] for r in job["spec"]["pytorchReplicaSpecs"].values()])
    for tpl in templates:
        labels = tpl["metadata"]["labels"]
        assert selects(policy, labels) and selects(render.get("NetworkPolicy", f"{FULLNAME}-default-deny"), labels)
        (rule,) = policy["spec"]["ingress"]
        assert "ports" not in rule and rule["from"] == [{"podSelector": policy["spec"]["podSelector"]}]
    planner = render.get("Deployment", f"{FULLNAME}-planner")["spec"]["template"]["metadata"]["labels"]
    assert not selects(policy, planner)


# ------------------------------------------------------------------------------------------------- shared store


def write_values(tmp_path, values: dict):
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


MULTI_NODE = {"enabled": True, "nodes": 2, "gpusPerNode": 8}


@pytest.mark.parametrize("store", [
    {},  # the chart's ReadWriteOnce claim
    {"pvc": {"create": False, "existingClaim": "models"}},
    {"uri": "s3://models/planner", "pvc": {"accessModes": ["ReadWriteMany"]}},  # ranks write resume shards as files
], ids=["new-claim", "existing-claim", "object-store"])
def test_multi_node_needs_a_store_every_node_reaches(helm, tmp_path, store):
    values = write_values(tmp_path, {"trainer": {**MULTI_NODE, "modelStore": store}})
    result = template(helm, [values], check=False)
    assert result.returncode != 0
    for words in ("trainer.nodes is 2", "trainer.modelStore.uri", "ReadWriteMany", "resume state"):
        assert words in result.stderr, result.stderr


def test_multi_node_on_a_read_write_many_claim(helm, tmp_path):
    values = write_values(tmp_path, {"trainer": {**MULTI_NODE, "modelStore": {"pvc": {
        "accessModes": ["ReadWriteMany"]}}}, "driver": {"enabled": False}})
    render = Render("", parse(template(helm, [values]).stdout))
    pvc = render.get("PersistentVolumeClaim", f"{FULLNAME}-checkpoints")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    pod_spec = render.get("Job", NAME)["spec"]["template"]["spec"]
    claim = next(v for v in pod_spec["volumes"] if v["name"] == "checkpoints")
    assert claim["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert {"name": "checkpoints", "mountPath": "/checkpoints"} in pod_spec["containers"][0]["volumeMounts"]


def test_multi_node_needs_gpus(helm, tmp_path):
    values = write_values(tmp_path, {"trainer": {"enabled": True, "nodes": 2,
                                                 "modelStore": {"pvc": {"accessModes": ["ReadWriteMany"]}}}})
    result = template(helm, [values], check=False)
    assert result.returncode != 0 and "trainer.gpusPerNode" in result.stderr, result.stderr


@pytest.mark.parametrize("trainer, word", [
    ({"gpusPerNode": -1}, "gpusPerNode"),
    ({"nodes": 0}, "nodes"),
    ({"distributed": {"kind": "mpijob"}}, "kind"),
    ({"torchrun": {"rdzvPort": 70000}}, "rdzvPort"),
    ({"torchrun": {"maxRestart": 3}}, "maxRestart"),
])
def test_schema_rejects_bad_trainer_values(helm, tmp_path, trainer, word):
    result = template(helm, [GPU, write_values(tmp_path, {"trainer": trainer})], check=False)
    assert result.returncode != 0 and word in result.stderr, result.stderr


# ------------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize("values", [LORA, FULL8], ids=lambda p: p.name)
def test_gpu_values_files_satisfy_the_schema_and_lint(helm, values):
    """Both are layered on values-gpu.yaml."""
    layered = yaml.safe_load(GPU.read_text())
    for path in (GPU, values):
        layered = merged(layered, yaml.safe_load(path.read_text()))
    jsonschema.validate(merged(yaml.safe_load((CHART / "values.yaml").read_text()), layered), SCHEMA)
    result = run([helm, "lint", "--strict", str(CHART), "--values", str(GPU), "--values", str(values)])
    assert "0 chart(s) failed" in result.stdout


def kubernetes_validate_strict(kubernetes_validate, producer: str) -> str:
    pipeline = f"set -o pipefail; {producer} | {shlex.join(kubernetes_validate)} --strict -k {K8S_VERSION} -"
    result = run(["bash", "-c", pipeline], check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.parametrize("form", list(FORMS))
def test_form_passes_kubernetes_validate_strict(kubernetes_validate, form_command, render_form, form):
    output = kubernetes_validate_strict(kubernetes_validate, shlex.join(form_command(form)))
    check_validation_output(output, render_form(form).docs)


def test_pytorchjob_pods_pass_kubernetes_validate_strict(kubernetes_validate, render_form, tmp_path):
    """The CRD schema stops at the pod template: each replica's pod, as the operator makes it, is a valid Pod."""
    job = render_form("pytorchjob").get("PyTorchJob", NAME)
    pods = []
    for role, replica in job["spec"]["pytorchReplicaSpecs"].items():
        tpl = replica["template"]
        pods.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {**tpl["metadata"], "name": f"{NAME}-{role.lower()}-0"},
                     "spec": {**tpl["spec"], "restartPolicy": replica["restartPolicy"]}})
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump_all(pods))
    output = kubernetes_validate_strict(kubernetes_validate, f"cat {shlex.quote(str(path))}")
    check_validation_output(output, pods)


@pytest.mark.parametrize("path, value", [
    (["spec", "pytorchReplicaSpecs", "Master", "replicas"], 2),
    (["spec", "pytorchReplicaSpecs", "Worker", "template", "spec", "containers", 0, "name"], "trainer"),
    (["spec", "pytorchReplicaSpecs", "Chief"], {"replicas": 1, "template": {"spec": {"containers": []}}}),
    (["spec", "nprocPerNode"], 8),
    (["spec", "runPolicy", "cleanPodPolicy"], "Always"),
    (["metadata", "name"], "Agentflow_trainer"),
])
def test_pytorchjob_schema_rejects_bad_fields(render_form, path, value):
    doc = copy.deepcopy(render_form("pytorchjob").get("PyTorchJob", NAME))
    target = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMAS["PyTorchJob"])


# ------------------------------------------------------------------------------------------------- settings


def setting_names(cls, prefix: str = "AGENTFLOW_TRAINER_") -> set[str]:
    """The variables `from_env` reads for a settings dataclass (a group's fields as <PREFIX><GROUP>_<FIELD>)."""
    hints = typing.get_type_hints(cls)
    names = set()
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            names |= setting_names(hints[f.name], f"{prefix}{f.name.upper()}_")
        else:
            names.add(f"{prefix}{f.name.upper()}")
    return names


@pytest.mark.parametrize("form", list(FORMS))
def test_trainer_settings_are_read_by_the_trainer(render_form, form):
    """Every AGENTFLOW_TRAINER_* variable is a TrainerSettings field, and together they pass its validation."""
    from agentflow.trainer.service import TrainerSettings, trainer_settings

    render = render_form(form)
    kind = {"indexed-job": "Job", "pytorchjob": "PyTorchJob"}.get(form, "Deployment")
    obj = render.get(kind, NAME)
    if kind == "PyTorchJob":
        obj = {"spec": {"template": obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]}}
    env = {k: v for k, v in env_of(render, obj).items() if k.startswith("AGENTFLOW_TRAINER_")}
    unknown = set(env) - setting_names(TrainerSettings)
    assert not unknown, f"{unknown} are read by nothing"
    settings = trainer_settings(environ=env)
    assert settings.grpo.group_size == 8 and settings.grpo.batch_trajectories == 256
