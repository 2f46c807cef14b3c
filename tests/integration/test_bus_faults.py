"""Failure handling against a real tansu broker: poison records, retries, dead letters, a worker killed with
SIGKILL, and a broker that is not there yet when the worker starts."""

import dataclasses
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict

import pytest

from agentflow.bus import codec, topics
from agentflow.bus.broker import Broker, free_port
from agentflow.bus.clients import Publisher, TopicReader
from agentflow.bus.config import BusConfig
from agentflow.bus.worker import Retryable, Worker
from agentflow.proto.v1 import events_pb2 as pb

READY_S = 120  # a budget, not a target: ready comes in about a second on an idle machine, minutes on a loaded one
_ids = itertools.count()


class Faulty:
    """A handler whose behaviour the query text picks: ok, flaky (two retryable failures), down, bug."""

    def __init__(self):
        self.calls = Counter()
        self.lock = threading.Lock()

    def __call__(self, envelope):
        with self.lock:
            self.calls[envelope.trajectory_id] += 1
            calls = self.calls[envelope.trajectory_id]
        kind = envelope.query.query
        if kind == "flaky" and calls <= 2 or kind == "down":
            raise Retryable(f"{kind}: attempt {calls}")
        if kind == "bug":
            raise ValueError("a bug in the handler")
        return [(topics.PLANS, codec.new_envelope(envelope.trajectory_id, envelope.step, pb.Plan()))]


@pytest.fixture(scope="module")
def faulty(broker):
    """One running worker with the Faulty handler, shared by the tests of this module (one group join)."""
    config = BusConfig(bootstrap_servers=broker.bootstrap, topic_prefix=f"faults{os.getpid()}.", retry_backoff_ms=20)
    handler = Faulty()
    with Worker("faulty", config, [topics.QUERIES], handler) as worker, Publisher(config) as publisher, \
            TopicReader(config, topics.PLANS) as outputs, TopicReader(config, topics.DEADLETTER) as letters:
        assert worker.wait_ready(READY_S)
        yield config, worker, handler, publisher, outputs, letters


def _send(publisher, kind: str) -> str:
    tid = f"{kind}-{next(_ids)}"
    publisher.publish(topics.QUERIES, codec.new_envelope(tid, 0, pb.Query(query=kind))).get(5)
    return tid


