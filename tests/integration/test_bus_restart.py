"""Clients against a broker killed with SIGKILL and restarted on the same port (in-memory tansu: it comes back empty).
Each test has its own broker. The time bounds only catch a hang."""

from __future__ import annotations

import time

import pytest

from agentflow.bus import codec, topics
from agentflow.bus.broker import Broker, free_port
from agentflow.bus.clients import Follower, Publisher, TopicReader
from agentflow.bus.config import BusConfig
from agentflow.bus.worker import Worker
from agentflow.proto.v1 import events_pb2 as pb

pytestmark = pytest.mark.faults
WAIT_S = 60


@pytest.fixture
def broker(tmp_path):
    with Broker(free_port(), log_dir=tmp_path).start() as running:
        yield running


def _config(broker) -> BusConfig:
    return BusConfig(bootstrap_servers=broker.bootstrap, reconnect_backoff_max_ms=500, retry_backoff_ms=20)


def _until(condition, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _query(tid: str):
    return codec.new_envelope(tid, 0, pb.Query(query=tid))


def test_the_publisher_rebuilds_its_producer_and_delivers_what_failed(broker):
    config = _config(broker)
    with Publisher(config) as publisher:
        publisher.publish(topics.QUERIES, _query("before")).get(10)
        broker.kill()
        during = publisher.publish(topics.QUERIES, _query("during"))  # fails, then is sent again
        time.sleep(1.0)
        broker.start()
        publisher.reset()  # what the gateway does when its listener sees the broker back
        during.get(WAIT_S)
        after = [publisher.publish(topics.QUERIES, _query(f"after-{i}")) for i in range(3)]
        assert all(f.get(WAIT_S) for f in after)
        assert publisher.rebuilds >= 1  # the old producer failed fatally (InitProducerId) after the restart
    with TopicReader(config, topics.QUERIES) as reader:
        keys = [r.key for r in reader.read(4, timeout_s=WAIT_S, settle_s=0.5)]
    assert sorted(keys) == [b"after-0", b"after-1", b"after-2", b"during"]


def test_a_follower_is_not_ready_while_the_broker_is_down_then_reads_the_recreated_topics(broker):
    config = _config(broker)
    seen, connects, losses = [], [], []

    def on_connect():
        topics.ensure_topics(config)  # what the gateway does: the restarted broker is empty
        connects.append(time.monotonic())

    follower = Follower(config, [topics.ANSWERS], lambda r: seen.append(r.key), name="test-follower",
                        on_connect=on_connect, on_lost=lambda: losses.append(time.monotonic())).start()
    try:
        assert follower.ready.wait(WAIT_S)
        assert losses == []  # the first connect lost nothing
        with Publisher(config) as publisher:
            publisher.publish(topics.ANSWERS, _query("one")).get(10)
            _until(lambda: b"one" in seen, "first record")
            broker.kill()
            _until(lambda: not follower.ready.is_set(), "not ready while the broker is down")
            broker.start()
            _until(follower.ready.is_set, "ready again")
            assert len(connects) >= 2  # on_connect ran again before reading
            publisher.reset()
            publisher.publish(topics.ANSWERS, _query("two")).get(WAIT_S)
            _until(lambda: b"two" in seen, "a record on the re-created topic")
            assert len(losses) == 1, losses  # the re-created topic was noticed once, after an on_connect
            assert losses[0] > connects[1]
    finally:
        follower.stop()


def test_a_worker_is_not_ready_while_the_broker_is_down_and_works_after(broker):
    config = _config(broker)
    with Worker("restarted", config, [topics.QUERIES], lambda e: [
            (topics.PLANS, codec.new_envelope(e.trajectory_id, e.step, pb.Plan()))]) as worker:
        assert worker.wait_ready(WAIT_S)
        broker.kill()
        _until(lambda: not worker.ready.is_set(), "not ready while the broker is down")
        time.sleep(1.0)
        assert not worker.ready.is_set()
        broker.start()
        assert worker.wait_ready(WAIT_S)
        with Publisher(config) as publisher, TopicReader(config, topics.PLANS) as reader:
            publisher.publish(topics.QUERIES, _query("after")).get(WAIT_S)
            assert reader.read(1, timeout_s=WAIT_S)[0].key == b"after"
