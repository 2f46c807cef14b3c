"""The versions contract (agentflow/versions.py): names, reading them back, and the newest planner.versions
announcement."""

from agentflow.bus.clients import Received
from agentflow.bus.codec import encode, new_envelope
from agentflow.proto.v1 import events_pb2
from agentflow.versions import newest_announcement, parse_version, version_name


def test_parse_version():
    assert [parse_version(v) for v in (3, "3", "v3", " V3 ", "planner-v12", "step-000012", 4.0)] == [3, 3, 3, 3, 12,
                                                                                                     12, 4]
    assert [parse_version(v) for v in ("", "tiny", "v1.2", True, None, 2.5)] == [None] * 6


def test_version_names_read_back():
    assert version_name(12) == "v000012"
    assert [parse_version(version_name(n)) for n in (0, 7, 1234567)] == [0, 7, 1234567]


def announcement(offset: int, version: str, uri: str) -> Received:
    event = events_pb2.PlannerVersion(version=version, checkpoint_uri=uri)
    return Received("planner.versions", 0, offset, b"planner", encode(new_envelope("planner", offset, event)))


def test_newest_announcement():
    records = [announcement(0, "v000001", "file:///m/v000001"), announcement(1, "v000003", "file:///m/v000003"),
               announcement(2, "v000002", "file:///m/v000002"),
               announcement(3, "v000009", ""),  # no checkpoint: not a version to load
               announcement(4, "latest", "file:///m/latest"),  # no number
               Received("planner.versions", 0, 5, b"planner", b"not an envelope")]
    assert newest_announcement(records) == (3, "v000003", "file:///m/v000003")
    assert newest_announcement([]) is None
