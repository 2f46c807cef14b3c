"""Prometheus collectors of the routing client (served by ``agentflow.telemetry.serve_metrics``) and of the LLM
server (on its own ``GET /metrics``)."""

from __future__ import annotations

import weakref

from agentflow.collectors import default_registry, process_collectors


class RoutingMetrics:
    def __init__(self, registry=None):
        from prometheus_client import Counter

        registry = default_registry(registry)
        self.tables = Counter("agentflow_routing_tables", "Routing tables received, by outcome (accepted, rejected: "
                                                          "invalid or naming an endpoint not allowed, stale)",
                              ["outcome"], registry=registry)
        self.calls = Counter("agentflow_routing_calls", "Planner calls by how their route was chosen (hash: a "
                                                        "trajectory's first call, trajectory: kept on its version, "
                                                        "pin, fleet: a pinned call on the rollout fleet, expired: "
                                                        "the table's controller stopped renewing it, fallback: no "
                                                        "table yet)", ["how"], registry=registry)
        self.fallbacks = Counter("agentflow_routing_stable_fallbacks", "Planner calls made again on the stable "
                                 "version after the call to another version's endpoint failed", registry=registry)
        self.mismatches = Counter("agentflow_routing_version_mismatches",
                                  "Calls whose server reported another version than the table named",
                                  registry=registry)


def routing_metrics() -> RoutingMetrics:
    return process_collectors(RoutingMetrics)


class ServerMetrics:
    """`serve-llm`'s collectors, per served version: chat requests by status code, tokens, latency, time to the
    first token, and (at scrape time) each engine's batch rows, capacity and queue."""

    def __init__(self, registry=None):
        from prometheus_client import Counter, Histogram

        registry = default_registry(registry)
        seconds = (.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300)
        self.requests = Counter("agentflow_llm_requests", "Chat completion requests by served version and HTTP "
                                "status (499: the client went away first)", ["version", "code"], registry=registry)
        self.prompt_tokens = Counter("agentflow_llm_prompt_tokens", "Prompt tokens of answered chat requests",
                                     ["version"], registry=registry)
        self.generation_tokens = Counter("agentflow_llm_generation_tokens", "Tokens generated for answered chat "
                                         "requests", ["version"], registry=registry)
        self.request_seconds = Histogram("agentflow_llm_request_duration_seconds", "Time from a chat request's "
                                         "arrival to its answer or error", ["version"], buckets=seconds,
                                         registry=registry)
        self.first_token_seconds = Histogram("agentflow_llm_time_to_first_token_seconds", "Time from a chat "
                                             "request's arrival at the engine to its first token (queue and "
                                             "prefill)", ["version"], buckets=seconds, registry=registry)
        self.served: weakref.WeakSet = weakref.WeakSet()  # the Versions of each live server, read at scrape
        registry.register(_EngineLoad(self.served))

    def observe(self, version: str, code: int, seconds: float, completion=None) -> None:
        self.requests.labels(version, str(code)).inc()
        self.request_seconds.labels(version).observe(seconds)
        if completion is not None:
            self.prompt_tokens.labels(version).inc(len(completion.prompt_token_ids))
            self.generation_tokens.labels(version).inc(len(completion.token_ids))
            if completion.first_token_s > 0:
                self.first_token_seconds.labels(version).observe(completion.first_token_s)


class _EngineLoad:
    """Batch rows, capacity and queue length of every loaded version whose engine reports its ``load()``."""

    def __init__(self, served):
        self.served = served

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        families = {key: GaugeMetricFamily(f"agentflow_llm_{name}", text, labels=["version"]) for key, name, text in (
            ("running", "batch_rows", "Sequences decoding together now"),
            ("capacity", "batch_capacity", "Sequences a batch may hold (divide batch_rows by it for occupancy)"),
            ("waiting", "queue_length", "Requests waiting for a batch slot"))}
        for versions in list(self.served):
            for name, engine in versions.engines().items():
                load = getattr(engine, "load", None)
                if load is None:
                    continue
                values = load()
                for key, family in families.items():
                    family.add_metric([name], values[key])
        yield from families.values()


def server_metrics() -> ServerMetrics:
    return process_collectors(ServerMetrics)
