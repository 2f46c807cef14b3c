"""Between the domain's dicts/dataclasses and the protobuf messages that carry them over Kafka and gRPC.

A turn is one ``agentflow.v1.Turn`` message from the planner to the record; only the record's JSON form (a dict, see
``trajectory.schema.json``) is made from it, by ``turn_to_dict`` and ``record_from_proto``.
"""

from __future__ import annotations

import time

from google.protobuf import json_format
from google.protobuf.message import Message

from agentflow.domain.deadline import Deadline
from agentflow.domain import trajectory
from agentflow.llm.base import Completion
from agentflow.proto.v1 import trajectory_pb2


def to_dict(message: Message) -> dict:
    """Every field, defaults included, under its proto name: the shape trajectory.schema.json describes."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


def from_dict(data: dict, message_type: type[Message]) -> Message:
    return json_format.ParseDict(data, message_type())


def record_from_proto(message: trajectory_pb2.Trajectory) -> dict:
    """A Trajectory message as the record dict, with every sub-message present (empty calls as {})."""
    record = to_dict(message)
    for key in ("memory", "totals", "analysis_call", "generator"):
        record.setdefault(key, {})
    for turn in record["turns"]:
        _fill_turn(turn)
    return record


def turn_to_dict(turn: trajectory_pb2.Turn) -> dict:
    """A turn as the record holds it."""
    return _fill_turn(to_dict(turn))


def _fill_turn(turn: dict) -> dict:
    for key in ("planner", "executor", "verifier"):
        turn.setdefault(key, {})
    turn.setdefault("decision", {"sub_goal": "", "tool": "", "context": ""})
    turn.setdefault("timings", {"plan_s": 0.0, "execute_s": 0.0, "verify_s": 0.0, "total_s": 0.0})
    return turn


def llm_call_message(completion: Completion | None) -> trajectory_pb2.LLMCall | None:
    """The record of one LLM call as a message (None without a completion)."""
    call = trajectory.llm_call(completion)
    return trajectory_pb2.LLMCall(**call) if call else None


def now_ms() -> int:
    return int(time.time() * 1000)


def deadline_from_ms(deadline_ms: int) -> Deadline:
    """A monotonic Deadline for an absolute wall-clock deadline carried in an event (0: none)."""
    return Deadline(None if not deadline_ms else (deadline_ms - now_ms()) / 1000.0)
