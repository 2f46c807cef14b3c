"""The chart's observability: PodMonitor, PrometheusRule and Grafana dashboards render only when asked; every alert
and every dashboard query parses with promtool, names only metrics the code exports, and each alert fires on the
series it is meant for (promtool test rules) and stays quiet on healthy ones."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import CHART, ROOT, Render, parse, template

ON = ["monitoring.podMonitor.enabled=true", "monitoring.prometheusRule.enabled=true",
      "monitoring.dashboards.enabled=true"]
DASHBOARDS = CHART / "files" / "dashboards"


@pytest.fixture(scope="module")
def monitored(helm) -> Render:
    text = template(helm, set_values=ON).stdout
    return Render(text, parse(text))


def check_rules(promtool: str, path: Path) -> None:
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel title, PromQL) of every panel target."""
    found = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            found += [(board["uid"], panel["title"], t["expr"]) for t in panel["targets"]]
    return found


def test_monitoring_objects_render_only_when_enabled(helm, render_profile, monitored):
    for profile in ("default", "dev-cpu", "gpu"):
        kinds = {d["kind"] for d in render_profile(profile).docs}
        assert not kinds & {"PodMonitor", "PrometheusRule"}, profile
        assert not any(d["metadata"]["name"].endswith(("-dashboard-ring", "-dashboard-serving"))
                       for d in render_profile(profile).docs)
    monitor = monitored.of_kind("PodMonitor")[0]
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics", "http"]
    boards = [d for d in monitored.of_kind("ConfigMap") if "-dashboard-" in d["metadata"]["name"]]
    assert sorted(d["metadata"]["name"].rsplit("-", 1)[1] for d in boards) == [
        "canaries", "ring", "serving", "training"]
    for board in boards:
        assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
        (name, text), = board["data"].items()
        assert json.loads(text) == json.loads((DASHBOARDS / name).read_text())
    refused = template(helm, set_values=["monitoring.podMonitor.enabled=true", "metrics.enabled=false"], check=False)
    assert refused.returncode != 0 and "needs metrics.enabled" in refused.stderr


def test_the_rendered_alerts_pass_promtool(monitored, promtool, tmp_path):
    rule = monitored.of_kind("PrometheusRule")[0]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    check_rules(promtool, path)
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
    source = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    assert len(alerts) == len(set(alerts)) == sum(len(g["rules"]) for g in source["groups"]), alerts


