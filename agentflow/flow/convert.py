"""Between the domain's dicts/dataclasses and the protobuf messages that carry them over Kafka and gRPC."""

from __future__ import annotations

import time

from google.protobuf import json_format
from google.protobuf.message import Message

from agentflow.deadline import Deadline
from agentflow.flow.memory import Memory
from agentflow.flow.stages import new_turn
from agentflow.proto.v1 import events_pb2, trajectory_pb2


def to_dict(message: Message) -> dict:
    """Every field, defaults included, under its proto name: the shape trajectory.schema.json describes."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


def from_dict(data: dict, message_type: type[Message]) -> Message:
    return json_format.ParseDict(data, message_type())


def record_from_proto(message: trajectory_pb2.Trajectory) -> dict:
    """A Trajectory message as the record dict, with empty calls as {} the way the in-process loop writes them."""
    record = to_dict(message)
    for key in ("memory", "totals", "analysis_call", "generator"):
        record.setdefault(key, {})
    for turn in record["turns"]:
        for key in ("planner", "executor", "verifier"):
            turn.setdefault(key, {})
        turn.setdefault("decision", {"sub_goal": "", "tool": "", "context": ""})
        turn.setdefault("timings", {"plan_s": 0.0, "execute_s": 0.0, "verify_s": 0.0, "total_s": 0.0})
    return record


def memory_to_proto(memory: Memory) -> trajectory_pb2.MemorySnapshot:
    return from_dict(memory.to_dict(), trajectory_pb2.MemorySnapshot)


def memory_from_proto(snapshot: trajectory_pb2.MemorySnapshot) -> Memory:
    return Memory.from_dict(to_dict(snapshot))


def call_to_proto(call: dict) -> trajectory_pb2.LLMCall | None:
    return from_dict(call, trajectory_pb2.LLMCall) if call else None


def call_from_proto(holder: Message, field: str) -> dict:
    return to_dict(getattr(holder, field)) if holder.HasField(field) else {}


def turn_from_plan(plan: events_pb2.Plan) -> dict:
    turn = new_turn(plan.step)
    turn["planner"] = call_from_proto(plan, "planner")
    turn["decision"] = to_dict(plan.decision)
    turn["parse_error"] = plan.parse_error
    turn["timings"]["plan_s"] = plan.duration_s
    return turn


def turn_from_execution(execution: events_pb2.Execution) -> dict:
    turn = turn_from_plan(execution.plan)
    turn.update(command=execution.command, executor=call_from_proto(execution, "executor"), result=execution.result,
                tool_error=execution.tool_error)
    turn["timings"]["execute_s"] = execution.duration_s
    return turn


def turn_from_verdict(verdict: events_pb2.Verdict) -> dict:
    turn = turn_from_execution(verdict.execution)
    turn.update(verdict=verdict.verdict, verifier_analysis=verdict.analysis,
                verifier=call_from_proto(verdict, "verifier"))
    timings = turn["timings"]
    timings["verify_s"] = verdict.duration_s
    timings["total_s"] = round(timings["plan_s"] + timings["execute_s"] + timings["verify_s"], 6)
    return turn


def plan_message(turn: dict, memory: Memory, options, deadline_ms: int, analysis_call: dict) -> events_pb2.Plan:
    return events_pb2.Plan(
        step=turn["step"], planner=call_to_proto(turn["planner"]), decision=from_dict(turn["decision"],
        trajectory_pb2.Decision), parse_error=turn["parse_error"], memory=memory_to_proto(memory), options=options,
        deadline_unix_ms=deadline_ms, duration_s=turn["timings"]["plan_s"], analysis_call=call_to_proto(analysis_call))


def now_ms() -> int:
    return int(time.time() * 1000)


def deadline_from_ms(deadline_ms: int) -> Deadline:
    """A monotonic Deadline for an absolute wall-clock deadline carried in an event (0: none)."""
    return Deadline(None if not deadline_ms else (deadline_ms - now_ms()) / 1000.0)
