"""`latest` is the newest published or loaded version, not the name that sorts last."""

import pytest

from agentflow.errors import InvalidInput
from agentflow.llm.versions import Versions
from agentflow.storage import check_allowed


class _Engine:
    def __init__(self, name):
        self.name = name


def _versions(*names) -> Versions:
    versions = Versions(lambda name, uri: _Engine(name))
    for name in names:
        versions.add(name, "/models/" + name)
    return versions


@pytest.mark.parametrize("order,latest", [
    (("v9", "v10"), "v10"),  # a name sort says v9
    (("v000003", "v000012", "v000005"), "v000012"),  # a rollback reloads v5 last: still v12
    (("zeta", "alpha"), "alpha"),  # no numbers: the last loaded
    (("base", "v2", "canary"), "v2"),  # numbered versions rank above unnumbered ones
])
def test_latest_is_the_newest_not_the_last_name(order, latest):
    versions = _versions(*order)
    assert versions.latest() == latest and versions.route(pin="latest")[0] == latest


def test_latest_follows_unloading_and_prune_keeps_the_newest():
    versions = _versions("v9", "v10", "v11")
    versions.set_weights({"v9": 100})
    versions.close_grace_s = 0.0
    versions.remove("v11")
    assert versions.latest() == "v10"
    versions.add("v12", "/models/v12")
    assert versions.prune(keep=1) == ["v10"] and versions.names() == ["v12", "v9"]


def test_prune_keeps_a_version_still_called_with_weight_0():
    """A rolled-back canary drains with weight 0 while the trajectories on it finish: a server that follows the
    trainer's versions must not unload it under them (the routing table still sends them there)."""
    versions = _versions("v1", "v2", "v3", "v4")
    versions.set_weights({"v1": 100})
    versions.close_grace_s = 0.0
    versions.route(pin="v2")  # a trajectory's turn on the draining v2
    assert versions.prune(keep=1, unused_s=300) == ["v3"] and versions.names() == ["v1", "v2", "v4"]
    assert versions.prune(keep=1) == ["v2"]  # without the grace: idle is weight 0


@pytest.mark.parametrize("uri", ["models/v1", "./v1", "~/models/v1", "~root/v1", "/srv/models-evil/v1",
                                 "/srv/models/../etc", "http://attacker/v1", "https://attacker/v1",
                                 "s3://other/v1", "s3://bucket/models/../x", "memory://v1", "file://srv/models",
                                 "", "/srv/models\x00/v1"])
def test_uris_outside_the_allowed_roots_are_refused(uri):
    with pytest.raises(InvalidInput):
        check_allowed(uri, ["/srv/models", "s3://bucket/models/"])


@pytest.mark.parametrize("uri", ["/srv/models", "/srv/models/v000001", "file:///srv/models/v2",
                                 "s3://bucket/models/v000003"])
def test_uris_inside_the_allowed_roots_pass(uri):
    check_allowed(uri, ["/srv/models", "s3://bucket/models/"])
