"""SolveStream's contract, "the stream ends after the answer", holds when the record overtakes stages still on their
way (the gateway reads the ring's topics side by side, so their order across topics is not kept)."""

from __future__ import annotations

import queue

from agentflow.bus.codec import new_envelope
from agentflow.bus.config import BusConfig
from agentflow.proto.v1 import events_pb2, trajectory_pb2
from agentflow.services.gateway.service import Gateway

TID = "t" * 32


def _record() -> trajectory_pb2.Trajectory:
    turns = [trajectory_pb2.Turn(step=0, parse_error="no sub-goal", verdict="CONTINUE"),
             trajectory_pb2.Turn(step=1, command="print(3 + 4)", result="7", verdict="STOP")]
    for turn in turns[1:]:
        turn.decision.tool, turn.decision.sub_goal = "python", "add"
    return trajectory_pb2.Trajectory(trajectory_id=TID, status="answered", answer="7", turns=turns)


def _stream(arrivals) -> list:
    gateway = Gateway(BusConfig(bootstrap_servers="127.0.0.1:1"))
    inbox = queue.Queue()
    for envelope in arrivals:
        inbox.put(envelope)
    gateway._submit = lambda request, context: (TID, inbox, 5.0)
    return list(gateway.SolveStream(None, None))


def test_stages_the_record_overtook_come_from_the_record_and_the_answer_is_last():
    record = _record()
    first_plan = new_envelope(TID, 0, events_pb2.Plan(turn=record.turns[0]))
    events = _stream([first_plan, new_envelope(TID, 0, record)])
    assert [(e.stage, e.step) for e in events] == [("plan", 0), ("verdict", 0), ("plan", 1), ("execution", 1),
                                                   ("verdict", 1), ("answer", 2)]
    assert events[0].summary.startswith("step 1: unreadable plan")
    assert events[-1].summary == "answer (answered): 7" and events[-1].answer.answer == "7"


def test_stages_that_arrived_are_not_sent_twice_and_an_early_answer_waits_for_them():
    record = _record()
    arrived = [new_envelope(TID, 0, events_pb2.Plan(turn=record.turns[0])),
               new_envelope(TID, 0, events_pb2.Verdict(turn=record.turns[0])),
               new_envelope(TID, 2, events_pb2.Answer(answer="7", status="answered", duration_s=1.5))]
    events = _stream([*arrived, new_envelope(TID, 0, record)])
    assert [(e.stage, e.step) for e in events] == [("plan", 0), ("verdict", 0), ("plan", 1), ("execution", 1),
                                                   ("verdict", 1), ("answer", 2)]
    assert events[-1].answer.duration_s == 1.5  # the answer that arrived, not one rebuilt from the record
