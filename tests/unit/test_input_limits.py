"""The limits every query and record must keep: one check (``flow.loop.check_query``) for the gateway and the memory
service, bounded dead letters, and the record-size settings of the bus. No broker needed."""

import hashlib
import math
from types import SimpleNamespace

import pytest

from agentflow.bus import codec, topics
from agentflow.bus.config import BusConfig
from agentflow.bus.worker import dead_letter
from agentflow.errors import InvalidInput
from agentflow.flow.loop import LoopConfig, check_query
from agentflow.proto.v1 import events_pb2 as pb
from agentflow.proto.v1 import modules_pb2
from agentflow.services.memory import MemoryService

NAN, INF = math.nan, math.inf


def query(text="What is 2 + 2?", **options) -> pb.Query:
    return pb.Query(query=text, options=pb.QueryOptions(**options))


@pytest.mark.parametrize("options", [
    {"max_time_s": NAN}, {"max_time_s": INF}, {"max_time_s": -INF}, {"max_time_s": -1.0}, {"max_time_s": 901.0},
    {"max_steps": -1}, {"max_steps": 21}, {"max_steps": 2**31 - 1},
    {"temperature": NAN}, {"temperature": INF}, {"temperature": -0.1}, {"temperature": 2.5},
    {"top_p": NAN}, {"top_p": 0.0}, {"top_p": -1.0}, {"top_p": 1.5},
    {"max_tokens": -1}, {"max_tokens": 2049}, {"max_tokens": 2**31 - 1},
    {"seed": -1},
])
def test_every_numeric_option_is_range_checked(options):
    name = next(iter(options))
    with pytest.raises(InvalidInput, match=f"options.{name} must be in"):
        check_query(query(**options), LoopConfig())


@pytest.mark.parametrize("options", [
    {}, {"max_time_s": 0.0}, {"max_time_s": 900.0}, {"max_steps": 20}, {"temperature": 0.0}, {"temperature": 2.0},
    {"top_p": 1.0}, {"top_p": 0.01}, {"max_tokens": 2048}, {"seed": 0}, {"seed": 2**63 - 1},
])
def test_values_within_the_limits_pass(options):
    assert check_query(query("  hi  ", **options), LoopConfig()) == "hi"


@pytest.mark.parametrize("bad, message", [
    (pb.Query(query=""), "query is empty"),
    (pb.Query(query="   "), "query is empty"),
    (pb.Query(query="x" * (64 * 1024 + 1)), "the limit is 65536"),
    (pb.Query(query="hi", source="bogus"), "source must be one of"),
    (pb.Query(query="hi", source="training"), "needs a group_id"),
    (pb.Query(query="hi", ground_truth="x" * (64 * 1024 + 1)), "ground_truth is over"),
    (pb.Query(query="hi", deadline_unix_ms=-5), "deadline_unix_ms must not be negative"),
])
def test_text_source_and_ground_truth_are_checked(bad, message):
    with pytest.raises(InvalidInput, match=message):
        check_query(bad, LoopConfig())


def _branch(tid="t1", turn=1, source="training", **options) -> pb.Query:
    return pb.Query(query="hi", source=source, group_id="g", branch=pb.BranchPoint(trajectory_id=tid, turn=turn),
                    options=pb.QueryOptions(**options))


@pytest.mark.parametrize("bad, message", [
    (_branch(source="traffic"), "a branch is a training rollout"),
    (_branch(tid=""), "branch.trajectory_id must be 1 to 128 printable"),
    (_branch(tid="x" * 129), "branch.trajectory_id must be 1 to 128 printable"),
    (_branch(tid="a\nb"), "branch.trajectory_id must be 1 to 128 printable"),
    (_branch(turn=0), "branch.turn must be from 1"),
    (_branch(turn=-1), "branch.turn must be from 1"),
    (_branch(turn=3), r"to max_steps - 1 \(2\), got 3"),  # the default max_steps is 3
    (_branch(turn=5, max_steps=5), r"to max_steps - 1 \(4\), got 5"),
])
def test_a_branch_is_a_training_rollout_from_a_turn_before_the_last_step(bad, message):
    with pytest.raises(InvalidInput, match=message):
        check_query(bad, LoopConfig(max_steps=3))
    assert check_query(_branch(turn=2), LoopConfig(max_steps=3)) == "hi"


def test_the_limits_are_settings_and_validated():
    assert check_query(query(max_steps=50), LoopConfig(max_steps_limit=50)) == "What is 2 + 2?"
    for bad in ({"max_time_s": NAN}, {"max_time_limit_s": INF}, {"max_steps_limit": 0}, {"max_tokens_limit": 0}):
        with pytest.raises(InvalidInput):
            LoopConfig(**bad)


