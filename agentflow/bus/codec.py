"""The wire format of every topic: an ``agentflow.v1.Envelope`` (protobuf bytes) keyed by its trajectory id, with the
W3C trace context (``traceparent``, ``tracestate``, ``baggage``) in the record headers.

Event ids are deterministic, ``trajectory_id:step:stage``, so a redelivered event keeps its id and consumers can
drop duplicates.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from google.protobuf.message import DecodeError as _ProtobufDecodeError
from google.protobuf.message import Message
from opentelemetry import propagate
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter

from agentflow.errors import AgentFlowError, Reason
from agentflow.proto.v1 import legacy_pb2, trajectory_pb2
from agentflow.proto.v1.events_pb2 import Envelope

#: Bumped only for changes old consumers cannot read; additive proto changes keep it. 2: the turn events carry
#: the growing Turn instead of their parent event (schema 1 records are still read, see ``_upgrade_turn_event``).
SCHEMA_VERSION = 2

Headers = list[tuple[str, bytes]]

_PAYLOAD = Envelope.DESCRIPTOR.oneofs_by_name["payload"]
#: payload field -> stage name used in event ids (the proto documents these names)
STAGES: dict[str, str] = {f.name: {"memory_updated": "memory", "dead_letter": "deadletter"}.get(f.name, f.name)
                          for f in _PAYLOAD.fields}
_FIELD_BY_TYPE = {f.message_type.full_name: f.name for f in _PAYLOAD.fields}


class DecodeError(AgentFlowError):
    """A record value is not a usable Envelope."""

    reason = Reason.INVALID_INPUT


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def event_id(trajectory_id: str, step: int, stage: str) -> str:
    return f"{trajectory_id}:{step}:{stage}"


def new_envelope(trajectory_id: str, step: int, payload: Message, *, stage: str | None = None) -> Envelope:
    """An envelope around ``payload`` (any message of the payload oneof), stamped with its id, time and version."""
    name = _FIELD_BY_TYPE.get(payload.DESCRIPTOR.full_name)
    if name is None:
        raise TypeError(f"{payload.DESCRIPTOR.full_name} is not an Envelope payload; expected one of "
                        f"{', '.join(sorted(_FIELD_BY_TYPE))}")
    if not trajectory_id:
        raise ValueError("an envelope needs a trajectory id (it is the record key)")
    stage = stage or STAGES[name]
    envelope = Envelope(event_id=event_id(trajectory_id, step, stage), trajectory_id=trajectory_id, step=step,
                        stage=stage, produced_at_unix_ms=now_ms(), schema_version=SCHEMA_VERSION)
    getattr(envelope, name).CopyFrom(payload)
    return envelope


def payload(envelope: Envelope) -> Message | None:
    """The message held by the payload oneof, or None."""
    name = envelope.WhichOneof("payload")
    return getattr(envelope, name) if name else None


def stamp(envelope: Envelope) -> Envelope:
    """Fill what a hand-built envelope left empty (stage, event id, produced-at, schema version), in place."""
    if not envelope.stage and envelope.WhichOneof("payload"):
        envelope.stage = STAGES[envelope.WhichOneof("payload")]
    if not envelope.event_id:
        envelope.event_id = event_id(envelope.trajectory_id, envelope.step, envelope.stage)
    if not envelope.produced_at_unix_ms:
        envelope.produced_at_unix_ms = now_ms()
    if not envelope.schema_version:
        envelope.schema_version = SCHEMA_VERSION
    return envelope


def encode(envelope: Envelope) -> bytes:
    return envelope.SerializeToString()


def decode(value: bytes | None) -> Envelope:
    """Parse and check a record value; raises DecodeError for anything a handler should not see."""
    if not value:
        raise DecodeError("empty record value")
    try:
        envelope = Envelope.FromString(value)
    except _ProtobufDecodeError as e:
        raise DecodeError(f"not an agentflow.v1.Envelope: {e}") from None
    if envelope.WhichOneof("payload") is None:
        raise DecodeError("envelope has no payload")
    if not envelope.trajectory_id:
        raise DecodeError("envelope has no trajectory_id")
    if envelope.schema_version > SCHEMA_VERSION:
        raise DecodeError(f"schema_version {envelope.schema_version} is newer than this build reads "
                          f"({SCHEMA_VERSION}); upgrade the consumer")
    if envelope.schema_version == 1:
        _upgrade_turn_event(envelope)
    return envelope


# --- schema 1 turn events (read for one release) ------------------------------------------------------------------


def _upgrade_turn_event(envelope: Envelope) -> None:
    """Rewrite a schema 1 plan, execution or verdict (each holding its parent event) into today's shape, in place.
    Schema 1's fields are unknown to today's messages and kept as such, so the bytes parse as the old message."""
    name = envelope.WhichOneof("payload")
    if name not in ("plan", "execution", "verdict"):
        return
    event = getattr(envelope, name)
    old = {"plan": legacy_pb2.PlanV1, "execution": legacy_pb2.ExecutionV1,
           "verdict": legacy_pb2.VerdictV1}[name].FromString(event.SerializeToString())
    plan = old if name == "plan" else old.plan if name == "execution" else old.execution.plan
    event.Clear()
    event.turn.CopyFrom(_turn_from_v1(old, name))
    if plan.HasField("analysis_call"):
        event.analysis_call.CopyFrom(plan.analysis_call)
    if name == "verdict":
        event.memory.CopyFrom(old.memory)  # M_{t+1}
    else:
        event.memory.CopyFrom(plan.memory)
        event.options.CopyFrom(plan.options)
        event.deadline_unix_ms = plan.deadline_unix_ms
    envelope.schema_version = SCHEMA_VERSION


def _turn_from_v1(old, name: str) -> trajectory_pb2.Turn:
    if name == "verdict":
        turn = _turn_from_v1(old.execution, "execution")
        turn.verdict, turn.verifier_analysis, turn.timings.verify_s = old.verdict, old.analysis, old.duration_s
        _copy_call(old, turn, "verifier")
    elif name == "execution":
        turn = _turn_from_v1(old.plan, "plan")
        turn.command, turn.result, turn.tool_error, turn.timings.execute_s = (
            old.command, old.result, old.tool_error, old.duration_s)
        _copy_call(old, turn, "executor")
    else:
        turn = trajectory_pb2.Turn(step=old.step, decision=old.decision, parse_error=old.parse_error)
        turn.timings.plan_s = old.duration_s
        _copy_call(old, turn, "planner")
    return turn


def _copy_call(old, turn: trajectory_pb2.Turn, field: str) -> None:
    if old.HasField(field):
        getattr(turn, field).CopyFrom(getattr(old, field))


def record_key(envelope: Envelope) -> bytes:
    """The record key: the trajectory id, so one trajectory stays on one partition, in order."""
    return envelope.trajectory_id.encode()


# --- trace context in record headers --------------------------------------------------------------------------------


class _HeaderSetter(Setter):
    def set(self, carrier: Headers, key: str, value: str) -> None:
        carrier[:] = [(k, v) for k, v in carrier if k != key]
        carrier.append((key, value.encode()))


class _HeaderGetter(Getter):
    def get(self, carrier: Sequence[tuple[str, bytes]], key: str) -> list[str] | None:
        values = [v.decode("utf-8", "replace") for k, v in carrier if k.lower() == key and v is not None]
        return values or None

    def keys(self, carrier: Sequence[tuple[str, bytes]]) -> list[str]:
        return [k for k, _ in carrier]


def trace_headers(context: Context | None = None, headers: Iterable[tuple[str, bytes]] = ()) -> Headers:
    """``headers`` plus the trace context of ``context`` (default: the current one), as Kafka record headers."""
    carrier: Headers = list(headers)
    propagate.inject(carrier, context=context, setter=_HeaderSetter())
    return carrier


def trace_context(headers: Sequence[tuple[str, bytes]] | None) -> Context:
    """The trace context carried by record headers (an empty context when there is none)."""
    return propagate.extract(list(headers or ()), getter=_HeaderGetter())
