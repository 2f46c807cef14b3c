"""The services' handlers wired together in memory (no broker): the ring reproduces the in-process loop, and
duplicated deliveries change nothing."""

import random

import pytest
from google.protobuf import json_format

from agentflow.bus import codec, topics
from agentflow.bus.codec import new_envelope
from agentflow.domain import trajectory
from agentflow.domain.convert import record_from_proto
from agentflow.domain.memory import Memory
from agentflow.errors import InvalidInput
from agentflow.proto.v1 import events_pb2, legacy_pb2
from agentflow.proto.v1 import trajectory_pb2 as tpb
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
    again = restarted.handle(new_envelope("t", 0, events_pb2.Query(query="q")))  # known: what it is owed, again
    owed = [(t, e.event_id) for t, e in again if t != topics.MEMORY_CHANGELOG]
    assert owed == [(topics.MEMORY_UPDATED, "t:0:memory")]


def test_a_repeated_query_of_a_finished_trajectory_sends_its_record_again():
    """After a broker restart lost the record, the gateway's re-published query must get the answer back."""
    agent = make_agent(scripted(**GOOD))
    memory, finished, _ = run_ring(agent, [("t", "q")])
    again = memory.handle(new_envelope("t", 0, events_pb2.Query(query="q")))
    assert [(t, e.event_id) for t, e in again if t != topics.MEMORY_CHANGELOG] == [
        (topics.TRAJECTORIES, finished[0].event_id)]


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


# --- schema 1 turn events (each holding its parent) are still read -----------------------------------------------


def plan_v1(plan) -> legacy_pb2.PlanV1:
    turn = plan.turn
    old = legacy_pb2.PlanV1(step=turn.step, decision=turn.decision, parse_error=turn.parse_error, memory=plan.memory,
                            options=plan.options, deadline_unix_ms=plan.deadline_unix_ms,
                            duration_s=turn.timings.plan_s)
    for source, target, field in ((turn, old, "planner"), (plan, old, "analysis_call")):
        if source.HasField(field):
            getattr(target, field).CopyFrom(getattr(source, field))
    return old


def as_schema_1(envelope):
    """The envelope as a schema 1 producer wrote it (the turn events nested), decoded by today's codec."""
    name = envelope.WhichOneof("payload")
    if name not in ("plan", "execution", "verdict"):
        return envelope
    turn = getattr(envelope, name).turn
    old = plan_v1(envelope.plan) if name == "plan" else None
    if name in ("execution", "verdict"):  # rebuilt from the turn: the executor's part on top of the plan's
        memory = envelope.execution.memory if name == "execution" else tpb.MemorySnapshot()
        plan = events_pb2.Plan(turn=turn, memory=memory)
        old = legacy_pb2.ExecutionV1(step=turn.step, plan=plan_v1(plan), command=turn.command, result=turn.result,
                                     tool_error=turn.tool_error, duration_s=turn.timings.execute_s)
        if turn.HasField("executor"):
            old.executor.CopyFrom(turn.executor)
        if getattr(envelope, name).HasField("analysis_call"):
            old.plan.analysis_call.CopyFrom(getattr(envelope, name).analysis_call)
    if name == "verdict":
        old = legacy_pb2.VerdictV1(step=turn.step, execution=old, verdict=turn.verdict,
                                   analysis=turn.verifier_analysis, duration_s=turn.timings.verify_s,
                                   memory=envelope.verdict.memory)
        if turn.HasField("verifier"):
            old.verifier.CopyFrom(turn.verifier)
    legacy = events_pb2.Envelope()
    legacy.CopyFrom(envelope)
    legacy.schema_version = 1
    getattr(legacy, name).CopyFrom(type(getattr(envelope, name)).FromString(old.SerializeToString()))
    return codec.decode(codec.encode(legacy))


