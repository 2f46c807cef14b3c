"""The envelope codec: ids, stamping, decoding errors, and trace context in record headers (no broker)."""

import pytest
from opentelemetry.sdk.trace import TracerProvider

from agentflow.bus import codec
from agentflow.bus.codec import DecodeError
from agentflow.proto.v1 import events_pb2 as pb
from agentflow.proto.v1 import trajectory_pb2 as tpb


def test_new_envelope_names_the_stage_and_stamps_the_event():
    before = codec.now_ms()
    env = codec.new_envelope("traj-1", 2, pb.Plan(turn=tpb.Turn(step=2)))
    assert (env.event_id, env.trajectory_id, env.step, env.stage) == ("traj-1:2:plan", "traj-1", 2, "plan")
    assert env.WhichOneof("payload") == "plan" and env.plan.turn.step == 2
    assert env.schema_version == codec.SCHEMA_VERSION
    assert before <= env.produced_at_unix_ms <= codec.now_ms()
    assert codec.new_envelope("t", 0, pb.MemoryUpdated()).stage == "memory"
    assert codec.new_envelope("t", 0, pb.DeadLetter()).stage == "deadletter"
    assert codec.new_envelope("t", 0, pb.Verdict(), stage="verdict-retry").event_id == "t:0:verdict-retry"


def test_event_ids_are_deterministic():
    a = codec.new_envelope("traj", 3, pb.Execution(turn=tpb.Turn(result="x")))
    b = codec.new_envelope("traj", 3, pb.Execution(turn=tpb.Turn(result="y")))
    assert a.event_id == b.event_id == codec.event_id("traj", 3, "execution")


def test_new_envelope_rejects_what_cannot_be_a_payload_or_a_key():
    with pytest.raises(TypeError, match="not an Envelope payload"):
        codec.new_envelope("t", 0, pb.QueryOptions())
    with pytest.raises(ValueError, match="trajectory id"):
        codec.new_envelope("", 0, pb.Query())


def test_encode_decode_round_trip_and_key():
    env = codec.new_envelope("traj-9", 1, pb.Query(query="2+2?", ground_truth="4"))
    back = codec.decode(codec.encode(env))
    assert back == env
    assert codec.payload(back).query == "2+2?"
    assert codec.record_key(env) == b"traj-9"


@pytest.mark.parametrize("value, message", [
    (None, "empty"), (b"", "empty"), (b"\xff\xff\xff", "not an agentflow.v1.Envelope"),
    (b"not a protobuf at all", "not an agentflow.v1.Envelope"),
    (pb.Envelope(trajectory_id="t").SerializeToString(), "no payload"),
    (pb.Envelope(query=pb.Query(query="q")).SerializeToString(), "no trajectory_id"),
    (pb.Envelope(trajectory_id="t", schema_version=codec.SCHEMA_VERSION + 1, query=pb.Query()).SerializeToString(),
     "newer"),
])
def test_decode_rejects_bad_values(value, message):
    with pytest.raises(DecodeError, match=message) as info:
        codec.decode(value)
    assert info.value.reason == "invalid_input"


def test_stamp_fills_only_what_is_missing():
    env = codec.stamp(pb.Envelope(trajectory_id="t", step=4, answer=pb.Answer(answer="42")))
    assert (env.stage, env.event_id, env.schema_version) == ("answer", "t:4:answer", codec.SCHEMA_VERSION)
    assert env.produced_at_unix_ms > 0
    kept = codec.stamp(pb.Envelope(trajectory_id="t", event_id="custom", produced_at_unix_ms=7, answer=pb.Answer()))
    assert (kept.event_id, kept.produced_at_unix_ms) == ("custom", 7)


def test_trace_context_travels_in_headers():
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("produce") as span:
        headers = codec.trace_headers(headers=[("origin", b"gateway"), ("traceparent", b"stale")])
    names = [k for k, _ in headers]
    assert names.count("traceparent") == 1 and ("origin", b"gateway") in headers
    assert all(isinstance(v, bytes) for _, v in headers)
    from opentelemetry import trace

    extracted = trace.get_current_span(codec.trace_context(headers)).get_span_context()
    assert extracted.trace_id == span.get_span_context().trace_id
    assert extracted.span_id == span.get_span_context().span_id
    assert extracted.is_remote


def test_no_trace_context_means_an_empty_one():
    from opentelemetry import trace

    assert not trace.get_current_span(codec.trace_context(None)).get_span_context().is_valid
    assert not trace.get_current_span(codec.trace_context([("x", b"y")])).get_span_context().is_valid
    assert codec.trace_headers() == []  # nothing to inject outside a span


def test_kafka_checksums_use_the_c_crc32c():
    """kafka-python checksums every produced and fetched batch with CRC-32C; without the `crc32c` extension (the
    `kafka-python[crc32c]` extra) it falls back to pure Python, ~2000x slower, which was ~10 % of the ring's step."""
    from kafka.record import util

    assert util.crc32c_c is not None, "pip install 'kafka-python[crc32c]'"
    assert util.calc_crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
