"""The versions contract (agentflow/versions.py): names, reading them back, and the newest planner.versions
announcement."""

import pytest

from agentflow.bus.clients import Received
from agentflow.bus.codec import encode, new_envelope
from agentflow.errors import InvalidInput
from agentflow.proto.v1 import events_pb2
from agentflow.versions import (MAX_VERSION_NAME, check_version_name, newest_announcement, parse_version,
                                version_name)


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


@pytest.mark.parametrize("name", ["v000012", "planner-v12", "step.3", "ns:v1_a", "A" * MAX_VERSION_NAME])
def test_usable_version_names_pass(name):
    assert check_version_name(name) == name


@pytest.mark.parametrize("name", ["", "v1\r\nSet-Cookie: x=1", "v1\n", "v1\x00", "v1\t", "v1 2", "v\u00e9", "v1\u2028",
                                  "v/1", "../v1", ".v1", "-v1", "a" * (MAX_VERSION_NAME + 1), 12, None, b"v1"])
def test_other_version_names_are_refused(name):
    with pytest.raises(InvalidInput, match="a version name must be"):
        check_version_name(name)


def decision(action: str, version: str, stable: str = ""):
    return events_pb2.RolloutDecision(action=action, version=version, stable_version=stable)


def test_served_follows_the_controllers_decisions():
    """The versions the trainer must not prune: stable, canary, and the last few withdrawn (draining)."""
    from agentflow.versions import DRAINING, Served

    served = Served()
    steps = [
        (decision("canary", "v000005", "v000000"), {0, 5}),
        (decision("queue", "v000006", "v000000"), {0, 5}),  # the canary goes on
        (decision("step", "v000005", "v000000"), {0, 5}),
        (decision("promote", "v000005", "v000000"), {5, 0}),  # v0 drains
        (decision("canary", "v000008", "v000005"), {5, 8, 0}),
        (decision("rollback", "v000008", "v000005"), {5, 8, 0}),  # v8 drains too
        (decision("reject", "injected-bad", "v000005"), {5, 8, 0}),  # not a version: nothing to keep
        (decision("skip", "v000006", "v000005"), {5, 8, 0}),
    ]
    for event, expected in steps:
        served = served.after(event)
        assert served.versions() == expected, (event.action, served)
    for n in range(10, 10 + 2 * DRAINING, 2):  # promotions in a row: only the last DRAINING withdrawn stay
        served = served.after(decision("canary", f"v{n:06d}", "")).after(decision("promote", f"v{n:06d}", ""))
    assert served.stable == 10 + 2 * DRAINING - 2 and len(served.draining) == DRAINING