def test_the_dashboards_are_generated_and_every_query_parses(promtool, tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_dashboards
    finally:
        sys.path.pop(0)
    assert {p.name: p.read_text() for p in DASHBOARDS.glob("*.json")} == gen_dashboards.render(), \
        "dashboards differ from scripts/gen_dashboards.py: run it"
    queries = dashboard_queries()
    assert len(queries) > 20
    rules = [{"record": f"dashboard:query_{i}", "expr": expr.replace("$__rate_interval", "5m")}
             for i, (_, _, expr) in enumerate(queries)]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    check_rules(promtool, path)


def exported_metric_names() -> set[str]:
    """Every sample name the code's collectors can export (counters with _total, histograms with their series)."""
    from prometheus_client import REGISTRY

    from agentflow import telemetry
    from agentflow.llm.metrics import routing_metrics, server_metrics
    from agentflow.rollout.metrics import rollout_metrics
    from agentflow.rpc.metrics import collectors
    from agentflow.services.memory.metrics import trajectory_metrics
    from agentflow.trainer.drive import drive_metrics
    from agentflow.trainer.metrics import trainer_metrics

    for make in (telemetry.metrics, routing_metrics, server_metrics, rollout_metrics, collectors, trainer_metrics,
                 trajectory_metrics, drive_metrics):
        make()

    class IdleWorker:
        def metrics(self):
            return {}

    families = [*REGISTRY.collect(), *telemetry.WorkerCollector("x", IdleWorker()).collect()]
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    return {f.name + s for f in families for s in suffixes.get(f.type, ("",))}


VLLM_METRICS = Path(__file__).with_name("vllm_metrics.txt")
# what NVIDIA's dcgm-exporter exports by default (its default-counters.csv); the GPU panels read these two
DCGM_METRICS = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"}


def vllm_metric_names() -> set[str]:
    """The pinned vLLM's series the chart may read (checked against a running server by test_vllm_engine.py)."""
    return {line.split("#")[0].strip() for line in VLLM_METRICS.read_text().splitlines()} - {""}


def test_alerts_and_dashboards_name_only_exported_metrics():
    text = (CHART / "files" / "alerts.yaml").read_text() + "\n".join(q for _, _, q in dashboard_queries())
    named = set(re.findall(r"\bagentflow_[a-z_]+\b", text))
    assert named and named - exported_metric_names() == set()
    vllm = set(re.findall(r"\bvllm:[a-z_]+\b", text))
    assert vllm and vllm - vllm_metric_names() == set()
    dcgm = set(re.findall(r"\bDCGM_[A-Z_]+\b", text))
    assert dcgm and dcgm - DCGM_METRICS == set()


# Each alert against series that should fire it, and healthy series that should not (promtool's unit tests).
ALERT_TESTS = [
    {"interval": "1m", "input_series": [
        {"series": 'agentflow_consumer_lag{service="planner"}', "values": "0+20x40"},
        {"series": 'agentflow_consumer_lag{service="memory"}', "values": "150x40"},  # behind but not growing
        {"series": 'agentflow_worker_deadlettered_total{service="executor"}', "values": "0 0 0 1x20"},
        {"series": 'agentflow_worker_deadlettered_total{service="memory"}', "values": "0x25"},
        {"series": 'agentflow_worker_ready{service="gateway"}', "values": "1 1 0x20"},
        {"series": 'agentflow_worker_ready{service="planner"}', "values": "1x25"},
    ], "alert_rule_test": [
        {"eval_time": "5m", "alertname": "AgentFlowConsumerLagGrowing", "exp_alerts": []},
        {"eval_time": "30m", "alertname": "AgentFlowConsumerLagGrowing",
         "exp_alerts": [{"exp_labels": {"severity": "warning", "service": "planner"}}]},
        {"eval_time": "5m", "alertname": "AgentFlowDeadLetters",
         "exp_alerts": [{"exp_labels": {"severity": "warning", "service": "executor"}}]},
        {"eval_time": "20m", "alertname": "AgentFlowWorkerNotReady",
         "exp_alerts": [{"exp_labels": {"severity": "critical", "service": "gateway"}}]},
    ]},
    {"interval": "1m", "input_series": [
        {"series": 'agentflow_grpc_server_handled_total{grpc_service="agentflow.v1.AgentFlow",grpc_method="Solve",'
                   'grpc_code="OK"}', "values": "0+90x30"},
        {"series": 'agentflow_grpc_server_handled_total{grpc_service="agentflow.v1.AgentFlow",grpc_method="Solve",'
                   'grpc_code="INTERNAL"}', "values": "0+10x30"},
        {"series": 'agentflow_grpc_server_handled_total{grpc_service="agentflow.v1.AgentFlow",grpc_method="Solve",'
                   'grpc_code="INVALID_ARGUMENT"}', "values": "0+500x30"},  # callers' mistakes: not an error rate
        {"series": 'agentflow_grpc_server_auth_failures_total{grpc_service="agentflow.v1.AgentFlow",'
                   'grpc_method="Solve"}', "values": "0+120x30"},
        {"series": 'agentflow_llm_request_duration_seconds_bucket{version="v1",le="30"}', "values": "0x40"},
        {"series": 'agentflow_llm_request_duration_seconds_bucket{version="v1",le="60"}', "values": "0+10x40"},
        {"series": 'agentflow_llm_request_duration_seconds_bucket{version="v1",le="+Inf"}', "values": "0+10x40"},
        {"series": 'agentflow_llm_request_duration_seconds_bucket{version="v2",le="30"}', "values": "0+10x40"},
        {"series": 'agentflow_llm_request_duration_seconds_bucket{version="v2",le="+Inf"}', "values": "0+10x40"},
    ], "alert_rule_test": [
        {"eval_time": "20m", "alertname": "AgentFlowGatewayErrors", "exp_alerts": [
            {"exp_labels": {"severity": "critical"}}]},
        {"eval_time": "20m", "alertname": "AgentFlowGatewayAuthFailures", "exp_alerts": [
            {"exp_labels": {"severity": "warning"}}]},
        {"eval_time": "35m", "alertname": "AgentFlowLLMSlow", "exp_alerts": [
            {"exp_labels": {"severity": "warning", "version": "v1"}}]},
    ]},
    {"interval": "1m", "input_series": [
        {"series": "agentflow_trainer_last_step_timestamp_seconds", "values": "0x100"},
        {"series": "agentflow_trainer_consumer_lag", "values": "50x100"},
        {"series": 'agentflow_rollout_decisions_total{action="rollback"}', "values": "0 0 0 1x20"},
        {"series": 'agentflow_rollout_decisions_total{action="promote"}', "values": "0 1x20"},
        {"series": "agentflow_trainer_quarantined_groups_total", "values": "0x10 2x20"},
    ], "alert_rule_test": [
        {"eval_time": "5m", "alertname": "AgentFlowRolloutsFromOtherWeights", "exp_alerts": []},
        {"eval_time": "15m", "alertname": "AgentFlowRolloutsFromOtherWeights", "exp_alerts": [
            {"exp_labels": {"severity": "warning"}}]},
        {"eval_time": "30m", "alertname": "AgentFlowTrainerStalled", "exp_alerts": []},
        {"eval_time": "80m", "alertname": "AgentFlowTrainerStalled", "exp_alerts": [
            {"exp_labels": {"severity": "warning"}}]},
        {"eval_time": "10m", "alertname": "AgentFlowCanaryRolledBack", "exp_alerts": [
            {"exp_labels": {"severity": "info", "action": "rollback"}}]},
    ]},
]


ALERT_TESTS.append({"interval": "1m", "input_series": [
    {"series": 'vllm:time_to_first_token_seconds_bucket{model_name="planner",le="5"}', "values": "0x40"},
    {"series": 'vllm:time_to_first_token_seconds_bucket{model_name="planner",le="20"}', "values": "0+10x40"},
    {"series": 'vllm:time_to_first_token_seconds_bucket{model_name="planner",le="+Inf"}', "values": "0+10x40"},
    {"series": 'vllm:time_to_first_token_seconds_bucket{model_name="frozen",le="5"}', "values": "0+10x40"},
    {"series": 'vllm:time_to_first_token_seconds_bucket{model_name="frozen",le="+Inf"}', "values": "0+10x40"},
    {"series": 'vllm:num_requests_waiting{model_name="planner",pod="a"}', "values": "40x30"},
    {"series": 'vllm:num_requests_running{model_name="planner",pod="a"}', "values": "16x30"},
    {"series": 'vllm:num_requests_waiting{model_name="frozen",pod="b"}', "values": "12x30"},  # many run: fine
    {"series": 'vllm:num_requests_running{model_name="frozen",pod="b"}', "values": "64x30"},
    {"series": 'vllm:kv_cache_usage_perc{model_name="planner",pod="a"}', "values": "0.99x30"},
    {"series": 'vllm:kv_cache_usage_perc{model_name="frozen",pod="b"}', "values": "0.5x30"},
], "alert_rule_test": [
    {"eval_time": "10m", "alertname": "AgentFlowVLLMSlowFirstToken", "exp_alerts": []},
    {"eval_time": "35m", "alertname": "AgentFlowVLLMSlowFirstToken", "exp_alerts": [
        {"exp_labels": {"severity": "warning", "model_name": "planner"}}]},
    {"eval_time": "20m", "alertname": "AgentFlowVLLMQueueing", "exp_alerts": [
        {"exp_labels": {"severity": "warning", "model_name": "planner"}}]},
    {"eval_time": "20m", "alertname": "AgentFlowVLLMKVCacheFull", "exp_alerts": [
        {"exp_labels": {"severity": "warning", "model_name": "planner", "pod": "a"}}]},
]})

# the loop gone idle (issue 51): groups dropped and none trained, training rollouts failing, a canary nothing
# rewards, a canary undecided for hours; and the healthy side of each
ALERT_TESTS.append({"interval": "1m", "input_series": [
    {"series": 'agentflow_trainer_dropped_total{reason="reward_wait"}', "values": "0+2x120"},
    {"series": 'agentflow_drive_rollouts_sent_total{job="driver"}', "values": "0+10x60"},
    {"series": 'agentflow_drive_rollouts_failed_total{job="driver",error="NOT_FOUND"}', "values": "0+5x60"},
    {"series": 'agentflow_drive_rollouts_sent_total{job="healthy"}', "values": "0+10x60"},
    {"series": 'agentflow_drive_rollouts_failed_total{job="healthy",error="DEADLINE_EXCEEDED"}', "values": "0+1x60"},
    {"series": 'agentflow_rollout_samples{arm="canary"}', "values": "0+10x120"},
    {"series": 'agentflow_rollout_rewarded_samples{arm="canary"}', "values": "0x120"},
    {"series": "agentflow_rollout_canary_percent", "values": "10x240"},
    {"series": "agentflow_drive_rollouts_sent_total{job=\"idle\"}", "values": "0x240"},
    {"series": 'agentflow_grpc_server_handled_total{grpc_method="Solve",grpc_code="OK"}', "values": "0+10x240"},
    {"series": 'agentflow_rollout_decisions_total{action="start"}', "values": "0 1x240"},
], "alert_rule_test": [
    {"eval_time": "10m", "alertname": "AgentFlowTrainingGroupsDropped", "exp_alerts": []},
    {"eval_time": "40m", "alertname": "AgentFlowTrainingGroupsDropped", "exp_alerts": [
        {"exp_labels": {"severity": "warning"}}]},
    {"eval_time": "30m", "alertname": "AgentFlowDriverRolloutsFailing", "exp_alerts": [
        {"exp_labels": {"severity": "warning", "job": "driver"}}]},
    {"eval_time": "30m", "alertname": "AgentFlowCanaryUnrewarded", "exp_alerts": []},
    {"eval_time": "60m", "alertname": "AgentFlowCanaryUnrewarded", "exp_alerts": [
        {"exp_labels": {"severity": "critical", "arm": "canary"}}]},
    {"eval_time": "30m", "alertname": "AgentFlowNoTrainingRollouts", "exp_alerts": []},
    # at 200 min: the driver job above stopped sending at 60 min
    {"eval_time": "200m", "alertname": "AgentFlowNoTrainingRollouts", "exp_alerts": [
        {"exp_labels": {"severity": "warning"}}]},
    {"eval_time": "60m", "alertname": "AgentFlowCanaryUndecided", "exp_alerts": []},
    {"eval_time": "230m", "alertname": "AgentFlowCanaryUndecided", "exp_alerts": [
        {"exp_labels": {"severity": "warning"}}]},
]})
ALERT_TESTS.append({"interval": "1m", "input_series": [  # a trainer that trains, a canary that is rewarded
    {"series": 'agentflow_trainer_dropped_total{reason="stale"}', "values": "0+2x120"},
    {"series": 'agentflow_trainer_steps_total{outcome="trained"}', "values": "0+1x120"},
    {"series": 'agentflow_rollout_samples{arm="canary"}', "values": "0+10x120"},
    {"series": 'agentflow_rollout_rewarded_samples{arm="canary"}', "values": "0+3x120"},
    {"series": "agentflow_drive_rollouts_sent_total", "values": "0+5x120"},
    {"series": 'agentflow_grpc_server_handled_total{grpc_method="Solve",grpc_code="OK"}', "values": "0+10x120"},
], "alert_rule_test": [
    {"eval_time": "100m", "alertname": "AgentFlowNoTrainingRollouts", "exp_alerts": []},
    {"eval_time": "100m", "alertname": "AgentFlowTrainingGroupsDropped", "exp_alerts": []},
    {"eval_time": "100m", "alertname": "AgentFlowCanaryUnrewarded", "exp_alerts": []},
]})


def test_each_alert_fires_on_its_series_and_not_on_healthy_ones(promtool, tmp_path):
    rules = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    for group in rules["groups"]:  # annotations are checked by `check rules`; here only whether and what fires
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(rules))
    tested = {t["alertname"] for case in ALERT_TESTS for t in case["alert_rule_test"]}
    assert tested == {r["alert"] for g in rules["groups"] for r in g["rules"]}
    (tmp_path / "alerts_test.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["alerts.yaml"], "evaluation_interval": "1m", "tests": ALERT_TESTS}))
    result = subprocess.run([promtool, "test", "rules", "alerts_test.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def trainer_container(render: Render) -> dict:
    (deployment,) = [d for d in render.of_kind("Deployment") if d["metadata"]["name"].endswith("-trainer")]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_trainer_tracking_points_the_trainer_at_mlflow_only_when_set(helm, render_profile):
    gpu = CHART / "values-gpu.yaml"
    plain = trainer_container(render_profile("gpu"))
    assert not any(e["name"].startswith("MLFLOW_") for e in plain["env"])
    text = template(helm, [gpu], ["trainer.tracking.mlflowTrackingUri=http://mlflow.ml:5000",
                                  "trainer.tracking.credentialsSecret=mlflow-auth"]).stdout
    container = trainer_container(Render(text, parse(text)))
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow.ml:5000" and env["MLFLOW_EXPERIMENT_NAME"] == "agentflow"
    assert {"secretRef": {"name": "mlflow-auth"}} in container["envFrom"]
    refused = template(helm, [gpu], ["trainer.tracking.mlflowTrackingUri=mlflow:5000"], check=False)
    assert refused.returncode != 0 and "mlflowTrackingUri" in refused.stderr
