"""The routing client's Prometheus collectors (served by ``agentflow.telemetry.serve_metrics``)."""

from __future__ import annotations


class RoutingMetrics:
    def __init__(self, registry=None):
        from prometheus_client import REGISTRY, Counter

        registry = REGISTRY if registry is None else registry
        self.tables = Counter("agentflow_routing_tables", "Routing tables received, by outcome (accepted, rejected: "
                                                          "invalid or naming an endpoint not allowed, stale)",
                              ["outcome"], registry=registry)
        self.calls = Counter("agentflow_routing_calls", "Planner calls by how their route was chosen (hash: a "
                                                        "trajectory's first call, trajectory: kept on its version, "
                                                        "pin, fallback: no table yet)", ["how"], registry=registry)
        self.mismatches = Counter("agentflow_routing_version_mismatches",
                                  "Calls whose server reported another version than the table named",
                                  registry=registry)


_metrics: RoutingMetrics | None = None


def routing_metrics() -> RoutingMetrics:
    """The process-wide collectors (created on first use, in the default registry)."""
    global _metrics
    if _metrics is None:
        _metrics = RoutingMetrics()
    return _metrics
