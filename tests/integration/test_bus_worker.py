"""The worker loop against a real tansu broker: tracing across a hop, a two-stage pipeline, graceful stop."""

import statistics
import threading
import time
from collections import Counter, defaultdict

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentflow.bus import codec, topics
from agentflow.bus.clients import Publisher, TopicReader
from agentflow.bus.worker import Worker
from agentflow.proto.v1 import trajectory_pb2 as tpb
from agentflow.proto.v1 import events_pb2 as pb

READY_S = 120  # a budget: tansu holds a new group's first join for ~3 s idle, far longer on a loaded machine


def _plan(envelope):
    plan = pb.Plan(turn=tpb.Turn(step=envelope.step))
    return [(topics.PLANS, codec.new_envelope(envelope.trajectory_id, envelope.step, plan))]


def _execute(envelope):
    return [(topics.EXECUTIONS, codec.new_envelope(envelope.trajectory_id, envelope.step,
                                                   pb.Execution(turn=envelope.plan.turn)))]


def test_processing_span_continues_the_producers_trace(bus_config):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen = {}

    def handle(envelope):
        span = trace.get_current_span()
        seen["recording"] = span.is_recording()
        seen["context"] = span.get_span_context()
        return _plan(envelope)

    with Worker("planner", bus_config, [topics.QUERIES], handle, tracer=provider.get_tracer("bus")) as worker, \
            Publisher(bus_config) as publisher, TopicReader(bus_config, topics.PLANS) as reader:
        assert worker.wait_ready(READY_S)
        with provider.get_tracer("test").start_as_current_span("gateway.solve") as root:
            publisher.publish(topics.QUERIES, codec.new_envelope("traj-t", 0, pb.Query(query="q")))
            publisher.flush()
        [out] = reader.read(1, timeout_s=60)
    root_context = root.get_span_context()
    assert seen["recording"] and seen["context"].trace_id == root_context.trace_id
    [span] = [s for s in exporter.get_finished_spans() if s.kind == trace.SpanKind.CONSUMER]
    assert span.parent.span_id == root_context.span_id and span.context == seen["context"]
    assert span.name == f"process {bus_config.topic(topics.QUERIES)}"
    assert span.attributes["messaging.message.id"] == "traj-t:0:query"
    assert span.attributes["agentflow.trajectory_id"] == "traj-t"
    # the output carries the processing span as its parent: the next hop continues the same trace
    downstream = trace.get_current_span(codec.trace_context(out.headers)).get_span_context()
    assert (downstream.trace_id, downstream.span_id) == (root_context.trace_id, span.context.span_id)


def test_two_stage_pipeline_delivers_each_event_once_in_order_per_trajectory(bus_config):
    trajectories, steps = 10, 5
    with Worker("planner", bus_config, [topics.QUERIES], _plan) as planner, \
            Worker("executor", bus_config, [topics.PLANS], _execute, concurrency=4) as executor, \
            Publisher(bus_config) as publisher, TopicReader(bus_config, topics.EXECUTIONS) as reader:
        assert planner.wait_ready(READY_S) and executor.wait_ready(READY_S)
        for step in range(steps):
            for t in range(trajectories):
                publisher.publish(topics.QUERIES, codec.new_envelope(f"traj-{t}", step, pb.Query(query=f"{t}/{step}")))
        publisher.flush()
        records = reader.read(trajectories * steps, timeout_s=120, settle_s=0.5)

        # per-hop latency, one event at a time (queries -> plans -> executions)
        hops = []
        for i in range(20):
            sent = codec.new_envelope(f"probe-{i}", 0, pb.Query(query="probe"))
            publisher.publish(topics.QUERIES, sent).get(5)
            arrived = []
            while not arrived:
                arrived = [r.envelope() for r in reader.poll(0.05) if r.key == sent.trajectory_id.encode()]
            hops.append((arrived[0].produced_at_unix_ms - sent.produced_at_unix_ms) / 2)
        print(f"per-hop latency on tansu: p50 {statistics.median(hops):.1f} ms, max {max(hops):.1f} ms")
        assert planner.metrics()["records_processed"] == executor.metrics()["records_processed"] == 70

    envelopes = [r.envelope() for r in records]
    counts = Counter(e.event_id for e in envelopes)
    assert len(counts) == trajectories * steps and set(counts.values()) == {1}, "each event exactly once"
    by_trajectory = defaultdict(list)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        by_trajectory[record.key].append(record.envelope().step)
    assert all(s == list(range(steps)) for s in by_trajectory.values()), by_trajectory
    assert all(e.execution.turn.step == e.step for e in envelopes)
    assert statistics.median(hops) < 50, hops  # ~5 ms here; a fetch_max_wait of 500 ms would make it ~125


def test_graceful_stop_finishes_the_record_in_hand_and_commits(bus_config):
    started = threading.Event()

    def slow_at_the_end(envelope):
        if envelope.query.query == "slow":
            started.set()
            time.sleep(0.5)
        return _plan(envelope)

    with Publisher(bus_config) as publisher, TopicReader(bus_config, topics.PLANS) as reader:
        first = Worker("planner", bus_config, [topics.QUERIES], slow_at_the_end).start()
        assert first.wait_ready(READY_S)
        for i in range(10):
            publisher.publish(topics.QUERIES, codec.new_envelope(f"traj-{i}", 0, pb.Query(query="fast")))
        publisher.flush()
        reader.read(10, timeout_s=10)
        publisher.publish(topics.QUERIES, codec.new_envelope("traj-slow", 0, pb.Query(query="slow"))).get(5)
        assert started.wait(10)
        first.stop()  # what the SIGTERM handler calls, while the slow record is in hand
        assert not first.ready.is_set()
        assert first.join(10)
        assert len(reader.read(11, timeout_s=60)) == 11, "the record in hand was finished"

        handled = []
        second = Worker("planner", bus_config, [topics.QUERIES], lambda e: handled.append(e.trajectory_id))
        with second:
            assert second.wait_ready(READY_S)
            for i in range(3):
                publisher.publish(topics.QUERIES, codec.new_envelope(f"later-{i}", 0, pb.Query(query="fast")))
            publisher.flush()
            deadline = time.monotonic() + 10
            while len(handled) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)
    assert sorted(handled) == ["later-0", "later-1", "later-2"], "nothing committed was processed again"
