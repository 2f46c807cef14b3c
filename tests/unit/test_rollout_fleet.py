"""The rollout fleet's bookkeeping (``agentflow.rollout.fleet.RolloutFleet``) against a scripted server, and the
routing table's fleet rules (``RoutingTable.find``, ``RoutedEngine.route``). The same against real servers:
tests/integration/test_rollout_fleet.py."""

from __future__ import annotations

import json

import pytest

from agentflow.errors import InvalidInput
from agentflow.llm.base import Sampling
from agentflow.llm.openai_engine import OpenAIEngineConfig
from agentflow.llm.routing import Route, RoutedEngine, RoutingTable, check_table
from agentflow.rollout.backends import BackendError, Version, VersionRejected
from agentflow.rollout.fleet import RolloutFleet


class Server:
    """What a fleet server holds, with scripted refusals and outages."""

    target, serving_url, model, capacity = "scripted", "http://fleet:8000/v1", "", None

    def __init__(self, loaded=()):
        self.held, self.refuse, self.down, self.calls = set(loaded), set(), False, []

    def loaded(self):
        if self.down:
            raise BackendError("connection refused")
        return set(self.held)

    def load(self, version):
        self.calls.append(("load", version.name))
        if version.name in self.refuse:
            raise VersionRejected(f"cannot load {version.name}")
        self.held.add(version.name)

    def unload(self, name):
        self.calls.append(("unload", name))
        self.held.discard(name)


def v(n: int) -> Version:
    return Version(f"v{n:06d}", f"/store/v{n:06d}")


def test_the_fleet_holds_the_newest_versions_and_unloads_the_rest():
    server, lags = Server(loaded={"v000000"}), []
    now = [100.0]
    fleet = RolloutFleet(server, 2, clock=lambda: now[0], on_loaded=lambda name, lag: lags.append((name, lag)))
    for n in range(4):
        fleet.publish(v(n), published_at_s=90.0 + n)
        fleet.sync(force=True)
    assert fleet.versions == ("v000003", "v000002") and server.held == {"v000003", "v000002"}
    assert ("unload", "v000000") in server.calls and ("unload", "v000001") in server.calls
    assert lags[-1] == ("v000003", 7.0)  # publication to loaded
    fleet.publish(v(3), published_at_s=0)  # published again: nothing to do
    assert not fleet.sync(force=True) and server.calls.count(("load", "v000003")) == 1


def test_a_refused_version_does_not_evict_an_older_one_that_loads():
    server = Server()
    fleet = RolloutFleet(server, 2)
    server.refuse = {"v000003"}
    for n in (1, 2, 3):
        fleet.publish(v(n), 0.0)
    assert fleet.sync(force=True)
    assert fleet.versions == ("v000002", "v000001")  # v3 refused: the next older takes its slot
    fleet.publish(v(4), 0.0)
    fleet.sync(force=True)
    assert fleet.versions == ("v000004", "v000002") and server.calls.count(("load", "v000003")) == 1


def test_an_outage_changes_nothing_and_a_restarted_server_is_loaded_again():
    server, now = Server(), [0.0]
    fleet = RolloutFleet(server, 2, clock=lambda: now[0], recheck_s=30)
    fleet.publish(v(1), 0.0)
    fleet.sync()
    server.down = True
    fleet.publish(v(2), 0.0)
    assert not fleet.sync(force=True) and fleet.versions == ("v000001",)  # kept as it was
    server.down = False
    now[0] = 10
    assert fleet.sync() and fleet.versions == ("v000002", "v000001")  # a wanted version missing: tried every tick
    server.held = set()  # restarted, empty
    now[0] = 20
    assert not fleet.sync()  # settled as far as it knows: the server is read again after recheck_s
    now[0] = 41
    assert not fleet.sync()  # loaded again; the table needs no change
    assert fleet.versions == ("v000002", "v000001") and server.held == {"v000001", "v000002"}


def test_slots_and_versions_are_checked():
    with pytest.raises(InvalidInput):
        RolloutFleet(Server(), 0)
    with pytest.raises(InvalidInput):
        RolloutFleet(Server(), 2).publish(Version("bad name", "/x"), 0.0)


# --- the routing table ---------------------------------------------------------------------------------------------

PROD = "http://prod:8000/v1"
FLEET = "http://fleet:8000/v1"


def table(**fields) -> RoutingTable:
    base = dict(deployment="planner", routes=(Route("v000001", PROD, "v000001", 100),), stable="v000001",
                latest="v000003", fleet_endpoint=FLEET, fleet_versions=("v000003", "v000002"))
    return RoutingTable(**{**base, **fields})


