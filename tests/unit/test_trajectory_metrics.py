"""The memory service's trajectory metrics from a hand-made finished record (a fresh registry)."""

from prometheus_client import CollectorRegistry

from agentflow.services.memory.metrics import TrajectoryMetrics


def test_a_finished_record_counts_status_turns_tools_errors_and_rewards():
    registry = CollectorRegistry()
    m = TrajectoryMetrics(registry)
    record = {"status": "answered", "totals": {"latency_s": 3.5}, "rewards": [{"source": "rule", "value": 1.0}],
              "turns": [{"decision": {"tool": "python"}, "tool_error": "runtime_error: ZeroDivisionError"},
                        {"decision": {"tool": "python"}, "tool_error": ""},
                        {"decision": {"tool": "search"}, "tool_error": "timeout: 10 s"},
                        {"decision": None, "parse_error": "no tool named"}]}
    m.finished_record(record, "v000003")
    m.reward("human", 0.0, "v000003")

    def value(name, **labels):
        return registry.get_sample_value(name, labels)

    assert value("agentflow_trajectories_total", status="answered", version="v000003") == 1
    assert value("agentflow_trajectory_turns_sum", version="v000003") == 4
    assert value("agentflow_trajectory_duration_seconds_sum", version="v000003") == 3.5
    assert value("agentflow_tool_calls_total", tool="python") == 2 and value("agentflow_tool_calls_total",
                                                                             tool="search") == 1
    assert value("agentflow_tool_errors_total", tool="python", kind="runtime_error") == 1
    assert value("agentflow_tool_errors_total", tool="search", kind="timeout") == 1
    assert value("agentflow_trajectory_reward_sum", source="rule", version="v000003") == 1.0
    assert value("agentflow_trajectory_reward_count", source="human", version="v000003") == 1
