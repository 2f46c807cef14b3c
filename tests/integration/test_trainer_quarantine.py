"""The trainer's quarantine against a real tansu broker: the versions rolled back on a tripwire before it started are
known before it takes its first group, and later ones arrive through its follower of rollout.decisions."""

import threading
import time
from types import SimpleNamespace

from agentflow.bus import codec, topics
from agentflow.bus.clients import Publisher
from agentflow.proto.v1 import events_pb2 as pb
from agentflow.trainer.service import GroupCollector, TrainerService
from agentflow.versions import TRIPPED, Served


def rollback(version: str, tripwire: bool) -> pb.Envelope:
    comparison = (pb.RolloutComparison(metric="tripwire:refusal_rate", diff_lower=0.6, diff_upper=0.6, margin=0.1,
                                       verdict=TRIPPED) if tripwire else
                  pb.RolloutComparison(metric="reward", diff_lower=-0.4, diff_upper=-0.2, margin=0.05,
                                       verdict="worse"))
    decision = pb.RolloutDecision(version=version, action="rollback", reason="test", comparisons=[comparison])
    return codec.new_envelope(f"rollout:{version}", 1, decision)


def publish(bus_config, *envelopes) -> None:
    with Publisher(bus_config) as publisher:
        for envelope in envelopes:
            publisher.publish(topics.ROLLOUT_DECISIONS, envelope)
        publisher.flush(10)


def test_the_trainer_knows_earlier_tripwire_rollbacks_at_once_and_follows_later_ones(bus_config):
    topics.ensure_topics(bus_config, [topics.ROLLOUT_DECISIONS])
    publish(bus_config, rollback("v1", tripwire=True), rollback("v2", tripwire=False))
    service = object.__new__(TrainerService)  # only the decisions' follower, the collector and what it keeps
    service.bus, service.stop_event = bus_config, threading.Event()
    service.collector, service.served = GroupCollector(3, timeout_s=100.0), Served()
    service.trainer = SimpleNamespace(in_service=frozenset())
    try:
        service._follow_decisions()
        assert service.collector.quarantined == {"v1"}  # before the first group is taken
        publish(bus_config, rollback("v3", tripwire=True))
        deadline = time.monotonic() + 15
        while "v3" not in service.collector.quarantined:
            assert time.monotonic() < deadline, "the follower did not deliver the later rollback"
            time.sleep(0.05)
        assert service.collector.quarantined == {"v1", "v3"}
        assert service.trainer.in_service == {1, 2, 3}  # rolled back, still draining: not pruned
    finally:
        service.stop_event.set()