def test_only_pinned_calls_go_to_the_fleet():
    t = table()
    assert t.find("latest", pinned=True) == Route("v000003", FLEET, "v000003", 0)
    assert t.find("v000002", pinned=True).endpoint == FLEET
    assert t.find("v000001", pinned=True).endpoint == PROD  # not on the fleet: production serves it
    assert t.find("v000003") is None  # an unpinned trajectory never reaches the fleet
    assert table(latest="v000004").find("latest", pinned=True).version == "v000003"  # not loaded yet: the newest held
    engine = RoutedEngine(OpenAIEngineConfig(endpoint=PROD), "planner", allowed_endpoints=("http://*",))
    assert engine.update(t)
    assert engine.route("k", Sampling(model_version="latest")) == (Route("v000003", FLEET, "v000003", 0), "fleet")
    assert engine.route("k", Sampling(model_version="latest", trajectory_version="v000002"))[1] == "fleet"
    route, how = engine.route("k", Sampling(trajectory_version="v000003"))
    assert (route.endpoint, how) == (PROD, "hash")  # users' traffic stays on production
    engine.close()


def test_a_fleet_with_one_model_name_routes_the_version_it_holds_under_that_name():
    t = table(fleet_versions=("v000003",), fleet_model="planner-fleet")
    assert t.find("latest", pinned=True) == Route("v000003", FLEET, "planner-fleet", 0)
    assert check_table(t, allowed_endpoints=("http://*",)) == t and RoutingTable.from_proto(t.to_proto()) == t


@pytest.mark.parametrize("fields,why", [
    (dict(fleet_model="planner-fleet"), "holds one version at a time"),
    (dict(fleet_versions=("v1",), fleet_model="a b"), "version name"),
    (dict(fleet_versions=()), "both its endpoint and the versions"),
    (dict(fleet_endpoint=""), "both its endpoint and the versions"),
    (dict(fleet_versions=("v1", "v1")), "unique"),
    (dict(fleet_versions=("v1\r\nX: y",)), "version name"),
    (dict(fleet_endpoint="http://elsewhere:1/v1"), "not an allowed endpoint"),
])
def test_a_table_with_a_bad_fleet_is_rejected(fields, why):
    with pytest.raises(InvalidInput, match=why):
        check_table(table(**fields), allowed_endpoints=("http://prod:*", "http://fleet:*"))


def test_the_fleet_survives_the_wire():
    t = table()
    assert RoutingTable.from_proto(t.to_proto()) == t


def test_the_controller_builds_the_fleet_its_settings_name():
    from agentflow.rollout.fleet import AdminFleetServer, LoraFleetServer
    from agentflow.rollout.service import build_fleet
    from agentflow.rollout.settings import RolloutSettings

    assert build_fleet(RolloutSettings()) is None
    local = build_fleet(RolloutSettings(fleet_url="http://fleet:8000/v1", admin_token="secret", fleet_slots=4))
    assert isinstance(local.server, AdminFleetServer) and local.slots == 4 and local.endpoint == FLEET
    assert local.server.backend.admin.http.headers["Authorization"] == "Bearer secret"  # the admin token by default
    lora = build_fleet(RolloutSettings(backend="lora", fleet_url="http://fleet:8000", fleet_admin_token="other"))
    assert isinstance(lora.server, LoraFleetServer) and lora.server.backend.admin.http.headers["Authorization"] == \
        "Bearer other"
    with pytest.raises(InvalidInput, match="FLEET_KIND"):
        RolloutSettings(fleet_url="http://fleet:8000", fleet_kind="vllm-full")


# --- the vllm kind: full weights replaced in place (agentflow.rollout.vllm_fleet) ------------------------------------


class VllmStandIn:
    """The routes the vllm fleet calls, as a vLLM started with the agentflow_vllm plugin answers them."""

    def __init__(self, version: str = ""):
        self.calls, self.version, self.folders = [], version, set()  # folders: what is_model_folder finds

    def __call__(self, request):
        import httpx

        path = request.url.path + (f"?{request.url.query.decode()}" if request.url.query else "")
        self.calls.append(path)
        if request.headers.get("authorization") != "Bearer admin":
            return httpx.Response(401, json={"error": {"message": "admin routes need the admin bearer token"}})
        if path != "/collective_rpc":
            return httpx.Response(200, json={"status": "ok"})
        body = json.loads(request.content)
        if body["method"] == "loaded_version":
            return httpx.Response(200, json={"results": [{"version": self.version, "model": "planner-fleet"}]})
        if body["method"] == "is_model_folder":
            return httpx.Response(200, json={"results": [{"model_folder": body["args"][0] in self.folders}]})
        folder, version = body["args"]
        if "broken" in folder:
            return httpx.Response(500, json={"error": "ValueError: not an absolute path to a safetensors model "
                                                      "folder: '/store/broken'"})
        self.version = version
        return httpx.Response(200, json={"results": [version]})


