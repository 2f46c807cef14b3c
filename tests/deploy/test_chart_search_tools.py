"""The search tools in the chart (docs/tools.md, docs/retrieval.md): the retriever is off by default; with
retriever.enabled one Deployment and Service run `agentflow serve retriever` on the configured index, the modules
get its URL (and token) for the `search` tool, a NetworkPolicy admits only this release's pods (and the metrics
scrapers), and the web search provider's key comes from a Secret, never as a literal value."""

from __future__ import annotations

import shlex

import pytest
import yaml

from .conftest import Render, parse, run, template_command
from .test_chart_objects import FULLNAME, RELEASE_SELECTOR, container, env_of, pod, selects
from .test_chart_validate import K8S_VERSION, check_validation_output

NAME = f"{FULLNAME}-retriever"
ON = {"retriever": {"enabled": True, "index": "s3://indexes/wiki-abstracts", "credentialsSecret": "index-s3",
                    "tokenSecret": "retriever-token", "port": 8089},
      "searchTools": {"wikipedia": {"endpoint": "http://kiwix.docs.svc/w/api.php"},
                      "webSearch": {"provider": "brave", "apiKeySecret": "brave-key", "apiKeyKey": "key"}}}
MODULES = ("planner", "executor", "verifier", "generator")


@pytest.fixture(scope="module")
def values_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("search-tools") / "on.yaml"
    path.write_text(yaml.safe_dump(ON))
    return path


@pytest.fixture(scope="module")
def render_on(helm, values_file) -> Render:
    text = run(template_command(helm, [values_file])).stdout
    return Render(text, parse(text))


def test_off_by_default(render_profile):
    render = render_profile("default")
    assert not any("retriever" in d["metadata"]["name"] for d in render.docs)
    executor = render.get("Deployment", f"{FULLNAME}-executor")
    env = env_of(render, executor)
    assert "AGENTFLOW_RETRIEVER_URL" not in env and "AGENTFLOW_WEB_SEARCH_API_KEY" not in env
    assert env["AGENTFLOW_WEB_SEARCH_PROVIDER"] == "searxng"


def test_the_retriever_serves_the_configured_index(render_on):
    dep = render_on.get("Deployment", NAME)
    main = container(dep)
    assert main["args"][:2] == ["serve", "retriever"]
    assert "--index=s3://indexes/wiki-abstracts" in main["args"] and "--port=8089" in main["args"]
    assert {"secretRef": {"name": "index-s3"}} in main["envFrom"]
    token = next(e for e in main["env"] if e["name"] == "AGENTFLOW_RETRIEVER_TOKEN")
    assert token["valueFrom"]["secretKeyRef"]["name"] == "retriever-token"
    assert main["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod(dep)["automountServiceAccountToken"] is False
    service = render_on.get("Service", NAME)
    assert service["spec"]["ports"][0]["port"] == 8089


@pytest.mark.parametrize("module", MODULES)
def test_the_modules_get_the_search_settings(render_on, module):
    env = env_of(render_on, render_on.get("Deployment", f"{FULLNAME}-{module}"))
    assert env["AGENTFLOW_RETRIEVER_URL"] == f"http://{NAME}:8089/search"
    assert env["AGENTFLOW_RETRIEVER_TOKEN"] == "<from secretKeyRef>"
    assert env["AGENTFLOW_WIKIPEDIA_URL"] == "http://kiwix.docs.svc/w/api.php"
    assert env["AGENTFLOW_WEB_SEARCH_PROVIDER"] == "brave"
    assert env["AGENTFLOW_WEB_SEARCH_API_KEY"] == "<from secretKeyRef>"  # never a literal in the manifest


def test_only_this_release_reaches_the_retriever(render_on):
    policy = render_on.get("NetworkPolicy", f"{NAME}-ingress")
    labels = render_on.get("Deployment", NAME)["spec"]["template"]["metadata"]["labels"]
    assert selects(policy, labels)
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8089, "protocol": "TCP"}]
    assert {"podSelector": {"matchLabels": RELEASE_SELECTOR}} in rule["from"]


def test_the_render_passes_the_kubernetes_schemas(helm, values_file, render_on, kubernetes_validate):
    pipeline = (f"set -o pipefail; {shlex.join(template_command(helm, [values_file]))} | "
                f"{shlex.join(kubernetes_validate)} --strict -k {K8S_VERSION} -")
    result = run(["bash", "-c", pipeline], check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    check_validation_output(result.stdout, render_on.docs)
    assert f"passed for resource deployment/{NAME}" in result.stdout


def test_the_schema_refuses_an_unknown_provider(helm, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"searchTools": {"webSearch": {"provider": "altavista"}}}))
    result = run(template_command(helm, [bad]), check=False)
    assert result.returncode != 0 and "provider" in result.stderr
