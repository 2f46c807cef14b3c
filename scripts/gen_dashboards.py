"""Writes the Grafana dashboards the chart ships (charts/agentflow/files/dashboards/*.json).

Run after changing a panel: `python scripts/gen_dashboards.py`; tests/deploy/test_chart_monitoring.py fails when the
files differ from what this writes, and checks every query with promtool.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "charts" / "agentflow" / "files" / "dashboards"
RATE = "$__rate_interval"


def panel(title: str, *targets: tuple[str, str], unit: str = "short", kind: str = "timeseries") -> dict:
    """One panel; ``targets``: (PromQL, legend)."""
    return {"type": kind, "title": title, "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
                        for i, (expr, legend) in enumerate(targets)]}


def dashboard(uid: str, title: str, panels: list[dict]) -> dict:
    for i, p in enumerate(panels):  # two panels a row
        p["id"], p["gridPos"] = i + 1, {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)}
    return {"uid": uid, "title": title, "tags": ["agentflow"], "schemaVersion": 39, "version": 1,
            "editable": True, "time": {"from": "now-6h", "to": "now"}, "refresh": "30s",
            "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                     "label": "Prometheus"}]},
            "panels": panels}


GATEWAY = 'grpc_service="agentflow.v1.AgentFlow"'
DASHBOARDS = {
    "agentflow-ring": dashboard("agentflow-ring", "AgentFlow / Ring health", [
        panel("Consumer lag (records)", ("sum by (service) (agentflow_consumer_lag)", "{{service}}")),
        panel("Events handled per second", (f"sum by (service) (rate(agentflow_worker_records_processed_total[{RATE}]))",
                                            "{{service}}"), unit="ops"),
        panel("Dead letters (10 min)", ("sum by (service) (increase(agentflow_worker_deadlettered_total[10m]))",
                                        "{{service}}")),
        panel("Handler errors per second", (f"sum by (service, reason) (rate(agentflow_errors_total[{RATE}]))",
                                            "{{service}} {{reason}}"), unit="ops"),
        panel("Stage latency p95", ("histogram_quantile(0.95, sum by (le, service) "
                                    f"(rate(agentflow_stage_latency_seconds_bucket[{RATE}])))", "{{service}}"), unit="s"),
        panel("Workers ready", ("min by (service) (agentflow_worker_ready)", "{{service}}")),
        panel("Trajectories finished per second by status",
              (f"sum by (status) (rate(agentflow_trajectories_total[{RATE}]))", "{{status}}"), unit="ops"),
        panel("Tool calls and errors per second",
              (f"sum by (tool) (rate(agentflow_tool_calls_total[{RATE}]))", "calls {{tool}}"),
              (f"sum by (tool, kind) (rate(agentflow_tool_errors_total[{RATE}]))", "errors {{tool}} {{kind}}"),
              unit="ops"),
    ]),
    "agentflow-serving": dashboard("agentflow-serving", "AgentFlow / Serving", [
        panel("Gateway calls per second by code",
              (f"sum by (grpc_method, grpc_code) (rate(agentflow_grpc_server_handled_total{{{GATEWAY}}}[{RATE}]))",
               "{{grpc_method}} {{grpc_code}}"), unit="reqps"),
        panel("Gateway latency p50 / p95",
              ("histogram_quantile(0.5, sum by (le, grpc_method) (rate(agentflow_grpc_server_handling_seconds_bucket"
               f"{{{GATEWAY}}}[{RATE}])))", "p50 {{grpc_method}}"),
              ("histogram_quantile(0.95, sum by (le, grpc_method) (rate(agentflow_grpc_server_handling_seconds_bucket"
               f"{{{GATEWAY}}}[{RATE}])))", "p95 {{grpc_method}}"), unit="s"),
        panel("Gateway calls in flight / auth failures",
              (f"sum(agentflow_grpc_server_in_flight{{{GATEWAY}}})", "in flight"),
              (f"sum(rate(agentflow_grpc_server_auth_failures_total[{RATE}]))", "auth failures / s")),
        panel("LLM requests per second by version and code",
              (f"sum by (version, code) (rate(agentflow_llm_requests_total[{RATE}]))", "{{version}} {{code}}"),
              unit="reqps"),
        panel("LLM tokens per second",
              (f"sum by (version) (rate(agentflow_llm_prompt_tokens_total[{RATE}]))", "in {{version}}"),
              (f"sum by (version) (rate(agentflow_llm_generation_tokens_total[{RATE}]))", "out {{version}}")),
        panel("LLM latency and time to first token p95",
              ("histogram_quantile(0.95, sum by (le, version) "
               f"(rate(agentflow_llm_request_duration_seconds_bucket[{RATE}])))", "request {{version}}"),
              ("histogram_quantile(0.95, sum by (le, version) "
               f"(rate(agentflow_llm_time_to_first_token_seconds_bucket[{RATE}])))", "first token {{version}}"),
              unit="s"),
        panel("LLM batch occupancy and queue",
              ("sum by (version) (agentflow_llm_batch_rows) / sum by (version) (agentflow_llm_batch_capacity)",
               "occupancy {{version}}"),
              ("sum by (version) (agentflow_llm_queue_length)", "queue {{version}}")),
        # vLLM's own metrics (the vLLM planner, KServe predictors), per served model name
        panel("vLLM time to first token p50 / p95",
              *[(f"histogram_quantile({q}, sum by (le, model_name) "
                 f"(rate(vllm:time_to_first_token_seconds_bucket[{RATE}])))", f"p{round(q * 100)} {{{{model_name}}}}")
                for q in (0.5, 0.95)], unit="s"),
        panel("vLLM inter-token latency and queue time p95",
              ("histogram_quantile(0.95, sum by (le, model_name) "
               f"(rate(vllm:inter_token_latency_seconds_bucket[{RATE}])))", "inter-token {{model_name}}"),
              ("histogram_quantile(0.95, sum by (le, model_name) "
               f"(rate(vllm:request_queue_time_seconds_bucket[{RATE}])))", "queue {{model_name}}"), unit="s"),
        panel("vLLM requests running / waiting",
              ("sum by (model_name) (vllm:num_requests_running)", "running {{model_name}}"),
              ("sum by (model_name) (vllm:num_requests_waiting)", "waiting {{model_name}}")),
        panel("vLLM KV-cache use (per pod)",
              ("max by (model_name, pod) (vllm:kv_cache_usage_perc)", "{{model_name}} {{pod}}"), unit="percentunit"),
        panel("vLLM tokens per second and request p95",
              (f"sum by (model_name) (rate(vllm:prompt_tokens_total[{RATE}]))", "in {{model_name}}"),
              (f"sum by (model_name) (rate(vllm:generation_tokens_total[{RATE}]))", "out {{model_name}}")),
        panel("vLLM request latency p95",
              ("histogram_quantile(0.95, sum by (le, model_name) "
               f"(rate(vllm:e2e_request_latency_seconds_bucket[{RATE}])))", "{{model_name}}"), unit="s"),
        # NVIDIA's DCGM exporter, where the cluster runs it (GPU Operator): empty otherwise
        panel("GPU utilisation (DCGM)", ("avg by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL)", "{{Hostname}} gpu {{gpu}}"),
              unit="percent"),
        panel("GPU memory used (DCGM)",
              ("sum by (Hostname, gpu) (DCGM_FI_DEV_FB_USED) * 1048576", "{{Hostname}} gpu {{gpu}}"), unit="bytes"),
    ]),
    "agentflow-training": dashboard("agentflow-training", "AgentFlow / Training", [
        panel("Reward (last step)", ("agentflow_trainer_reward_mean", "reward")),
        panel("KL to the reference", ("agentflow_trainer_kl", "kl")),
        panel("Clip fraction and entropy", ("agentflow_trainer_clip_fraction", "clip"),
              ("agentflow_trainer_entropy", "entropy")),
        panel("Gradient norm and loss", ("agentflow_trainer_grad_norm", "grad norm"),
              ("agentflow_trainer_loss", "loss")),
        panel("Tokens per second", ("agentflow_trainer_tokens_per_second", "tokens/s")),
        panel("Model FLOPs utilisation", ("agentflow_trainer_mfu", "MFU"), unit="percentunit"),
        panel("Peak memory (rank 0)", ("agentflow_trainer_peak_host_rss_gigabytes * 1e9", "host RSS"),
              ("agentflow_trainer_peak_device_memory_gigabytes * 1e9", "device"), unit="bytes"),
        panel("Steps by outcome", (f"sum by (outcome) (increase(agentflow_trainer_steps_total[1h]))",
                                   "{{outcome}}")),
        panel("Dropped by the batch builder", (f"sum by (reason) (increase(agentflow_trainer_dropped_total[1h]))",
                                               "{{reason}}")),
        panel("Consumer lag and time since the last step", ("agentflow_trainer_consumer_lag", "lag (records)"),
              ("time() - agentflow_trainer_last_step_timestamp_seconds", "since last step (s)")),
    ]),
    "agentflow-canaries": dashboard("agentflow-canaries", "AgentFlow / Canaries", [
        panel("Canary traffic percent", ("agentflow_rollout_canary_percent", "canary %"), unit="percent"),
        panel("Mean reward by source and version",
              (f"sum by (source, version) (rate(agentflow_trajectory_reward_sum[{RATE}])) / sum by (source, version) "
               f"(rate(agentflow_trajectory_reward_count[{RATE}]))", "{{source}} {{version}}")),
        panel("Trajectories per arm", ("agentflow_rollout_samples", "{{arm}}")),
        panel("Mean reward per arm", ('agentflow_rollout_arm_mean{metric="reward"}', "{{arm}}")),
        panel("Canary minus stable: bounds", ("agentflow_rollout_difference_bound", "{{metric}} {{bound}}")),
        panel("Decisions", ("sum by (action) (increase(agentflow_rollout_decisions_total[1h]))", "{{action}}")),
        panel("Backend errors", ("sum by (operation) (increase(agentflow_rollout_backend_errors_total[1h]))",
                                 "{{operation}}")),
    ]),
}


def render() -> dict[str, str]:
    return {f"{name}.json": json.dumps(board, indent=2) + "\n" for name, board in DASHBOARDS.items()}


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (OUT / name).write_text(text)
        print(OUT / name)
