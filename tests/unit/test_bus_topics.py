"""Topic names of the event ring, their broker settings, and the worker's retry policy (no broker)."""

import pytest

from agentflow.bus import topics
from agentflow.bus.worker import BadOutput, Retryable, Worker, is_retryable
from agentflow.bus.codec import new_envelope
from agentflow.bus.config import BusConfig
from agentflow.errors import EngineError, InvalidInput
from agentflow.proto.v1 import events_pb2 as pb


def test_the_ring_has_the_topics_of_the_design():
    assert topics.RING == ("queries", "memory.updated", "plans", "executions", "verdicts", "finalize", "answers",
                           "trajectories", "feedback", "planner.versions", "planner.routing", "rollout.decisions",
                           "deadletter")
    assert set(topics.ALL) == set(topics.RING) | {"memory.changelog", "trainer.progress"}


def test_the_changelog_the_routing_tables_and_the_trainer_progress_are_compacted_and_every_topic_has_the_limit():
    limit = {"max.message.bytes": str(1024 * 1024 + 16 * 1024)}
    for name in (topics.MEMORY_CHANGELOG, topics.PLANNER_ROUTING, topics.TRAINER_PROGRESS):
        assert topics.topic_configs(name) == {"cleanup.policy": "compact", **limit}
    assert all(topics.topic_configs(name) == limit for name in topics.RING if name != topics.PLANNER_ROUTING)
    small = BusConfig(max_record_bytes=200_000)
    assert topics.topic_configs(topics.PLANS, small) == {"max.message.bytes": str(200_000 + 16 * 1024)}


@pytest.mark.parametrize("error, retried", [
    (Retryable("llm busy"), True), (EngineError("refused"), True), (ConnectionResetError(), True),
    (TimeoutError(), True), (ValueError("bug"), False), (InvalidInput("bad"), False), (KeyError("x"), False),
])
def test_default_retry_policy(error, retried):
    assert is_retryable(error) is retried


def test_an_exception_can_mark_itself_retryable():
    class Flaky(Exception):
        retryable = True

    assert is_retryable(Flaky())


def test_handler_outputs_are_checked():
    good = ("plans", new_envelope("t", 0, pb.Plan()))
    assert Worker._checked([good]) == [good]
    assert Worker._checked(None) == []
    for bad in ([new_envelope("t", 0, pb.Plan())], [("plans", pb.Plan())], [("plans", pb.Envelope(plan=pb.Plan()))]):
        with pytest.raises(BadOutput):
            Worker._checked(bad)


def test_worker_groups_are_per_service_and_prefix():
    config = BusConfig(topic_prefix="staging.")
    assert Worker("planner", config, ["memory.updated"], lambda e: []).group_id == "staging.planner"
    assert Worker("planner", config, ["x"], lambda e: [], group_id="g").group_id == "g"
    with pytest.raises(ValueError):
        Worker("planner", config, [], lambda e: [])