def test_schema_1_turn_events_decode_into_todays_shape():
    turn = tpb.Turn(step=1, planner=tpb.LLMCall(text="p", token_ids=[5], logprobs=[-0.5], model_version="v3"),
                    decision=tpb.Decision(sub_goal="add", tool="python", context="2+2"), command="print(2+2)",
                    executor=tpb.LLMCall(text="c"), result="4", verdict="STOP", verifier_analysis="done",
                    verifier=tpb.LLMCall(text="v"),
                    timings=tpb.Timings(plan_s=0.5, execute_s=0.25, verify_s=0.125))
    m_t = tpb.MemorySnapshot(query="2+2?", analysis="easy")
    m_next = tpb.MemorySnapshot(query="2+2?", analysis="easy", steps=[tpb.MemoryStep(step=1, result="4")])
    verdict = events_pb2.Verdict(turn=turn, memory=m_next, analysis_call=tpb.LLMCall(text="a"))
    upgraded = as_schema_1(new_envelope("t", 1, verdict))
    assert upgraded.schema_version == codec.SCHEMA_VERSION == 2
    assert upgraded.verdict == verdict
    execution = events_pb2.Execution(turn=turn, memory=m_t, deadline_unix_ms=7)
    execution.turn.ClearField("verifier")
    execution.turn.verdict = execution.turn.verifier_analysis = ""
    execution.turn.timings.verify_s = 0.0
    upgraded = as_schema_1(new_envelope("t", 1, execution))
    assert upgraded.execution.turn == execution.turn and upgraded.execution.memory == m_t
    assert not upgraded.execution.HasField("analysis_call")


def test_a_ring_of_schema_1_events_gives_the_same_record():
    agent = make_agent(scripted(**GOOD))
    _, finished, _ = run_ring(agent, [("t1", "What is 6*7?")])
    memory, by_topic = ring(agent)
    pending, old_finished = [(topics.QUERIES, new_envelope("t1", 0, events_pb2.Query(query="What is 6*7?")))], []
    while pending:
        topic, envelope = pending.pop(0)
        if topic == topics.TRAJECTORIES:
            old_finished.append(envelope)
        elif topic != topics.MEMORY_CHANGELOG:
            pending += by_topic[topic].handle(as_schema_1(envelope))
    new, old = record_from_proto(finished[0].trajectory), record_from_proto(old_finished[0].trajectory)
    assert len(old["turns"]) == len(new["turns"]) >= 1
    for key in ("status", "answer", "analysis", "analysis_call", "memory"):
        assert old[key] == new[key]
    assert [t["decision"] for t in old["turns"]] == [t["decision"] for t in new["turns"]]
    assert [t["planner"]["token_ids"] for t in old["turns"]] == [t["planner"]["token_ids"] for t in new["turns"]]


def test_a_cancel_ends_the_trajectory_and_later_events_are_dropped():
    agent = make_agent(scripted(**GOOD))
    memory, by_topic = ring(agent)
    first = memory.handle(new_envelope("t1", 0, events_pb2.Query(query="What is 6*7?")))
    update = next(e for topic, e in first if topic == topics.MEMORY_UPDATED)
    plan = by_topic[topics.MEMORY_UPDATED].handle(update)[0][1]  # the planner's work, still on its way
    cancelled = memory.handle(new_envelope("t1", 0, events_pb2.Cancel(reason="the caller went away")))
    (record,) = [e.trajectory for topic, e in cancelled if topic == topics.TRAJECTORIES]
    assert record.status == "cancelled" and "the caller went away" in record.error and not record.answer
    trajectory.validate(record_from_proto(record))
    execution = by_topic[topics.PLANS].handle(plan)[0][1]
    verdict = by_topic[topics.EXECUTIONS].handle(execution)[0][1]
    assert memory.handle(verdict) == []  # the turn finished after the cancel is not recorded
    assert memory.handle(new_envelope("t1", 0, events_pb2.Cancel())) == []  # a second cancel changes nothing
    assert memory.handle(new_envelope("unknown", 0, events_pb2.Cancel())) == []


