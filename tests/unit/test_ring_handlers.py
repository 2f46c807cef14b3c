"""The services' handlers wired together in memory (no broker): the ring reproduces the in-process loop, and
duplicated deliveries change nothing."""

import random

from google.protobuf import json_format

from agentflow.bus import topics
from agentflow.bus.codec import new_envelope
from agentflow.flow import trajectory
from agentflow.flow.convert import record_from_proto
from agentflow.proto.v1 import events_pb2
from agentflow.services.executor import ExecutorService
from agentflow.services.generator import GeneratorService
from agentflow.services.memory import MemoryService
from agentflow.services.planner import PlannerService
from agentflow.services.verifier import VerifierService
from tests.unit.test_loop import GOOD, make_agent, scripted


def ring(agent):
    memory = MemoryService(agent.config)
    services = [memory, PlannerService(agent), ExecutorService(agent), VerifierService(agent), GeneratorService(agent)]
    by_topic = {t: s for s in services for t in s.input_topics}
    return memory, by_topic


def run_ring(agent, queries, duplicate_every=0, seed=0):
    """Deliver events until quiet; optionally redeliver some events (at-least-once), in shuffled order."""
    memory, by_topic = ring(agent)
    rng = random.Random(seed)
    pending = [(topics.QUERIES, new_envelope(tid, 0, events_pb2.Query(query=q))) for tid, q in queries]
    finished, changelog = [], []
    while pending:
        topic, envelope = pending.pop(rng.randrange(len(pending)) if duplicate_every else 0)
        if topic == topics.TRAJECTORIES:
            finished.append(envelope)
            continue
        if topic == topics.MEMORY_CHANGELOG:
            changelog.append(envelope)
            continue
        pending += by_topic[topic].handle(envelope)
        if duplicate_every and rng.random() < 1 / duplicate_every:
            pending.append((topic, envelope))  # delivered again later, as after a crash before the commit
    return memory, finished, changelog


def test_the_ring_produces_the_same_record_as_the_loop():
    agent = make_agent(scripted(**GOOD))
    _, finished, _ = run_ring(agent, [("t1", "What is 6*7?")])
    assert len(finished) == 1
    record = record_from_proto(finished[0].trajectory)
    trajectory.validate(record)
    local = agent.solve("What is 6*7?")
    for key in ("status", "answer", "analysis"):
        assert record[key] == local[key]
    assert [t["decision"] for t in record["turns"]] == [t["decision"] for t in local["turns"]]
    assert record["memory"] == local["memory"] and record["totals"]["turns"] == local["totals"]["turns"]


def test_duplicates_are_dropped_and_every_query_finishes_once():
    engine = scripted(**{**GOOD, "verify": ["Conclusion: CONTINUE", "Conclusion: STOP"]})
    agent = make_agent(engine, max_steps=4)
    queries = [(f"t{i}", f"question {i}") for i in range(20)]
    _, finished, _ = run_ring(agent, queries, duplicate_every=3, seed=1)
    assert sorted(e.trajectory_id for e in finished) == sorted(tid for tid, _ in queries)
    for envelope in finished:
        record = record_from_proto(envelope.trajectory)
        trajectory.validate(record)
        assert [t["step"] for t in record["turns"]] == list(range(len(record["turns"])))


def test_max_steps_finalizes():
    agent = make_agent(scripted(**{**GOOD, "verify": "Conclusion: CONTINUE"}), max_steps=2)
    _, finished, _ = run_ring(agent, [("t", "q")])
    record = record_from_proto(finished[0].trajectory)
    assert record["status"] == "max_steps" and len(record["turns"]) == 2


def test_restore_rebuilds_state_and_reissues_what_is_owed():
    agent = make_agent(scripted(**GOOD))
    memory, by_topic = ring(agent)
    out = memory.handle(new_envelope("t", 0, events_pb2.Query(query="q")))
    changelog = [e for t, e in out if t == topics.MEMORY_CHANGELOG]
    restarted = MemoryService(agent.config)
    owed = restarted.restore(changelog)
    assert [(t, e.event_id) for t, e in owed] == [(topics.MEMORY_UPDATED, "t:0:memory")]
    assert restarted.handle(new_envelope("t", 0, events_pb2.Query(query="q"))) == []  # already known


def test_feedback_joins_a_finished_trajectory():
    agent = make_agent(scripted(**GOOD))
    memory, _, _ = run_ring(agent, [("t", "q")])
    reward = events_pb2.Feedback(trajectory_id="t")
    reward.reward.value, reward.reward.source = 1.0, "human"
    env = new_envelope("t", 0, reward)
    out = memory.handle(env)
    assert [t for t, _ in out] == [topics.TRAJECTORIES, topics.MEMORY_CHANGELOG]
    record = json_format.MessageToDict(out[0][1].trajectory, preserving_proto_field_name=True)
    assert record["rewards"][0]["value"] == 1.0
    assert memory.handle(env) == []  # the same feedback again


def test_a_query_with_ground_truth_gets_its_rule_reward():
    agent = make_agent(scripted(**GOOD))
    memory, by_topic = ring(agent)
    pending = [(topics.QUERIES, new_envelope("t1", 0, events_pb2.Query(query="What is 6*7?", ground_truth="42"))),
               (topics.QUERIES, new_envelope("t2", 0, events_pb2.Query(query="What is 6*7?", ground_truth="41"))),
               (topics.QUERIES, new_envelope("t3", 0, events_pb2.Query(query="What is 6*7?")))]
    finished = {}
    while pending:
        topic, envelope = pending.pop(0)
        if topic == topics.TRAJECTORIES:
            finished[envelope.trajectory_id] = record_from_proto(envelope.trajectory)
        elif topic != topics.MEMORY_CHANGELOG:
            pending += by_topic[topic].handle(envelope)
    rewards = {tid: [(r["source"], r["value"]) for r in record.get("rewards", [])] for tid, record in finished.items()}
    assert rewards == {"t1": [("rule", 1.0)], "t2": [("rule", 0.0)], "t3": []}
