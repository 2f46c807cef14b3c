"""k8s/: the kustomize base and overlays render with `kubectl kustomize`, pass kubernetes-validate --strict, and are
the same system as the chart (each overlay equals the Helm render of its values file)."""

from __future__ import annotations

import copy
import json
import os
import shlex
import sys

import jsonschema
import pytest

from .conftest import CRD_KINDS, K8S, ROOT, VALUES_FILES, parse, run
from .crd_schemas import SCHEMAS
from .test_chart_validate import K8S_VERSION, check_validation_output

TARGETS = {"default": "base", "dev-cpu": "overlays/dev-cpu", "gpu": "overlays/gpu"}


@pytest.fixture(scope="module")
def kustomized(kubectl):
    cache: dict[str, str] = {}

    def build(profile: str) -> str:
        if profile not in cache:
            cache[profile] = run([kubectl, "kustomize", str(K8S / TARGETS[profile])]).stdout
        return cache[profile]

    return build


def as_kustomize(doc: dict) -> dict:
    """What k8s/generate.py does to a Helm-rendered object, plus the base's namespace."""
    doc = copy.deepcopy(doc)
    for labels in (doc["metadata"].get("labels"), doc.get("spec", {}).get("template", {}).get("metadata", {}).get("labels")
                   if isinstance(doc.get("spec"), dict) and isinstance(doc["spec"].get("template"), dict) else None):
        if labels is not None:
            labels.pop("helm.sh/chart", None)
            labels["app.kubernetes.io/managed-by"] = "kustomize"
    doc["metadata"].setdefault("namespace", "agentflow")
    return doc


def keyed(docs: list[dict]) -> dict:
    return {(d["apiVersion"], d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.mark.parametrize("profile", list(TARGETS))
def test_overlay_equals_the_helm_render(kustomized, render_profile, profile):
    built = keyed(parse(kustomized(profile)))
    expected = keyed([as_kustomize(d) for d in render_profile(profile).docs])
    assert set(built) == set(expected), (f"only in kustomize: {set(built) - set(expected)}; "
                                         f"only in helm: {set(expected) - set(built)}")
    for key, doc in expected.items():
        assert json.dumps(built[key], sort_keys=True) == json.dumps(doc, sort_keys=True), f"{key} differs"


@pytest.mark.parametrize("profile", list(TARGETS))
def test_overlay_piped_to_kubernetes_validate_strict(kubectl, kubernetes_validate, kustomized, profile):
    pipeline = (f"set -o pipefail; {shlex.join([kubectl, 'kustomize', str(K8S / TARGETS[profile])])} | "
                f"{shlex.join(kubernetes_validate)} --strict -k {K8S_VERSION} -")
    result = run(["bash", "-c", pipeline], check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    check_validation_output(result.stdout, parse(kustomized(profile)))


@pytest.mark.parametrize("profile", list(TARGETS))
def test_overlay_custom_resources_match_their_schemas(kustomized, profile):
    for doc in parse(kustomized(profile)):
        if doc["kind"] in CRD_KINDS:
            jsonschema.validate(doc, SCHEMAS[doc["kind"]])


def test_committed_files_are_up_to_date(helm):
    result = run([sys.executable, str(K8S / "generate.py"), "--check"], check=False,
                 env_extra={"AGENTFLOW_HELM": helm})
    assert result.returncode == 0, f"k8s/ is stale: run  python k8s/generate.py\n{result.stdout[-4000:]}"


def test_profiles_are_the_charts():
    import importlib.util

    spec = importlib.util.spec_from_file_location("k8s_generate", K8S / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert {k: v for k, v in VALUES_FILES.items() if v} == module.PROFILES
    assert module.ROOT == ROOT and os.path.isdir(module.CHART)
