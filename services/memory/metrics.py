"""What finished trajectories say, for Prometheus: the memory service sees every one close (and every reward
joined later), so it counts them. Versions are the planner version that served the trajectory (a few live at a
time: stable and canary)."""

from __future__ import annotations

from agentflow.collectors import default_registry, process_collectors


class TrajectoryMetrics:
    def __init__(self, registry=None):
        from prometheus_client import Counter, Histogram

        registry = default_registry(registry)
        self.finished = Counter("agentflow_trajectories", "Trajectories finished, by status (answered, max_steps, "
                                "timeout, error, cancelled, ...) and planner version", ["status", "version"],
                                registry=registry)
        self.turns = Histogram("agentflow_trajectory_turns", "Planner turns per finished trajectory", ["version"],
                               buckets=(0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20), registry=registry)
        self.seconds = Histogram("agentflow_trajectory_duration_seconds", "Time from a query's start to its "
                                 "finished record", ["version"], buckets=(1, 2.5, 5, 10, 30, 60, 120, 300, 600),
                                 registry=registry)
        self.tool_calls = Counter("agentflow_tool_calls", "Tool calls in finished trajectories, by tool", ["tool"],
                                  registry=registry)
        self.tool_errors = Counter("agentflow_tool_errors", "Tool calls that failed, by tool and kind (timeout, "
                                   "runtime_error, ...)", ["tool", "kind"], registry=registry)
        self.rewards = Histogram("agentflow_trajectory_reward", "Rewards on trajectories (the rule reward at the "
                                 "end, feedback and judge verdicts as they join), by source and planner version",
                                 ["source", "version"], buckets=(0, .25, .5, .75, 1), registry=registry)
        self.feedback_dropped = Counter("agentflow_feedback_dropped", "Feedback dropped because its trajectory's "
                                        "record had gone out again max_feedback_emits times", registry=registry)

    def finished_record(self, record: dict, version: str) -> None:
        """A trajectory closed: its status, turns, duration, tool calls and its rewards so far."""
        turns = record.get("turns") or []
        self.finished.labels(record.get("status") or "unknown", version).inc()
        self.turns.labels(version).observe(len(turns))
        self.seconds.labels(version).observe((record.get("totals") or {}).get("latency_s", 0.0))
        for turn in turns:
            tool = (turn.get("decision") or {}).get("tool") or ""
            if not tool or turn.get("parse_error"):
                continue
            self.tool_calls.labels(tool).inc()
            if turn.get("tool_error"):
                self.tool_errors.labels(tool, turn["tool_error"].split(":", 1)[0].strip()[:40] or "error").inc()
        for reward in record.get("rewards") or []:
            self.reward(reward.get("source", ""), reward.get("value", 0.0), version)

    def reward(self, source: str, value: float, version: str) -> None:
        self.rewards.labels(source or "unknown", version).observe(value)


def trajectory_metrics() -> TrajectoryMetrics:
    return process_collectors(TrajectoryMetrics)
