"""The embedded broker, topic creation and the publisher/reader round trip, against a real tansu broker."""

import dataclasses
import socket

import pytest
from opentelemetry.sdk.trace import TracerProvider

from agentflow.bus import codec, topics
from agentflow.bus.broker import Broker, BrokerError, free_port, start_tansu
from agentflow.bus.clients import Publisher, TopicReader, wait_for_broker
from agentflow.bus.config import BusConfig
from agentflow.proto.v1 import events_pb2 as pb


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def test_tansu_starts_stops_and_comes_back_on_the_same_port(tmp_path):
    with start_tansu(log_dir=tmp_path) as broker:
        assert broker.bootstrap == f"127.0.0.1:{broker.port}" and broker.running
        config = BusConfig(bootstrap_servers=broker.bootstrap)
        assert wait_for_broker(config, timeout_s=60)
        broker.kill()
        assert not broker.running and not _accepts(broker.port)
        assert not wait_for_broker(config, timeout_s=0.5)
        broker.restart()
        assert broker.running and wait_for_broker(config, timeout_s=60)
        assert "tansu" in broker.log_tail()
    assert not broker.running


def test_a_broker_that_cannot_start_says_why(tmp_path):
    with pytest.raises(BrokerError, match="exited") as info:
        Broker(free_port(), storage="nonsense://x", log_dir=tmp_path).start(timeout_s=5)
    assert "nonsense" in str(info.value)  # the log tail names the problem


def test_ensure_topics_is_idempotent_and_uses_the_configured_partitions(bus_config):
    from kafka import KafkaAdminClient

    config = dataclasses.replace(bus_config, partitions=3)
    created = topics.ensure_topics(config)
    assert sorted(created) == sorted(config.topic(n) for n in topics.ALL)
    assert topics.ensure_topics(config) == []
    admin = KafkaAdminClient(**config.admin_options())
    try:
        described = admin.describe_topics([config.topic(n) for n in topics.ALL])
    finally:
        admin.close()
    assert {t["name"]: len(t["partitions"]) for t in described} == {config.topic(n): 3 for n in topics.ALL}


def test_publish_and_read_back_with_key_headers_and_trace_context(bus_config):
    tracer = TracerProvider().get_tracer("test")
    sent = [codec.new_envelope(f"traj-{i % 3}", i, pb.Query(query=f"q{i}")) for i in range(9)]
    with Publisher(bus_config) as publisher, TopicReader(bus_config, topics.QUERIES) as reader:
        with tracer.start_as_current_span("gateway.solve") as span:
            for envelope in sent:
                publisher.publish(topics.QUERIES, envelope, headers=[("origin", b"test")])
            publisher.send_raw(topics.QUERIES, b"\x00raw", key=b"k")
            publisher.flush()
        records = reader.read(10, timeout_s=60, settle_s=0.2)
    assert len(records) == 10
    raw = next(r for r in records if r.key == b"k")
    assert raw.value == b"\x00raw" and raw.headers == []
    envelopes = [r for r in records if r is not raw]
    assert sorted((r.envelope() for r in envelopes), key=lambda e: e.step) == sent
    for record in envelopes:
        assert record.key == record.envelope().trajectory_id.encode()
        assert record.header("origin") == b"test"
        context = codec.trace_context(record.headers)
        from opentelemetry import trace

        assert trace.get_current_span(context).get_span_context().trace_id == span.get_span_context().trace_id
    partitions = {}
    for record in envelopes:  # one trajectory, one partition, in order
        partitions.setdefault(record.key, set()).add(record.partition)
    assert all(len(p) == 1 for p in partitions.values())