def vllm_fleet(stand_in: VllmStandIn, token: str = "admin", mirror: str = ""):
    import httpx

    from agentflow.rollout.fleet import fleet_server

    server = fleet_server("vllm", "http://fleet:8000", token=token, transport=httpx.MockTransport(stand_in),
                          retries=0, mirror=mirror)
    return RolloutFleet(server, 5)


def test_the_vllm_fleet_replaces_its_weights_in_place_between_a_pause_and_a_resume():
    stand_in = VllmStandIn()
    fleet = vllm_fleet(stand_in)
    assert fleet.slots == 1  # one set of weights, whatever the settings say
    fleet.publish(v(1), published_at_s=0)
    fleet.publish(v(2), published_at_s=0)
    assert fleet.sync(force=True) and fleet.versions == ("v000002",) and fleet.model == "planner-fleet"
    assert stand_in.calls == ["/collective_rpc", "/pause?mode=wait", "/collective_rpc", "/reset_prefix_cache",
                              "/resume"]
    fleet.publish(Version("v000003", "/store/broken"), published_at_s=0)
    stand_in.calls.clear()
    assert not fleet.sync(force=True) and fleet.versions == ("v000002",)  # refused: the older one stays
    assert stand_in.calls[-2:] == ["/collective_rpc", "/resume"]  # resumed after the refusal too


def test_the_vllm_fleet_refuses_what_its_server_cannot_read_and_needs_its_token():
    from agentflow.rollout.vllm_fleet import WeightsFleetServer

    stand_in = VllmStandIn()
    fleet = vllm_fleet(stand_in)
    fleet.publish(Version("v000001", "s3://bucket/v000001"), published_at_s=0)
    fleet.sync(force=True)
    assert fleet.versions == () and "/pause?mode=wait" not in stand_in.calls  # refused before touching the server
    with pytest.raises(BackendError, match="UNAUTHENTICATED|admin token"):
        vllm_fleet(VllmStandIn(), token="wrong").server.loaded()
    with pytest.raises(BackendError, match="admin token"):
        WeightsFleetServer("http://fleet:8000", token="")


def test_with_an_object_store_the_vllm_fleet_loads_each_version_once_its_mirror_has_it():
    """A remote version loads from <mirror>/<version> (agentflow fleet-mirror's copy) once the server finds it there;
    until then nothing is paused and the routing table names the version the server holds, so ``latest`` resolves."""
    from agentflow.rollout.settings import RolloutSettings

    stand_in = VllmStandIn(version="v000000")  # started from the base's folder (AGENTFLOW_VLLM_START_VERSION)
    fleet = vllm_fleet(stand_in, mirror="/mirror/")
    fleet.publish(Version("v000003", "s3://models/planner/versions/v000003"), published_at_s=0)
    assert fleet.sync(force=True)  # not loaded, but the table now names what the server holds
    assert fleet.versions == ("v000000",) and "/pause?mode=wait" not in stand_in.calls
    table = RoutingTable("planner", (Route("v000000", "http://stable/v1", "planner", 100),), latest="v000003",
                         fleet_endpoint="http://fleet:8000/v1", fleet_versions=fleet.versions,
                         fleet_model=fleet.model)
    assert table.find("latest", pinned=True).endpoint == "http://fleet:8000/v1"  # not NOT_FOUND
    stand_in.folders.add("/mirror/v000003")
    assert fleet.sync(force=True) and fleet.versions == ("v000003",) and stand_in.version == "v000003"
    assert stand_in.calls[-4:] == ["/pause?mode=wait", "/collective_rpc", "/reset_prefix_cache", "/resume"]
    # a local version (a claim mounted at the same path) still loads from its own path, without the mirror
    fleet.publish(v(4), published_at_s=0)
    assert fleet.sync(force=True) and stand_in.version == "v000004"
    with pytest.raises(InvalidInput, match="mirror"):
        RolloutSettings(fleet_url="http://fleet:8000", fleet_kind="lora", fleet_mirror="/mirror")
    with pytest.raises(InvalidInput, match="absolute"):
        RolloutSettings(fleet_url="http://fleet:8000", fleet_kind="vllm", fleet_mirror="mirror")
