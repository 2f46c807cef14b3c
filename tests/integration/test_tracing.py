"""One query through the real ring is one trace: every service exports its spans over OTLP to a real receiver
(oteltest's gRPC sink, in this process), and the span tree crosses gRPC (gateway) and Kafka (every hop after it).

The cluster is what `agentflow up` starts (tansu and six service processes) with the standard OTEL_* variables
pointing the services' exporters at the receiver. The LLM endpoint is the project's OpenAI-compatible server over a
scripted engine, so every step reliably plans a tool call (the random tiny model's plans do not parse) and the
whole tree, tool span included, is there in a few seconds.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from agentflow.children import spawn_tied

pytest.importorskip("oteltest")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from agentflow.services.cluster import start_cluster  # noqa: E402
from agentflow.llm.scripted import ScriptedEngine  # noqa: E402
from agentflow.llm.server import make_server, serve_in_background  # noqa: E402
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


# The receiver runs in its own process: a gRPC server's threads in this one would make the fork that starts tansu
# (subprocess with preexec_fn) abort in gRPC's fork handler. It appends each ExportTraceServiceRequest it gets to a
# file, length-prefixed; the test reads them back.
RECEIVER = r"""
import logging, socket, struct, sys, threading
from oteltest.sink import GrpcSink
from oteltest.sink.handler import RequestHandler

out, lock = open(sys.argv[1], "ab", buffering=0), threading.Lock()

class Dump(RequestHandler):
    def handle_trace(self, request, headers):
        data = request.SerializeToString()
        with lock:
            out.write(struct.pack(">I", len(data)) + data)
    def handle_metrics(self, request, headers): pass
    def handle_logs(self, request, headers): pass

probe = socket.socket()
probe.bind(("127.0.0.1", 0))
port = probe.getsockname()[1]
probe.close()
sink = GrpcSink(Dump(), logging.getLogger("otlp-receiver"), port=port)
sink.start()
print(port, flush=True)
sink.wait_for_termination()
"""


class SpanCollector:
    """Every span the receiver has written so far, flattened, with its resource's service.name."""

    def __init__(self, path: Path):
        self.path = path

    def snapshot(self) -> list[Span]:
        data = self.path.read_bytes() if self.path.exists() else b""
        spans, at = [], 0
        while at + 4 <= len(data):
            (size,) = struct.unpack(">I", data[at:at + 4])
            if at + 4 + size > len(data):
                break  # a request still being written
            request = ExportTraceServiceRequest.FromString(data[at + 4:at + 4 + size])
            at += 4 + size
            for resource_spans in request.resource_spans:
                service = _attributes(resource_spans.resource.attributes).get("service.name", "")
                for scope_spans in resource_spans.scope_spans:
                    for s in scope_spans.spans:
                        spans.append(Span(service, s.name, s.kind, s.trace_id.hex(), s.span_id.hex(),
                                          s.parent_span_id.hex(), _attributes(s.attributes)))
        return spans


def _attributes(key_values) -> dict:
    out = {}
    for kv in key_values:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out


REPLIES = {  # prompt marker (agentflow/prompts/*.md) -> the module's reply
    "Analyse the question": "Add the two numbers with python.",
    "Choose the next step": "Context: none\nSub-Goal: add 17 and 25\nTool Name: python",
    "Write the input": "```python\nprint(17 + 25)\n```",
    "Is this enough": "Analysis: the tool printed 42\nConclusion: STOP",
    "Answer the question": "17 plus 25 is 42.\nAnswer: 42",
}


def scripted_reply(messages) -> str:
    prompt = messages[-1]["content"]
    return next((reply for marker, reply in REPLIES.items() if marker in prompt), "Answer: 42")


@pytest.fixture(scope="module")
def receiver(tmp_path_factory):
    path = tmp_path_factory.mktemp("otlp") / "traces.bin"
    process = spawn_tied([sys.executable, "-c", RECEIVER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(process.stdout.readline() or 0)
        assert port, f"the OTLP receiver did not start (exit code {process.poll()})"
        yield SpanCollector(path), port
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="module")
def llm_url():
    server = make_server(ScriptedEngine(scripted_reply), "agentflow", "scripted")
    serve_in_background(server)
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


@pytest.fixture(scope="module")
def traced_cluster(receiver, llm_url, tmp_path_factory):
    _collector, port = receiver
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
           "OTEL_BSP_SCHEDULE_DELAY": "200", "AGENTFLOW_LOOP_MAX_STEPS": "2", "AGENTFLOW_LOOP_MAX_TIME_S": "60"}
    with pytest.MonkeyPatch.context() as mp:
        for name in OTEL_VARS_TO_CLEAR:  # the children inherit this process's environment
            mp.delenv(name, raising=False)
        cluster = start_cluster(log_dir=tmp_path_factory.mktemp("tracing-logs"), llm_url=llm_url, env=env,
                                progress=lambda *_: None)
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
    assert response.status == "answered" and response.trajectory.turns[0].result.strip() == "42", response
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

    # the planner's LLM calls under its consumer span: the plan at every step, the analysis at the first
    plans = only("planner", "planner.plan")
    assert sorted(p.attributes.get("agentflow.step") for p in plans) == list(range(turns))
    for p in plans + only("planner", "planner.analyze"):
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