def _wait_for(reader, key: bytes, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [r for r in reader.records if r.key == key]
        if found:
            return found
        reader.poll(0.05)
    raise AssertionError(f"nothing with key {key!r} on {reader.topic}")


def test_a_poison_record_is_dead_lettered_and_the_worker_keeps_going(faulty):
    config, worker, _, publisher, outputs, letters = faulty
    metadata = publisher.send_raw(topics.QUERIES, b"\xff\xfe not protobuf", key=b"poison-1").get(5)
    after = _send(publisher, "ok")
    [letter] = _wait_for(letters, b"poison-1")
    dead = letter.envelope().dead_letter
    assert (dead.origin_topic, dead.partition, dead.offset) == (metadata.topic, metadata.partition, metadata.offset)
    assert dead.origin_topic == config.topic(topics.QUERIES)
    assert (dead.key, dead.value) == (b"poison-1", b"\xff\xfe not protobuf")
    assert dead.error.startswith("DecodeError") and dead.attempts == 0
    assert dead.worker.startswith("faulty@") and dead.failed_at_unix_ms > 0
    assert letter.envelope().event_id == f"deadletter:{metadata.topic}:{metadata.partition}:{metadata.offset}"
    _wait_for(outputs, after.encode())
    assert worker.metrics()["decode_errors"] >= 1 and worker.ready.is_set()


def test_retryable_errors_are_retried_with_backoff_then_succeed(faulty):
    _, worker, handler, publisher, outputs, letters = faulty
    retries_before = worker.metrics()["retries"]
    tid = _send(publisher, "flaky")
    [out] = _wait_for(outputs, tid.encode())
    assert handler.calls[tid] == 3 and out.envelope().event_id == f"{tid}:0:plan"
    assert worker.metrics()["retries"] - retries_before == 2
    letters.poll(0.2)
    assert not [r for r in letters.records if r.key == tid.encode()]


def test_a_handler_that_keeps_failing_is_dead_lettered_after_max_attempts(faulty):
    config, worker, handler, publisher, outputs, letters = faulty
    tid = _send(publisher, "down")
    [letter] = _wait_for(letters, tid.encode())
    dead = letter.envelope().dead_letter
    assert dead.attempts == config.max_attempts == handler.calls[tid] == 3
    assert dead.error == "Retryable: down: attempt 3"
    assert letter.envelope().trajectory_id == tid and codec.decode(dead.value).trajectory_id == tid
    assert _wait_for(outputs, _send(publisher, "ok").encode())  # and it carries on


def test_a_non_retryable_error_is_dead_lettered_at_once(faulty):
    _, _, handler, publisher, _, letters = faulty
    tid = _send(publisher, "bug")
    [letter] = _wait_for(letters, tid.encode())
    assert letter.envelope().dead_letter.attempts == 1 == handler.calls[tid]
    assert "ValueError: a bug in the handler" in letter.envelope().dead_letter.error


CRASHY = """
import sys, time
from agentflow.bus import codec, topics
from agentflow.bus.config import BusConfig
from agentflow.bus.worker import Worker
from agentflow.proto.v1 import events_pb2 as pb

def handle(envelope):
    time.sleep(0.02)
    return [(topics.PLANS, codec.new_envelope(envelope.trajectory_id, envelope.step, pb.Plan()))]

config = BusConfig(bootstrap_servers=sys.argv[1], topic_prefix=sys.argv[2], max_poll_records=5,
                   max_poll_interval_ms=6000)
Worker("crashy", config, [topics.QUERIES], handle).run()
"""


def test_a_killed_worker_loses_nothing_its_replacement_resumes_from_committed_offsets(bus_config, broker):
    # A small poll batch bounds what a crash can leave uncommitted; a short rebalance timeout lets tansu give the
    # dead member's partitions away sooner.
    config = dataclasses.replace(bus_config, max_poll_records=5, max_poll_interval_ms=6000)
    trajectories, steps = 6, 10
    with Publisher(config) as publisher, TopicReader(config, topics.PLANS) as reader:
        for step in range(steps):
            for t in range(trajectories):
                publisher.publish(topics.QUERIES, codec.new_envelope(f"traj-{t}", step, pb.Query()))
        publisher.flush()
        child = subprocess.Popen([sys.executable, "-c", CRASHY, broker.bootstrap, config.topic_prefix])
        try:
            reader.read(15, timeout_s=30)
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        before_kill = len(reader.records)
        assert before_kill < trajectories * steps, "the worker was killed mid-stream"

        with Worker("crashy", config, [topics.QUERIES], lambda e: [
                (topics.PLANS, codec.new_envelope(e.trajectory_id, e.step, pb.Plan()))]) as replacement:
            deadline = time.monotonic() + 40
            while len({r.envelope().event_id for r in reader.records}) < trajectories * steps:
                assert time.monotonic() < deadline, f"{len(reader.records)} outputs, {replacement.metrics()}"
                reader.poll(0.1)
            reader.read(0, settle_s=0.3)
            redone = replacement.metrics()["records_processed"]

    counts = Counter(r.envelope().event_id for r in reader.records)
    assert len(counts) == trajectories * steps, "nothing lost"
    duplicates = sum(counts.values()) - len(counts)
    # resumed from the committed offsets: at most one uncommitted poll per partition is done again
    assert duplicates <= config.partitions * config.max_poll_records, duplicates
    assert redone <= trajectories * steps - before_kill + config.partitions * config.max_poll_records
    first_seen = defaultdict(list)
    for record in sorted(reader.records, key=lambda r: (r.partition, r.offset)):
        step = record.envelope().step
        if step not in first_seen[record.key]:
            first_seen[record.key].append(step)
    assert all(s == list(range(steps)) for s in first_seen.values()), "still in order per trajectory"


def test_broker_down_at_start_worker_is_not_ready_until_it_appears(tmp_path):
    port = free_port()
    config = BusConfig(bootstrap_servers=f"127.0.0.1:{port}", connect_timeout_ms=300, reconnect_backoff_max_ms=500)
    with Worker("patient", config, [topics.QUERIES], lambda e: [
            (topics.PLANS, codec.new_envelope(e.trajectory_id, e.step, pb.Plan()))]) as worker:
        assert not worker.wait_ready(1.5)
        assert worker.metrics()["connect_failures"] >= 1 and worker.metrics()["ready"] == 0
        with Broker(port, log_dir=tmp_path).start():
            assert worker.wait_ready(READY_S)
            with Publisher(config) as publisher, TopicReader(config, topics.PLANS) as reader:
                publisher.publish(topics.QUERIES, codec.new_envelope("late", 0, pb.Query()))
                publisher.flush()
                assert reader.read(1, timeout_s=60)[0].key == b"late"
            worker.stop()
            assert worker.join(60)
