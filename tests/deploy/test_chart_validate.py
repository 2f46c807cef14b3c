"""helm lint --strict and helm template | kubernetes-validate --strict for each values file; custom resources
(KServe, Strimzi, KEDA, Kubeflow) against the schemas in crd_schemas.py."""

from __future__ import annotations

import copy
import re
import shlex

import jsonschema
import pytest
import yaml

from .conftest import CHART, CRD_KINDS, NAMESPACE, RELEASE, VALUES_FILES, run
from .crd_schemas import SCHEMAS

K8S_VERSION = "1.37.0"


def values_args(profile: str) -> list[str]:
    values = VALUES_FILES[profile]
    return ["--values", str(CHART / values)] if values else []


def test_helm_lint_strict(helm, profile):
    result = run([helm, "lint", "--strict", str(CHART), *values_args(profile)])
    assert "0 chart(s) failed" in result.stdout


def check_validation_output(output: str, docs: list[dict]) -> None:
    """Every non-CRD object passed against the real Kubernetes schema; only CRDs lack a schema; nothing failed."""
    assert not re.search(r"^(ERROR|FATAL)", output, re.M), output
    missing = re.findall(r"Couldn't find schema for kind (\S+) with api version", output)
    assert set(missing) <= CRD_KINDS, f"objects without a schema that are not known CRDs: {set(missing) - CRD_KINDS}"
    passed = re.findall(r"passed for resource (\S+)/(\S+) against version", output)
    expected = {(d["kind"].lower(), d["metadata"]["name"]) for d in docs if d["kind"] not in CRD_KINDS}
    assert set(passed) == expected
    assert len(missing) == sum(d["kind"] in CRD_KINDS for d in docs)


def test_template_piped_to_kubernetes_validate_strict(helm, kubernetes_validate, render_profile, profile):
    command = [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *values_args(profile)]
    pipeline = (f"set -o pipefail; {shlex.join(command)} | "
                f"{shlex.join(kubernetes_validate)} --strict -k {K8S_VERSION} -")
    result = run(["bash", "-c", pipeline], check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    check_validation_output(result.stdout, render_profile(profile).docs)


def test_custom_resources_match_their_schemas(render_profile, profile):
    docs = [d for d in render_profile(profile).docs if d["kind"] in CRD_KINDS]
    for doc in docs:
        jsonschema.validate(doc, SCHEMAS[doc["kind"]])


def test_gpu_profile_renders_every_custom_resource(render_profile):
    """All but the PyTorchJob (a multi-node trainer's: test_chart_trainer.py renders and checks it)."""
    kinds = {d["kind"] for d in render_profile("gpu").docs}
    expected = CRD_KINDS - {"PyTorchJob"}
    assert expected <= kinds, f"the gpu profile should exercise every CRD schema; missing {expected - kinds}"


@pytest.mark.parametrize("kind, path, value", [
    ("InferenceService", ["spec", "predictor", "canaryTrafficPercent"], 150),
    ("InferenceService", ["spec", "predictor", "minReplicas"], -1),
    ("InferenceService", ["spec", "predictor", "model", "modelFormat"], {}),
    ("InferenceService", ["metadata", "annotations", "serving.kserve.io/deploymentMode"], "Serverfull"),
    ("InferenceService", ["metadata", "annotations", "serving.kserve.io/enable-tag-routing"], "yes"),
    ("InferenceService", ["spec", "predictor", "model", "storageUri"], "ftp://models/x"),
    ("KafkaTopic", ["spec", "partitions"], 0),
    ("KafkaTopic", ["spec", "replicas"], 40000),
    ("KafkaTopic", ["spec", "config", "cleanup.policy"], "compacted"),
    ("KafkaTopic", ["metadata", "labels"], {"app": "x"}),
    ("ScaledObject", ["spec", "triggers"], []),
    ("ScaledObject", ["spec", "triggers", 0, "metadata", "lagThreshold"], 20),
    ("ScaledObject", ["spec", "triggers", 0, "metadata", "offsetResetPolicy"], "newest"),
    ("ScaledObject", ["spec", "scaleTargetRef"], {}),
    ("ServingRuntime", ["spec", "containers"], []),
    ("TriggerAuthentication", ["spec", "secretTargetRef", 0, "parameter"], "token"),
])
def test_crd_schemas_reject_bad_fields(render_profile, kind, path, value):
    """The schemas bite: one wrong field in an otherwise valid rendered object is rejected."""
    doc = copy.deepcopy(render_profile("gpu").of_kind(kind)[0])
    jsonschema.validate(doc, SCHEMAS[kind])
    target = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMAS[kind])


#: the profiles installed as two values files, the second on top of the first
LAYERED = {"cpu-train": ["values-dev-cpu.yaml", "values-cpu-train.yaml"],
           "gpu-lora-7b": ["values-gpu.yaml", "values-gpu-lora-7b.yaml"],
           "gpu-8-full-7b": ["values-gpu.yaml", "values-gpu-8-full-7b.yaml"]}


@pytest.mark.parametrize("layered", LAYERED)
def test_layered_profiles_lint_and_validate_strict(helm, kubernetes_validate, layered):
    values = [x for f in LAYERED[layered] for x in ("--values", str(CHART / f))]
    assert "0 chart(s) failed" in run([helm, "lint", "--strict", str(CHART), *values]).stdout
    command = [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *values]
    docs = [d for d in yaml.safe_load_all(run(command).stdout) if d]
    pipeline = (f"set -o pipefail; {shlex.join(command)} | "
                f"{shlex.join(kubernetes_validate)} --strict -k {K8S_VERSION} -")
    result = run(["bash", "-c", pipeline], check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    check_validation_output(result.stdout, docs)
    for doc in (d for d in docs if d["kind"] in CRD_KINDS):
        jsonschema.validate(doc, SCHEMAS[doc["kind"]])
