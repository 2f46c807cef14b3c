"""One query through the real ring is one trace: every service exports its spans over OTLP to a real receiver
(oteltest's gRPC sink, in this process), and the span tree crosses gRPC (gateway) and Kafka (every hop after it).

The cluster is what `agentflow up` starts (tansu, the LLM server on the tiny model, six service processes), with the
standard OTEL_* variables pointing the services' exporters at the receiver.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass

import grpc
import pytest

pytest.importorskip("oteltest")
from oteltest.sink import GrpcSink  # noqa: E402
from oteltest.sink.handler import RequestHandler  # noqa: E402

from agentflow.cluster import start_cluster  # noqa: E402
from agentflow.proto.v1 import gateway_pb2, gateway_pb2_grpc  # noqa: E402

pytestmark = pytest.mark.slow

SERVICES = ("gateway", "memory", "planner", "executor", "verifier", "generator")
SPAN_KIND_SERVER, SPAN_KIND_CONSUMER = 2, 5  # opentelemetry.proto.trace.v1.Span.SpanKind
OTEL_VARS_TO_CLEAR = ("OTEL_SERVICE_NAME", "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_TRACES_SAMPLER",
                      "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict


class SpanCollector(RequestHandler):
    """Keeps every span the sink receives, flattened, with its resource's service.name."""

    def __init__(self):
        self.spans: list[Span] = []
        self.lock = threading.Lock()

    def handle_trace(self, request, headers):  # noqa: ARG002
        received = []
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    received.append(Span(service, s.name, s.kind, s.trace_id.hex(), s.span_id.hex(),
                                         s.parent_span_id.hex(), _attributes(s.attributes)))
        with self.lock:
            self.spans.extend(received)

    def handle_metrics(self, request, headers):  # noqa: ARG002
        pass

    def handle_logs(self, request, headers):  # noqa: ARG002
        pass

    def snapshot(self) -> list[Span]:
        with self.lock:
            return list(self.spans)


def _attributes(key_values) -> dict:
    out = {}
    for kv in key_values:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def receiver():
    collector = SpanCollector()
    sink = GrpcSink(collector, logging.getLogger("otlp-sink"), port=_free_port())
    sink.start()
    yield collector, sink.port
    sink.stop()


@pytest.fixture(scope="module")
def traced_cluster(receiver, tiny_model_dir, tmp_path_factory):
    _collector, port = receiver
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
           "OTEL_BSP_SCHEDULE_DELAY": "200", "AGENTFLOW_LOOP_MAX_STEPS": "2", "AGENTFLOW_LOOP_MAX_TIME_S": "60"}
    with pytest.MonkeyPatch.context() as mp:
        for name in OTEL_VARS_TO_CLEAR:  # the children inherit this process's environment
            mp.delenv(name, raising=False)
        cluster = start_cluster(log_dir=tmp_path_factory.mktemp("tracing-logs"), model=str(tiny_model_dir),
                                env=env, progress=lambda *_: None)
    yield cluster
    cluster.stop()


def wait_for_spans(collector: SpanCollector, trace_id: str, timeout_s: float = 30.0) -> list[Span]:
    """The trace's spans, once every service's share (generator's last) has been exported."""
    deadline = time.monotonic() + timeout_s
    while True:
        spans = [s for s in collector.snapshot() if s.trace_id == trace_id]
        names = {s.name for s in spans}
        services = {s.service for s in spans}
        complete = ({f"agentflow-{n}" for n in SERVICES} <= services and "generator.generate" in names
                    and "process answers" in names)
        if complete or time.monotonic() > deadline:
            time.sleep(0.5)  # a last batch in flight
            return [s for s in collector.snapshot() if s.trace_id == trace_id]
        time.sleep(0.2)


def test_one_query_is_one_trace_across_every_service(receiver, traced_cluster):
    collector, _port = receiver
    with grpc.insecure_channel(traced_cluster.endpoint("gateway")) as ch:
        response = gateway_pb2_grpc.AgentFlowStub(ch).Solve(gateway_pb2.SolveRequest(query="What is 17 + 25?"),
                                                            timeout=90)
    trace_id = response.trajectory.trace_id
    assert len(trace_id) == 32 and int(trace_id, 16) != 0, "the trajectory record carries no trace id"
    spans = wait_for_spans(collector, trace_id)
    everything = collector.snapshot()
    by_id = {s.span_id: s for s in everything}

    def ancestors(span: Span) -> list[Span]:
        chain = []
        while span.parent_id:
            assert span.parent_id in by_id, f"{span.service}/{span.name}: parent {span.parent_id} was never exported"
            span = by_id[span.parent_id]
            chain.append(span)
        return chain

    def only(service: str, name: str) -> list[Span]:
        found = [s for s in spans if s.service == f"agentflow-{service}" and s.name == name]
        assert found, f"no {name!r} span from {service}; got {sorted({(s.service, s.name) for s in spans})}"
        return found

    def consumer_of(span: Span) -> Span:
        """The nearest CONSUMER span above ``span`` in its own process."""
        for a in ancestors(span):
            if a.kind == SPAN_KIND_CONSUMER and a.service == span.service:
                return a
        raise AssertionError(f"{span.service}/{span.name} is not inside a consumer span")

    # one trace for the whole query: everything exported belongs to it, and the record names it
    assert {s.trace_id for s in everything} == {trace_id}, "spans outside the query's trace were exported"
    assert {s.service for s in spans} >= {f"agentflow-{n}" for n in SERVICES}
    assert not [s.name for s in everything if "grpc.health.v1" in s.name], "health checks were traced"

    # the root: the gateway's server span for Solve
    (root,) = [s for s in spans if not s.parent_id]
    assert root.service == "agentflow-gateway" and root.kind == SPAN_KIND_SERVER and root.name.endswith("/Solve")

    # across Kafka: memory consumes the gateway's query, the planner the memory's update (per step)
    turns = len(response.trajectory.turns)
    assert turns >= 1
    planner_consumers = only("planner", "process memory.updated")
    assert len(planner_consumers) == turns
    for consumer in planner_consumers:
        chain = ancestors(consumer)
        assert chain[-1] == root, "the planner's span does not descend from the gateway's server span"
        assert chain[0].service == "agentflow-memory" and chain[0].kind == SPAN_KIND_CONSUMER
    assert [s.parent_id for s in only("memory", "process queries")] == [root.span_id]

    # the planner's LLM call under its consumer span, one per step
    plans = only("planner", "planner.plan")
    assert sorted(p.attributes.get("agentflow.step") for p in plans) == list(range(turns))
    for p in plans:
        assert consumer_of(p) in planner_consumers and p.parent_id == consumer_of(p).span_id

    # the tool under executor.execute, inside the executor's consumer span
    executes = only("executor", "executor.execute")
    tools = [s for s in spans if s.service == "agentflow-executor" and s.name.startswith("tool.")]
    assert tools, "no tool span"
    execute_ids = {e.span_id for e in executes}
    for tool in tools:
        assert tool.parent_id in execute_ids
        assert tool.name == f"tool.{by_id[tool.parent_id].attributes['agentflow.tool']}"
    for e in executes:
        assert consumer_of(e).name == "process plans"

    # verifier and generator, each inside its own consumer span and under the gateway's root
    for service, name, topic in (("verifier", "verifier.verify", "executions"),
                                 ("generator", "generator.generate", "finalize")):
        for s in only(service, name):
            assert consumer_of(s).name == f"process {topic}"
            assert ancestors(s)[-1] == root

    # the record the memory service built carries the same trace id (checked above via the response)
    assert response.trajectory.trajectory_id == response.trajectory_id
