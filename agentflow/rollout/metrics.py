"""The rollout controller's Prometheus collectors (served by ``agentflow.telemetry.serve_metrics``)."""

from __future__ import annotations

from agentflow.collectors import default_registry, process_collectors


class RolloutMetrics:
    def __init__(self, registry=None):
        from prometheus_client import Counter, Gauge, Histogram

        registry = default_registry(registry)
        self.decisions = Counter("agentflow_rollout_decisions", "Rollout decisions by action",
                                 ["action"], registry=registry)
        self.canary_percent = Gauge("agentflow_rollout_canary_percent",
                                    "Traffic percent on the canary version (0: no canary)", registry=registry)
        self.samples = Gauge("agentflow_rollout_samples", "Trajectories counted per arm in the current canary",
                             ["arm"], registry=registry)
        self.rewarded = Gauge("agentflow_rollout_rewarded_samples", "Trajectories with a reward of reward_source per "
                              "arm in the current canary (none while samples grow: an arm nothing rewards)", ["arm"],
                              registry=registry)
        self.arm_mean = Gauge("agentflow_rollout_arm_mean",
                              "Mean per arm and metric (reward, error_rate, latency in seconds)", ["arm", "metric"],
                              registry=registry)
        self.difference = Gauge("agentflow_rollout_difference_bound",
                                "Always-valid bounds on canary minus stable (latency: canary - ratio * stable, s)",
                                ["metric", "bound"], registry=registry)
        self.trajectories = Counter("agentflow_rollout_trajectories",
                                    "Trajectories read, by arm (canary, stable, other, unversioned, mixed, early, "
                                    "idle, duplicate, late_reward)", ["arm"], registry=registry)
        self.tripwire = Gauge("agentflow_rollout_tripwire",
                              "Each tripwire's statistic in the current canary, what its bound applies to (canary "
                              "minus stable rate; answer_length: length ratio; answer_divergence: total variation)",
                              ["tripwire"], registry=registry)
        self.tripped = Counter("agentflow_rollout_tripwire_rollbacks",
                               "Rollbacks by the tripwire that fired (one rollback may count for several)",
                               ["tripwire"], registry=registry)
        self.fleet_load = Histogram("agentflow_rollout_fleet_load_seconds", "Seconds from a version's publication "
                                    "to loaded on the rollout fleet", registry=registry,
                                    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800))
        self.fleet_versions = Gauge("agentflow_rollout_fleet_versions", "Planner versions loaded on the rollout "
                                    "fleet", registry=registry)
        self.backend_errors = Counter("agentflow_rollout_backend_errors", "Failed backend operations",
                                      ["operation"], registry=registry)


def rollout_metrics() -> RolloutMetrics:
    return process_collectors(RolloutMetrics)