def test_the_memory_service_turns_a_query_that_skipped_the_gateway_into_an_error_record():
    service = MemoryService(LoopConfig())
    outputs = service.handle(codec.new_envelope("t-nan", 0, query(max_time_s=NAN)))
    [(topic, envelope)] = [o for o in outputs if o[0] == topics.TRAJECTORIES]
    record = envelope.trajectory
    assert record.status == "error" and "options.max_time_s must be in" in record.error
    assert record.trajectory_id == "t-nan" and not [o for o in outputs if o[0] == topics.MEMORY_UPDATED]
    assert service.Get(modules_pb2.MemoryGetRequest(trajectory_id="t-nan"), None).finished
    # an oversized one keeps only the start of its text
    outputs = service.handle(codec.new_envelope("t-big", 0, query("y" * 200_000)))
    record = next(e.trajectory for t, e in outputs if t == topics.TRAJECTORIES)
    assert record.status == "error" and len(record.query) == 1000 and "max_query_bytes" in record.error
    # a good one starts its first step
    outputs = service.handle(codec.new_envelope("t-ok", 0, query(max_time_s=30.0)))
    assert [t for t, _ in outputs] == [topics.MEMORY_UPDATED, topics.MEMORY_CHANGELOG]


def test_a_directly_injected_deadline_is_capped_at_the_time_limit():
    service = MemoryService(LoopConfig(max_time_limit_s=60.0))
    outputs = service.handle(codec.new_envelope("t-far", 0, pb.Query(query="hi", deadline_unix_ms=2**62)))
    update = outputs[0][1].memory_updated
    assert 0 < update.time_left_s <= 60.0


@pytest.mark.parametrize("token", ["abc", "-5", "1e3", "١٢", "9" * 40, " 1"])
def test_a_bad_page_token_is_invalid_input(token):
    service = MemoryService(LoopConfig())
    with pytest.raises(InvalidInput, match="page_token"):
        service.List(modules_pb2.MemoryListRequest(page_token=token), None)
    with pytest.raises(InvalidInput, match="page_size"):
        service.List(modules_pb2.MemoryListRequest(page_size=-1), None)


def test_list_pages_with_its_own_tokens():
    service = MemoryService(LoopConfig())
    for i in range(5):
        service.handle(codec.new_envelope(f"t{i}", 0, query()))
    first = service.List(modules_pb2.MemoryListRequest(page_size=3), None)
    rest = service.List(modules_pb2.MemoryListRequest(page_size=3, page_token=first.next_page_token), None)
    assert len(first.trajectories) == 3 and len(rest.trajectories) == 2 and not rest.next_page_token


# --- records and dead letters ---------------------------------------------------------------------------------------


def record(value: bytes, key: bytes = b"k") -> SimpleNamespace:
    return SimpleNamespace(topic="queries", partition=2, offset=41, key=key, value=value)


def test_a_dead_letter_keeps_a_bounded_prefix_and_a_reference_to_the_record():
    value = bytes(range(256)) * 20_000  # 5 MB
    letter = dead_letter(record(value, key=b"q" * 5000), ValueError("x" * 10_000), 0, None, "w@h:1", 65536)
    dead = letter.dead_letter
    assert dead.value == value[:65536] and dead.value_truncated and dead.value_size == len(value)
    assert dead.value_sha256 == hashlib.sha256(value).hexdigest()
    assert (dead.origin_topic, dead.partition, dead.offset) == ("queries", 2, 41)
    assert len(dead.key) == 1024 and len(letter.trajectory_id) == 1024 and len(dead.error) == 4000
    assert letter.event_id == "deadletter:queries:2:41"
    assert len(codec.encode(codec.stamp(letter))) < 80_000  # fits in a record whatever the poison was


def test_a_small_poison_record_is_kept_whole():
    letter = dead_letter(record(b"\xff not protobuf"), ValueError("bad"), 0, None, "w", 65536)
    dead = letter.dead_letter
    assert dead.value == b"\xff not protobuf" and not dead.value_truncated and dead.value_size == 14
    assert letter.trajectory_id == "k" and dead.error == "ValueError: bad"


def test_the_record_limit_sets_every_client_limit_together():
    config = BusConfig(max_record_bytes=2_000_000)
    assert config.producer_options()["max_request_size"] == 2_000_000 + 16 * 1024
    consumer = config.consumer_options("g")
    assert consumer["max_partition_fetch_bytes"] == 2_000_000 + 16 * 1024
    assert consumer["fetch_max_bytes"] >= consumer["max_partition_fetch_bytes"]
    assert topics.topic_configs(topics.QUERIES, config)["max.message.bytes"] == str(2_000_000 + 16 * 1024)
    assert BusConfig.from_env(environ={"AGENTFLOW_KAFKA_MAX_RECORD_BYTES": "200000"}).max_record_bytes == 200_000


@pytest.mark.parametrize("settings, name", [
    ({"max_record_bytes": 100}, "max_record_bytes"), ({"max_record_bytes": 10**10}, "max_record_bytes"),
    ({"dead_letter_value_bytes": -1}, "dead_letter_value_bytes"),
    ({"max_record_bytes": 100_000, "dead_letter_value_bytes": 60_000}, "dead_letter_value_bytes"),
])
def test_record_limits_are_validated(settings, name):
    with pytest.raises(InvalidInput, match=name):
        BusConfig(**settings)