def letter_of(envelope, topic: str, error: Exception, worker: str, attempts: int = 1) -> events_pb2.Envelope:
    """The dead letter a worker writes when it gives up on ``envelope`` (read from ``topic``)."""
    from types import SimpleNamespace

    from agentflow.bus.worker import dead_letter

    record = SimpleNamespace(topic=topic, partition=1, offset=7, key=envelope.trajectory_id.encode(),
                             value=codec.encode(envelope))
    return dead_letter(record, error, attempts, envelope, worker, 65536)


def test_a_dead_lettered_stage_event_ends_its_trajectory_with_an_error():
    """Every trajectory ends: a stage that fails on every attempt (here the planner, on a version name its HTTP
    client cannot send) would otherwise leave it waiting for good."""
    agent = make_agent(scripted(**GOOD))
    memory, by_topic = ring(agent)
    first = memory.handle(new_envelope("t1", 0, events_pb2.Query(query="What is 6*7?")))
    update = next(e for topic, e in first if topic == topics.MEMORY_UPDATED)
    error = UnicodeEncodeError("ascii", "v\xe9", 1, 2, "ordinal not in range(128)")
    letter = letter_of(update, topics.MEMORY_UPDATED, error, "planner@host:42")
    out = memory.handle(letter)
    (record,) = [e.trajectory for topic, e in out if topic == topics.TRAJECTORIES]
    assert record.status == "error" and not record.answer
    assert letter.dead_letter.origin_stage == "memory"
    assert record.error.startswith("stage_failed: planner gave up on the memory event of step 0 after 1 attempt(s)")
    assert "UnicodeEncodeError" in record.error
    trajectory.validate(record_from_proto(record))
    assert memory.states["t1"].phase == "done"  # nothing left in flight
    assert [t for t, _ in out] == [topics.TRAJECTORIES, topics.MEMORY_CHANGELOG]
    assert memory.handle(letter) == []  # the same letter again (a redelivery)
    plan = by_topic[topics.MEMORY_UPDATED].handle(update)[0][1]  # a late copy that got through: dropped
    verdict = by_topic[topics.EXECUTIONS].handle(by_topic[topics.PLANS].handle(plan)[0][1])[0][1]
    assert memory.handle(verdict) == []


def test_dead_letters_of_other_records_change_nothing():
    agent = make_agent(scripted(**GOOD))
    memory, by_topic = ring(agent)
    first = memory.handle(new_envelope("t1", 0, events_pb2.Query(query="What is 6*7?")))
    update = next(e for topic, e in first if topic == topics.MEMORY_UPDATED)
    plan = by_topic[topics.MEMORY_UPDATED].handle(update)[0][1]
    verdict = by_topic[topics.EXECUTIONS].handle(by_topic[topics.PLANS].handle(plan)[0][1])[0][1]
    memory.handle(verdict)  # step 0 recorded (STOP: the generator's turn next)
    feedback = new_envelope("t1", 0, events_pb2.Feedback(trajectory_id="t1"))
    undecodable = letter_of(update, topics.MEMORY_UPDATED, ValueError("bad"), "planner@h:1")
    undecodable.dead_letter.origin_stage = ""  # what a record that did not decode gets
    for letter in (letter_of(feedback, topics.FEEDBACK, ValueError("bad"), "memory@h:1"), undecodable,
                   letter_of(plan, topics.PLANS, ValueError("stale"), "executor@h:1"),  # step 0: already recorded
                   letter_of(new_envelope("other", 0, events_pb2.Cancel()), topics.QUERIES, ValueError("x"), "m")):
        assert memory.handle(letter) == [], letter.dead_letter.origin_stage
    assert memory.states["t1"].phase == "finalizing" and "other" not in memory.states


def test_a_query_the_memory_service_itself_gave_up_on_ends_as_an_error_record():
    memory = MemoryService()
    query = new_envelope("t9", 0, events_pb2.Query(query="What is 6*7?"))
    out = memory.handle(letter_of(query, topics.QUERIES, RuntimeError("boom"), "memory@h:1", attempts=3))
    (record,) = [e.trajectory for topic, e in out if topic == topics.TRAJECTORIES]
    assert record.status == "error" and "memory gave up on the query event" in record.error and "boom" in record.error
    assert memory.states["t9"].phase == "done"


