"""The group-less ``Follower`` and the ``AssignedConsumer`` against a real tansu broker: records from before and
after the start, a broker restart, and resuming from stored (checkpointed) or committed offsets without duplicates."""

import threading
import time
from collections import Counter

from agentflow.bus import codec, topics
from agentflow.bus.broker import Broker, free_port
from agentflow.bus.clients import AssignedConsumer, Follower, Publisher
from agentflow.bus.config import BusConfig
from agentflow.proto.v1 import events_pb2 as pb


def publish(config: BusConfig, keys) -> None:
    with Publisher(config) as publisher:
        for key in keys:
            publisher.publish(topics.QUERIES, codec.new_envelope(key, 0, pb.Query(query=key)))
        publisher.flush(10)


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def running(follower: Follower) -> threading.Thread:
    thread = threading.Thread(target=follower.run, daemon=True)
    thread.start()
    return thread


def test_a_follower_sees_records_from_before_and_after_it_started(bus_config):
    publish(bus_config, [f"early-{i}" for i in range(5)])
    seen, batches = [], []
    follower = Follower(bus_config, [topics.QUERIES, topics.PLANS], seen.append)
    idle = Follower(bus_config, [topics.PLANS], batches.append, per_batch=True)  # nothing arrives: empty batches
    threads = [running(follower), running(idle)]
    assert follower.ready.wait(10) and idle.ready.wait(10)
    publish(bus_config, [f"late-{i}" for i in range(5)])
    wait_until(lambda: len(seen) >= 10, 10, "ten records")
    time.sleep(0.3)
    follower.stop()
    idle.stop()
    for thread in threads:
        thread.join(5)
        assert not thread.is_alive()
    assert not follower.ready.is_set()
    assert sorted(r.envelope().trajectory_id for r in seen) == sorted(
        [f"early-{i}" for i in range(5)] + [f"late-{i}" for i in range(5)])  # each once
    assert len(batches) >= 3 and not any(batches)
    assert sum(follower.positions.values()) == 10  # the next offset per partition


def test_a_follower_survives_a_broker_restart(tmp_path):
    port = free_port()
    config = BusConfig(bootstrap_servers=f"127.0.0.1:{port}", connect_timeout_ms=300, reconnect_backoff_max_ms=500)
    seen = []
    follower = Follower(config, [topics.QUERIES], seen.append,
                        on_connect=lambda: topics.ensure_topics(config, [topics.QUERIES]))
    thread = running(follower)
    assert not follower.ready.wait(1.0)  # no broker yet: retrying
    with Broker(port, log_dir=tmp_path).start() as broker:
        assert follower.ready.wait(20)
        publish(config, ["before-0", "before-1"])
        wait_until(lambda: len(seen) == 2, 10, "the records before the restart")
        broker.restart()  # in-memory storage: the topics come back empty
        topics.ensure_topics(config, [topics.QUERIES])  # as the workers do when they reconnect
        publish(config, ["after-0", "after-1", "after-2"])
        wait_until(lambda: len(seen) >= 5, 30, "the records after the restart")
        time.sleep(0.3)
        follower.stop()
        thread.join(10)
    # Keyed by trajectory, the two records may sit on different partitions: no order between them.
    assert sorted(r.envelope().trajectory_id for r in seen[:2]) == ["before-0", "before-1"]
    # At least once: records fetched at the old positions before the re-created topic was noticed come again.
    assert {r.envelope().trajectory_id for r in seen[2:]} == {"after-0", "after-1", "after-2"}


def test_an_assigned_consumer_resumes_from_stored_or_committed_offsets_without_duplicates(bus_config):
    topics.ensure_topics(bus_config, [topics.QUERIES])
    publish(bus_config, [f"a-{i}" for i in range(12)])

    def consume(offsets, expected: int, commit: bool) -> tuple[list, dict]:
        """Read until ``expected`` records came (and a little longer); returns them and the next offsets to read,
        committed after each batch with ``commit`` (as the trainer does, from its handler)."""
        seen = []

        def handle(records):
            seen.extend(records)
            if commit and records:
                consumer.commit({tp.partition: offset for tp, offset in consumer.positions.items()})

        consumer = AssignedConsumer(bus_config, topics.QUERIES, bus_config.topic_prefix + "trainer", handle,
                                    offsets=offsets)
        thread = running(consumer)
        wait_until(lambda: len(seen) >= expected, 10, f"{expected} records")
        time.sleep(0.5)  # duplicates would show up now
        consumer.stop()
        thread.join(5)
        return [r.envelope().trajectory_id for r in seen], {tp.partition: o for tp, o in consumer.positions.items()}

    first, stored = consume({}, 12, commit=False)  # a checkpoint stores these offsets, then a crash: no commit
    assert sorted(first) == sorted(f"a-{i}" for i in range(12))
    publish(bus_config, [f"b-{i}" for i in range(8)])
    second, _ = consume(stored, 8, commit=True)  # resumes from the stored offsets: only the new records
    assert sorted(second) == sorted(f"b-{i}" for i in range(8))
    publish(bus_config, [f"c-{i}" for i in range(4)])
    third, _ = consume(stored, 4, commit=False)  # stale stored offsets: the later committed ones win
    assert sorted(third) == sorted(f"c-{i}" for i in range(4))
    assert not Counter(first + second + third) - Counter(set(first + second + third))  # no duplicates at all
