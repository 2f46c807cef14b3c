"""skaffold.yaml, structurally (no skaffold binary here): schema version, artifacts and their Dockerfiles, the chart
and values files of every profile, and that each profile's release renders and validates with Helm."""

from __future__ import annotations

import re

import pytest
import yaml

from .conftest import CRD_KINDS, ROOT, parse, run, template

CONFIG = yaml.safe_load((ROOT / "skaffold.yaml").read_text())


def pipeline(profile: str | None) -> dict:
    """The effective config of a profile: its sections replace the top-level ones (as skaffold does)."""
    config = {k: v for k, v in CONFIG.items() if k != "profiles"}
    if profile:
        (chosen,) = [p for p in CONFIG["profiles"] if p["name"] == profile]
        config.update({k: v for k, v in chosen.items() if k not in ("name", "activation", "patches")})
    return config


def test_schema_version():
    assert CONFIG["kind"] == "Config"
    assert re.fullmatch(r"skaffold/v4(beta\d+)?", CONFIG["apiVersion"]), CONFIG["apiVersion"]


def test_profiles():
    assert {p["name"] for p in CONFIG["profiles"]} == {"dev", "gpu"}


@pytest.mark.parametrize("profile", [None, "dev", "gpu"])
def test_artifacts_build_from_dockerfiles(profile):
    artifacts = pipeline(profile)["build"]["artifacts"]
    assert artifacts
    for artifact in artifacts:
        context = ROOT / artifact.get("context", ".")
        assert context.is_dir()
        dockerfile = context / artifact["docker"]["dockerfile"]
        assert dockerfile.is_file(), dockerfile
        assert re.fullmatch(r"[a-z0-9]+([._-][a-z0-9]+)*", artifact["image"])
    names = {a["image"] for a in artifacts}
    assert "agentflow" in names
    if profile == "gpu":
        assert {a["docker"]["dockerfile"] for a in artifacts} == {"Dockerfile", "Dockerfile.cuda"}
        assert pipeline(profile)["build"]["local"]["push"] is True


def releases(profile):
    return pipeline(profile)["deploy"]["helm"]["releases"]


@pytest.mark.parametrize("profile", [None, "dev", "gpu"])
def test_releases_point_at_the_chart_and_existing_values(profile):
    for release in releases(profile):
        chart = ROOT / release["chartPath"]
        assert (chart / "Chart.yaml").is_file()
        assert release["valuesFiles"]
        for values in release["valuesFiles"]:
            assert (ROOT / values).is_file(), values


def image_templates(profile) -> dict[str, str]:
    """Every IMAGE_* template names a built artifact (skaffold maps '-' and '.' in names to '_')."""
    artifacts = {re.sub(r"[^A-Za-z0-9]", "_", a["image"]) for a in pipeline(profile)["build"]["artifacts"]}
    sets = {}
    for release in releases(profile):
        for key, value in release.get("setValueTemplates", {}).items():
            for field, artifact in re.findall(r"\{\{\s*\.IMAGE_(REPO|TAG|DIGEST)_(\w+)\s*\}\}", value):
                assert artifact in artifacts, f"{key}: {value} names no artifact"
            sets[key] = value
    return sets


@pytest.mark.parametrize("profile", ["dev", "gpu"])
def test_each_profile_renders_and_validates(helm, kubernetes_validate, profile):
    """Render each release as skaffold would (image templates filled in) and validate it."""
    for release in releases(profile):
        fake = {"REPO": "registry.example.com/team/{name}", "TAG": "v0.1.0-3-gabc1234", "DIGEST": "sha256:" + "0" * 64}
        values = []
        for key, value in image_templates(profile).items():
            filled = re.sub(r"\{\{\s*\.IMAGE_(REPO|TAG|DIGEST)_(\w+)\s*\}\}",
                            lambda m: fake[m.group(1)].format(name=m.group(2).replace("_", "-")), value)
            values.append(f"{key}={filled}")
        command_values = [ROOT / v for v in release["valuesFiles"]]
        result = template(helm, command_values, values)
        docs = parse(result.stdout)
        images = {c["image"] for d in docs if d["kind"] == "Deployment"
                  for c in d["spec"]["template"]["spec"]["containers"]}
        # every image built here, but vLLM's own for a planner or rollout fleet served by a Deployment
        ours = {i for i in images if not i.startswith("vllm/vllm-openai:")}
        assert ours and all(i.startswith("registry.example.com/team/agentflow") for i in ours), images
        if profile == "gpu":
            assert "registry.example.com/team/agentflow-cuda:v0.1.0-3-gabc1234" in images
        checked = run(kubernetes_validate + ["--strict", "--quiet", "-"], stdin=result.stdout, check=False)
        assert checked.returncode == 0, checked.stdout
        assert all(kind in CRD_KINDS for kind in re.findall(r"schema for kind (\S+)", checked.stdout))


def test_port_forward_targets_the_gateway():
    (forward,) = CONFIG["portForward"]
    assert forward["resourceType"] == "service" and forward["resourceName"].endswith("-gateway")
    assert forward["port"] == 50051
