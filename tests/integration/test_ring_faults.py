"""Poison records against the running ring (tansu, the LLM server and the six services, as `agentflow up` starts
them): an oversized (5 MB) and a malformed record on every input topic, and queries written to `queries` directly
that break the gateway's limits. Normal queries must still be answered, and each poison record must cost exactly
one dead letter (bounded in size), never a loop."""

from __future__ import annotations

import math
import time
from collections import Counter

import pytest
from kafka import KafkaProducer

from agentflow.bus import codec, topics
from agentflow.bus.clients import TopicReader
from agentflow.bus.config import BusConfig
from agentflow.proto.v1 import events_pb2
from agentflow.services.cluster import start_cluster

from test_ring import solve_all, trajectories_for

pytestmark = [pytest.mark.faults, pytest.mark.slow]
RING_ENV = {"AGENTFLOW_LOOP_MAX_STEPS": "2", "AGENTFLOW_LOOP_MAX_TIME_S": "600", "AGENTFLOW_RPC_MAX_WORKERS": "32",
            "AGENTFLOW_GATEWAY_API_KEYS": "test-key"}
# every topic a ring worker consumes (memory: queries, verdicts, answers, feedback; planner: memory.updated; ...)
INPUTS = (topics.QUERIES, topics.MEMORY_UPDATED, topics.PLANS, topics.EXECUTIONS, topics.VERDICTS, topics.FINALIZE,
          topics.ANSWERS, topics.FEEDBACK)
BIG = 5 * 1024 * 1024


@pytest.fixture(scope="module")
def cluster(tiny_model_dir, tmp_path_factory):
    c = start_cluster(log_dir=tmp_path_factory.mktemp("ring-fault-logs"), model=str(tiny_model_dir), env=RING_ENV,
                      progress=lambda *_: None)
    yield c
    c.stop()


def test_poison_on_every_input_topic_costs_one_dead_letter_and_the_ring_keeps_answering(cluster):
    bus = BusConfig(bootstrap_servers=cluster.bootstrap)
    # An attacker's producer, not ours: its request limit raised so that it can write 5 MB (tansu accepts it).
    producer = KafkaProducer(bootstrap_servers=bus.servers(), max_request_size=2 * BIG, acks="all")
    poison = {}
    for topic in INPUTS:
        big = codec.encode(codec.new_envelope(f"big-{topic}", 0, events_pb2.Query(query="x" * BIG)))
        for key, value in ((f"big-{topic}", big), (f"bad-{topic}", b"\xff\x00 not an envelope")):
            producer.send(bus.topic(topic), value=value, key=key.encode()).get(30)
            poison[key] = len(value)
    # queries that skip the gateway's checks: a NaN budget, a huge step count, an empty text
    injected = {"nan-budget": events_pb2.QueryOptions(max_time_s=math.nan),
                "many-steps": events_pb2.QueryOptions(max_steps=2**31 - 1), "empty": None}
    for tid, options in injected.items():
        event = events_pb2.Query(query="" if tid == "empty" else "what is 1 + 1?", options=options)
        producer.send(bus.topic(topics.QUERIES), value=codec.encode(codec.new_envelope(tid, 0, event)),
                      key=tid.encode()).get(30)
    producer.close()

    started = time.monotonic()
    responses = solve_all(cluster, 12, "after-poison")
    answered = [r for r in responses if r.status in ("answered", "max_steps", "timeout")]
    print(f"\n{len(answered)}/12 queries answered after the poison, in {time.monotonic() - started:.1f} s")
    assert len(answered) == 12

    refused = {e.trajectory_id: e.trajectory for e in trajectories_for(cluster, set(injected))}
    assert set(refused) == set(injected)
    assert all(t.status == "error" and t.error.startswith("invalid_input:") for t in refused.values()), refused
    assert "max_time_s" in refused["nan-budget"].error and "max_steps" in refused["many-steps"].error

    with TopicReader(bus, topics.DEADLETTER) as reader:
        deadline = time.monotonic() + 60
        while not set(poison) <= {r.key.decode() for r in reader.records} and time.monotonic() < deadline:
            reader.poll(0.2)
        reader.read(0, settle_s=3.0)  # catch a repeated letter
        letters = [(r.key.decode(), r.envelope().dead_letter, len(r.value)) for r in reader.records]
    counts = Counter(key for key, _, _ in letters)
    assert {key: counts[key] for key in poison} == dict.fromkeys(poison, 1)  # each exactly once: no loop
    for key, dead, size in letters:
        if key.startswith("big-"):
            assert dead.value_truncated and dead.value_size == poison[key] and len(dead.value) == 64 * 1024
            assert dead.error.startswith("RecordTooLarge") and size < 100_000
        elif key.startswith("bad-"):
            assert not dead.value_truncated and dead.value == b"\xff\x00 not an envelope"
