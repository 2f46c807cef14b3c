"""Fixtures for the deployment tests: helm, kubectl and promtool, chart renders, validation.

helm, kubectl and promtool are looked up in $AGENTFLOW_HELM / $AGENTFLOW_KUBECTL / $AGENTFLOW_PROMTOOL, then in the
folder scripts/get-helm.sh and scripts/get-promtool.sh fill
(${AGENTFLOW_TOOLS_DIR:-~/.cache/agentflow/bin}), then .venv/bin and PATH. Missing tools skip these tests locally
and fail them in CI (env CI set), where scripts/install.sh installs them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from agentflow.chart import find_tool

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "agentflow"
K8S = ROOT / "k8s"
RELEASE = "agentflow"
NAMESPACE = "agentflow"
VALUES_FILES = {"default": None, "dev-cpu": "values-dev-cpu.yaml", "gpu": "values-gpu.yaml"}
SERVICES = ("gateway", "memory", "planner", "executor", "verifier", "generator")
# Kinds kubernetes-validate has no schema for: checked by tests/deploy/crd_schemas.py instead.
CRD_KINDS = {"InferenceService", "ServingRuntime", "KafkaTopic", "KafkaUser", "ScaledObject",
             "TriggerAuthentication", "PyTorchJob"}


def _missing(why: str, script: str = "scripts/get-helm.sh"):
    if os.environ.get("CI"):
        pytest.fail(f"{why}; scripts/install.sh installs it (bash {script})", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def helm() -> str:
    path = find_tool("helm")
    if path is None:
        _missing("helm not found")
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    path = find_tool("promtool")
    if path is None:
        _missing("promtool not found", "scripts/get-promtool.sh")
    return path


@pytest.fixture(scope="session")
def kubectl() -> str:
    path = find_tool("kubectl")
    if path is None:
        _missing("kubectl not found")
    return path


@pytest.fixture(scope="session")
def kubernetes_validate() -> list[str]:
    try:
        import kubernetes_validate  # noqa: F401
    except ImportError:
        _missing("kubernetes-validate is not installed")
    return [sys.executable, "-m", "kubernetes_validate"]


def run(command: list[str], stdin: str | None = None, check: bool = True,
        env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra} if env_extra else None
    result = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=120, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr}{result.stdout}")
    return result


@dataclass
class Render:
    """One `helm template` output: the YAML text and its objects."""

    text: str
    docs: list[dict] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[dict]:
        return [d for d in self.docs if d["kind"] == kind]

    def get(self, kind: str, name: str) -> dict:
        matches = [d for d in self.docs if d["kind"] == kind and d["metadata"]["name"] == name]
        assert matches, f"no {kind} {name} in the render; have {sorted((d['kind'], d['metadata']['name']) for d in self.docs)}"
        return matches[0]

    def has(self, kind: str, name: str) -> bool:
        return any(d["kind"] == kind and d["metadata"]["name"] == name for d in self.docs)


def template_command(helm: str, values_files=(), set_values=(), api_versions=()) -> list[str]:
    """`helm template` of the chart; api_versions: what the cluster serves besides the built-in kinds
    (.Capabilities.APIVersions), e.g. "kubeflow.org/v1/PyTorchJob"."""
    command = [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for values in values_files:
        command += ["--values", str(values)]
    for item in set_values:
        command += ["--set", item]
    for api in api_versions:
        command += ["--api-versions", api]
    return command


def template(helm: str, values_files=(), set_values=(), check: bool = True,
             api_versions=()) -> subprocess.CompletedProcess:
    return run(template_command(helm, values_files, set_values, api_versions), check=check)


def parse(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="session")
def render_profile(helm):
    """render_profile("gpu") -> Render, cached per profile."""
    cache: dict[str, Render] = {}

    def render(profile: str) -> Render:
        if profile not in cache:
            values = VALUES_FILES[profile]
            text = template(helm, [CHART / values] if values else []).stdout
            cache[profile] = Render(text, parse(text))
        return cache[profile]

    return render


@pytest.fixture(scope="session", params=list(VALUES_FILES))
def profile(request) -> str:
    return request.param