def rating(tid: str, value: float, author: str, stage: str) -> events_pb2.Envelope:
    reward = tpb.Reward(value=value, source="human", author=author)
    return new_envelope(tid, 0, events_pb2.Feedback(trajectory_id=tid, reward=reward, author=author), stage=stage)


def test_flipping_ratings_re_emit_a_record_a_bounded_number_of_times_even_across_a_restart(caplog):
    from prometheus_client import REGISTRY

    def dropped() -> float:
        return REGISTRY.get_sample_value("agentflow_feedback_dropped_total") or 0.0

    agent = make_agent(scripted(**GOOD))
    memory, _, _ = run_ring(agent, [("t", "What is 6*7?")])
    before = dropped()
    emitted, changelog = [], []
    for i in range(40):  # 0, 1, 0, 1, ...: each replaces alice's previous rating, so each would emit the record
        for topic, envelope in memory.handle(rating("t", i % 2, "alice", f"f{i}")):
            (emitted if topic == topics.TRAJECTORIES else changelog).append(envelope)
    assert len(emitted) == 32  # the default max_feedback_emits
    assert dropped() - before == 4  # 0, -, 0, -: the other four equal the rating kept (1), a no-op anyway
    assert [r.message for r in caplog.records].count(
        "memory: trajectory t went out again for feedback 32 times (max_feedback_emits); its further feedback is "
        "dropped") == 1
    assert memory.handle(rating("t", 1, "alice", "f99")) == []  # the same rating again: not counted
    assert dropped() - before == 4

    from agentflow.services.memory import MemorySettings

    restarted = MemoryService(agent.config, settings=MemorySettings(max_feedback_emits=32))
    restarted.restore(changelog[-1:])  # the count is in the state on the changelog
    assert restarted.states["t"].feedback_emits == 32
    assert restarted.handle(rating("t", 0.5, "bob", "g1")) == []
    roomier = MemoryService(agent.config, settings=MemorySettings(max_feedback_emits=33))
    roomier.restore(changelog[-1:])
    assert [t for t, _ in roomier.handle(rating("t", 0.5, "bob", "g1"))] == [topics.TRAJECTORIES,
                                                                            topics.MEMORY_CHANGELOG]
    with pytest.raises(InvalidInput, match="max_feedback_emits"):
        MemorySettings(max_feedback_emits=-1)


class VersionedPlanner:
    """Wraps a scripted engine: records each call's kept version, and reports the kept version (else "v-first",
    then "v-other" — what a router would give a trajectory whose calls were not kept together)."""

    supports_structured_output = False

    def __init__(self, inner):
        self.inner, self.kept = inner, []

    def complete(self, messages, sampling, *, timeout, json_schema=None, key=""):
        from dataclasses import replace

        self.kept.append(sampling.trajectory_version)
        completion = self.inner.complete(messages, sampling, timeout=timeout, json_schema=json_schema, key=key)
        return replace(completion, model_version=sampling.trajectory_version or
                       ("v-first" if len(self.kept) == 1 else "v-other"))


def test_every_planner_call_after_the_first_is_kept_on_its_version_in_the_ring_and_the_loop():
    from dataclasses import replace

    for run in ("ring", "loop"):
        engine = scripted(**{**GOOD, "verify": ["Conclusion: CONTINUE", "Conclusion: CONTINUE", "Conclusion: STOP"]})
        agent = make_agent(engine, max_steps=4)
        planner = VersionedPlanner(engine)
        agent.planner = replace(agent.planner, engine=planner)
        if run == "ring":
            _, finished, _ = run_ring(agent, [("t1", "What is 6*7?")])
            record = record_from_proto(finished[0].trajectory)
        else:
            record = agent.solve("What is 6*7?")
        assert planner.kept == ["", "v-first", "v-first", "v-first"], run  # the analysis, then three turns
        assert trajectory.Record(record).planner_versions() == {"v-first"}, run


def _drain(by_topic, pending: list) -> list:
    """Deliver ``pending`` events (in order) until quiet; the finished records' envelopes."""
    finished = []
    while pending:
        topic, envelope = pending.pop(0)
        if topic == topics.TRAJECTORIES:
            finished.append(envelope)
        elif topic != topics.MEMORY_CHANGELOG:
            pending += by_topic[topic].handle(envelope)
    return finished


def _branch_query(tid: str, turn: int, query: str = "What is 6*7?", source: str = "training", **fields):
    event = events_pb2.Query(query=query, source=source, group_id=f"branch/{tid}/{turn}", **fields)
    event.branch.trajectory_id, event.branch.turn = tid, turn
    return event


def test_a_branch_goes_on_from_a_kept_trajectory_as_the_loop_does():
    """Shadow branches through the ring: the memory service rebuilds the state of a finished trajectory after k
    turns; the continuation's turns are numbered on from k, and its record equals the in-process loop's from the
    same state (``Agent.solve(start=...)``)."""
    agent = make_agent(scripted(**{**GOOD, "verify": "Conclusion: CONTINUE"}), max_steps=3)
    memory, by_topic = ring(agent)
    origin = events_pb2.Query(query="What is 6*7?", source="training", group_id="g")
    [done] = _drain(by_topic, [(topics.QUERIES, new_envelope("origin", 0, origin))])
    origin_record = record_from_proto(done.trajectory)
    assert len(origin_record["turns"]) == 3 and trajectory.may_branch(origin_record, 1)

    [branch] = _drain(by_topic, [(topics.QUERIES, new_envelope("b1", 0, _branch_query("origin", 1)))])
    record = record_from_proto(branch.trajectory)
    trajectory.validate(record)
    assert record["status"] == "max_steps" and [t["step"] for t in record["turns"]] == [1, 2]
    assert record["analysis"] == origin_record["analysis"] and not record["analysis_call"]
    start = Memory.from_dict(origin_record["memory"]).after(1)
    assert record["memory"]["steps"][:1] == origin_record["memory"]["steps"][:1]
    local = agent.solve("What is 6*7?", source="training", start=start)
    assert [t["step"] for t in local["turns"]] == [1, 2]
    assert [t["decision"] for t in record["turns"]] == [t["decision"] for t in local["turns"]]
    assert record["memory"] == local["memory"]
    assert not trajectory.may_branch(record)  # a branch is not branched again: its memory holds the origin's steps


@pytest.mark.parametrize("case, error", [
    ("unknown", "not_found: branch: no finished trajectory 'nobody'"),
    ("other query", "answered another query"),
    ("last turn", "may not be branched after turn 2"),  # the origin ran 2 turns: nothing is left to branch
    ("beyond max_steps", "branch.turn must be from 1 (0 is the whole query) to max_steps - 1 (2), got 3"),
    ("opted out", "may not be branched after turn 1"),
])
def test_a_branch_that_may_not_start_ends_at_once_as_an_error_record(case, error):
    agent = make_agent(scripted(**{**GOOD, "verify": "Conclusion: CONTINUE"}), max_steps=3)
    memory, by_topic = ring(agent)
    origin = events_pb2.Query(query="What is 6*7?", source="traffic", train_ok=case != "opted out")
    origin.options.max_steps = 2
    _drain(by_topic, [(topics.QUERIES, new_envelope("origin", 0, origin))])
    query = {"unknown": _branch_query("nobody", 1), "other query": _branch_query("origin", 1, query="What is 7*8?"),
             "last turn": _branch_query("origin", 2), "beyond max_steps": _branch_query("origin", 3),
             "opted out": _branch_query("origin", 1)}[case]
    [out] = _drain(by_topic, [(topics.QUERIES, new_envelope("b", 0, query))])
    record = record_from_proto(out.trajectory)
    assert record["status"] == "error" and error in record["error"] and not record["turns"]
