"""Routing by trajectory (agentflow.llm.routing): the table's rules, the routing client over HTTP (httpx transports
that answer like serve-llm), and the attribution of 1,000 trajectories through a real rollout controller that
promotes one canary and rolls another back mid-run."""

from __future__ import annotations

import json
import random
from collections import Counter

import httpx
import pytest
from prometheus_client import CollectorRegistry

from agentflow.errors import EngineError, InvalidInput
from agentflow.llm.base import Sampling
from agentflow.llm.openai_engine import OpenAIEngine, OpenAIEngineConfig
from agentflow.llm.routing import Route, RoutedEngine, RoutingTable, bucket, check_table
from agentflow.rollout.backends import BackendStatus, Endpoint, ServedVersion, Version
from agentflow.rollout.controller import RolloutController
from agentflow.rollout.metrics import RolloutMetrics
from agentflow.rollout.settings import RolloutSettings

URL = "http://llm.test/v1"
MESSAGES = [{"role": "user", "content": "hi"}]


def table(*routes, **fields) -> RoutingTable:
    return RoutingTable(deployment="planner", routes=tuple(Route(v, URL, v, w) for v, w in routes), **fields)


class Server:
    """Answers chat calls like serve-llm: the version named by the pin header (else the model), if loaded."""

    def __init__(self, *loaded: str):
        self.loaded = set(loaded)
        self.calls: list[tuple[str, str, str]] = []  # (host, model, pin)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        version = request.headers.get("x-model-version-pin") or body["model"]
        self.calls.append((request.url.host, body["model"], request.headers.get("x-model-version-pin", "")))
        if version not in self.loaded:
            return httpx.Response(404, json={"error": {"message": f"version {version!r} is not loaded"}})
        return httpx.Response(200, headers={"x-model-version": version},
                              json={"model": "agentflow", "choices": [{"message": {"content": "ok"},
                                                                       "finish_reason": "stop"}]})


def engine(server: Server, **kwargs) -> RoutedEngine:
    return RoutedEngine(OpenAIEngineConfig(endpoint=URL, model="agentflow", retries=0), "planner",
                        transport=httpx.MockTransport(server), **kwargs)


def call(e, key="t1", **sampling) -> str:
    return e.complete(MESSAGES, Sampling(**sampling), timeout=5, key=key).model_version


# --- the table --------------------------------------------------------------------------------------------------------


def test_a_trajectory_id_picks_a_band_and_the_canary_takes_the_low_buckets():
    keys = [f"t{i}" for i in range(2000)]
    t10, t50 = table(("v2", 10), ("v1", 90)), table(("v2", 50), ("v1", 50))
    on_canary_10 = {k for k in keys if t10.pick(k).version == "v2"}
    on_canary_50 = {k for k in keys if t50.pick(k).version == "v2"}
    assert on_canary_10 == {k for k in keys if bucket(k) < 10}
    assert on_canary_10 < on_canary_50  # a growing canary only takes trajectories from the stable version
    assert 0.07 < len(on_canary_10) / len(keys) < 0.13
    assert all(table(("v1", 100), ("v2", 0)).pick(k).version == "v1" for k in keys)  # weight 0: never by hash


@pytest.mark.parametrize("routes, fields, message", [
    ([("v1", 60), ("v2", 30)], {}, "must sum to 100, got 90"),
    ([("v1", 100), ("v1", 0)], {}, "unique"),
    ([], {}, "1 to 16 routes"),
    ([("v1", 101), ("v2", -1)], {}, "integer percent"),
])
def test_a_bad_table_is_refused_saying_why(routes, fields, message):
    with pytest.raises(InvalidInput, match=message):
        check_table(table(*routes, **fields))


def test_endpoints_must_be_allowed_plain_http_urls():
    allowed = ("http://llm.test/*",)
    check_table(table(("v1", 100)), allowed)
    for url in ("http://evil.test/v1", "file:///etc/passwd", "http://user:pw@llm.test/v1"):
        bad = RoutingTable("planner", (Route("v1", url, "m", 100),))
        with pytest.raises(InvalidInput, match="endpoint"):
            check_table(bad, allowed)
    smuggled = RoutingTable("planner", (Route("v1", "http://llm.test:80.evil.test/v1", "m", 100),))
    with pytest.raises(InvalidInput, match="bad port"):  # a host in the port would match "http://llm.test:*"
        check_table(smuggled, ("http://llm.test:*",))
    with pytest.raises(InvalidInput, match="pin endpoint"):
        check_table(table(("v1", 100), pin_endpoint="http://evil.test/v1"), allowed)


def test_pins_go_to_their_route_then_the_pin_endpoint_else_are_refused():
    t = table(("v2", 10), ("v1", 90), latest="v3")
    assert t.find("v1").version == "v1"
    assert t.find("latest") is None  # v3 is published but nothing serves it, and there is no pin endpoint
    with_pins = table(("v2", 10), ("v1", 90), latest="v3", pin_endpoint="http://llm.test/v1")
    assert with_pins.find("latest") == Route("v3", "http://llm.test/v1", "", 0)
    assert table(("v2", 10), ("v1", 90)).find("latest").version == "v2"  # no latest named: the newest routed


# --- the routing client -----------------------------------------------------------------------------------------------


def test_without_a_table_calls_go_to_the_configured_endpoint():
    server = Server("agentflow")
    e = engine(server)
    assert e.table is None and call(e) == "agentflow"
    assert server.calls == [("llm.test", "agentflow", "")]


def test_calls_follow_the_table_and_record_the_version_it_named():
    server = Server("v1", "v2")
    e = engine(server)
    assert e.update(table(("v2", 50), ("v1", 50)))
    versions = {key: call(e, key) for key in (f"t{i}" for i in range(40))}
    assert versions == {key: ("v2" if bucket(key) < 50 else "v1") for key in versions}
    assert all(model == pin for _, model, pin in server.calls)  # the model name and the pin both name the version


def test_a_trajectory_stays_on_its_version_when_the_weights_move_and_pins_name_a_version():
    server = Server("v1", "v2")
    e = engine(server)
    e.update(table(("v2", 10), ("v1", 90), latest="v2"))
    key = next(k for k in (f"t{i}" for i in range(100)) if 10 <= bucket(k) < 50)
    first = call(e, key)
    assert first == "v1"
    e.update(table(("v2", 50), ("v1", 50), latest="v2", decided_at_unix_ms=1))
    assert call(e, key) == "v2"  # a new trajectory with this id would start on the canary now ...
    assert call(e, key, trajectory_version=first) == "v1"  # ... but this one is kept on its version
    assert call(e, key, model_version="latest") == "v2"
    assert call(e, key, model_version="latest", trajectory_version="v1") == "v1"  # on-policy for the whole trajectory
    with pytest.raises(EngineError, match="not served by deployment planner") as info:
        call(e, key, model_version="v7")
    assert info.value.reason == "not_found"


def test_a_bad_or_foreign_or_stale_table_leaves_the_previous_one_in_force():
    server = Server("v1", "v2")
    e = engine(server, allowed_endpoints=("http://llm.test/*",))
    good = table(("v1", 100), decided_at_unix_ms=10)
    assert e.update(good)
    assert not e.update(table(("v2", 60), ("v1", 30), decided_at_unix_ms=11))  # does not sum to 100
    assert not e.update(RoutingTable("planner", (Route("v2", "http://evil.test/v1", "v2", 100),),
                                     decided_at_unix_ms=12))  # an endpoint that is not allowed
    assert not e.update(RoutingTable("other", (Route("v2", URL, "v2", 100),), decided_at_unix_ms=13))
    assert not e.update(table(("v2", 100), decided_at_unix_ms=5))  # older than the one in force
    assert e.table is good and call(e) == "v1"
    assert all(host == "llm.test" for host, _, _ in server.calls)


def test_a_server_that_reports_another_version_is_recorded_as_it_reported():
    def handler(request):
        return httpx.Response(200, headers={"x-model-version": "v9"},
                              json={"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]})

    e = RoutedEngine(OpenAIEngineConfig(endpoint=URL, retries=0, model="m"), "planner",
                     transport=httpx.MockTransport(handler))
    e.update(table(("v1", 100)))
    before = e.metrics.mismatches._value.get()
    assert call(e) == "v9"
    assert e.metrics.mismatches._value.get() == before + 1


# --- attribution: 1,000 trajectories through the routing client and a real controller ----------------------------------


class RoutedBackend:
    """The serving side: one server holding every loaded version (``Server.loaded``), addressed by model name."""

    kind, target = "local", "test"

    def __init__(self, server: Server):
        self.server = server
        self.uris = {"v1": "file:///v1"}
        self.retired: list[str] = []

    def status(self):
        return BackendStatus(tuple(ServedVersion(n, u, 100 if n == "v1" else 0) for n, u in self.uris.items()))

    def endpoint(self, version):
        return Endpoint(URL, version.name)

    def load_canary(self, canary, stable, percent):
        self.uris[canary.name] = canary.uri
        self.server.loaded.add(canary.name)

    def set_percent(self, canary, stable, percent):
        pass

    def promote(self, canary, stable):
        pass

    def rollback(self, canary, stable):
        pass

    def retire(self, version):
        self.server.loaded.discard(version.name)
        self.retired.append(version.name)


REWARD_P = {"v1": 0.5, "v2": 0.95, "v3": 0.0}  # v2 is better than the stable v1, v3 is degraded


def drive(n=1000, in_flight=25, seed=7):
    """Trajectories of 2-5 planner calls, ``in_flight`` at a time, interleaved call by call, each call made as the
    loop makes it (the first by trajectory id, the later ones kept on the first one's version); finished ones go to
    the controller, whose routing tables go to the client. v2 is published at the start, v3 once v2 is promoted."""
    from agentflow.bus.codec import new_envelope  # noqa: F401  (the controller's envelopes)
    from agentflow.llm.routing import RoutingTable as Table

    rng = random.Random(seed)
    server = Server("v1")
    client = engine(server)
    now = [1_000_000.0]
    settings = RolloutSettings(min_samples=15, alpha=0.05, reward_margin=0.1, error_margin=0.25, latency_ratio=10,
                               canary_percent=10, steps="10,100",
                               drain_s=30.0, latency_cap_s=10.0, serving_url=URL)
    backend = RoutedBackend(server)
    decisions: list = []
    controller = RolloutController(settings, backend, sink=decisions.append, clock=lambda: now[0],
                                   metrics=RolloutMetrics(CollectorRegistry()), stable=Version("v1", "file:///v1"),
                                   routes=lambda env: client.update(Table.from_proto(env.planner_routing)))
    controller.tick()  # the first table: v1 alone
    controller.on_version(_version("v2"))
    live, started, finished = [], 0, []
    published_v3 = False
    while started < n or live:
        while started < n and len(live) < in_flight:
            live.append({"id": f"traj-{started}", "calls": rng.randint(2, 5), "versions": [], "at": now[0],
                         "canary": controller.rollout.canary.name if controller.rollout and
                         controller.rollout.ready else ""})
            started += 1
        trajectory = rng.choice(live)
        kept = trajectory["versions"][0] if trajectory["versions"] else ""
        trajectory["versions"].append(call(client, trajectory["id"], trajectory_version=kept))
        if len(trajectory["versions"]) == trajectory["calls"]:
            live.remove(trajectory)
            finished.append(trajectory)
            now[0] += 0.5
            controller.on_trajectory(_record(trajectory, rng))
            if len(finished) % 10 == 0:
                controller.tick()
        if not published_v3 and any(d.rollout_decision.action == "promote" for d in decisions):
            controller.on_version(_version("v3"))
            published_v3 = True
    return finished, [(d.rollout_decision.version, d.rollout_decision.action) for d in decisions], backend


def _version(name):
    from agentflow.proto.v1 import events_pb2 as pb

    return pb.PlannerVersion(version=name, checkpoint_uri=f"file:///{name}")


def _record(trajectory, rng) -> dict:
    version = trajectory["versions"][0]
    return {"trajectory_id": trajectory["id"], "status": "answered", "started_at_unix": trajectory["at"],
            "turns": [{"step": i, "planner": {"model_version": v}} for i, v in enumerate(trajectory["versions"])],
            "rewards": [{"value": float(rng.random() < REWARD_P[version]), "source": "rule"}],
            "totals": {"latency_s": 1.0}}


def per_request_split(calls: list[int], percent: int, seed=7) -> float:
    """The share of trajectories entirely on the canary when the server splits every request by weight (KServe's
    canaryTrafficPercent), through a real client against a server that does so."""
    rng = random.Random(seed)

    def handler(request):
        version = "canary" if rng.random() < percent / 100 else "stable"
        return httpx.Response(200, headers={"x-model-version": version},
                              json={"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]})

    client = OpenAIEngine(OpenAIEngineConfig(endpoint=URL, model="planner", retries=0),
                          transport=httpx.MockTransport(handler))
    whole = 0
    for k in calls:
        served = {client.complete(MESSAGES, Sampling(), timeout=5, key="x").model_version for _ in range(k)}
        whole += served == {"canary"}
    return whole / len(calls)


def test_1000_trajectories_none_mixed_the_canary_share_within_binomial_bounds_with_a_promotion_and_a_rollback():
    finished, decisions, backend = drive()
    assert ("v2", "promote") in decisions and ("v3", "rollback") in decisions, decisions
    mixed = [t["id"] for t in finished if len(set(t["versions"])) > 1]
    assert len(finished) == 1000 and mixed == []
    # while a 10 % canary ran (and was routed when the trajectory started), its share of the trajectories
    during = [t for t in finished if t["canary"]]
    on_canary = sum(t["versions"][0] == t["canary"] for t in during)
    n, share = len(during), on_canary / len(during)
    bound = 3 * (0.1 * 0.9 / n) ** 0.5  # three standard deviations of a binomial share
    per_request = per_request_split([t["calls"] for t in during], 10)
    expected = sum(0.1 ** t["calls"] for t in during) / n
    print(f"\nattribution over {n} trajectories during a 10% canary: by trajectory {share:.3f} of trajectories "
          f"whole on the canary (0 mixed of {len(finished)}); per-request split {per_request:.4f} "
          f"(expected mean 0.1^k = {expected:.4f}); decisions {decisions}")
    assert abs(share - 0.1) <= bound, (share, n)
    assert per_request < 0.02  # the old way: almost no trajectory counts for the canary
    assert backend.retired == ["v1", "v3"]  # withdrawn versions retired after their drain, not before
    assert Counter(t["versions"][0] for t in finished)["v3"] > 0


# --- routing that survives a dead controller or a dead endpoint ---------------------------------------------------------


def test_an_expired_table_sends_everything_to_the_stable_version():
    import time

    server = Server("v1", "v2")
    e = engine(server)
    now_ms = int(time.time() * 1000)
    assert e.update(table(("v2", 50), ("v1", 50), stable="v1", canary="v2", expires_at_unix_ms=now_ms - 1,
                          decided_at_unix_ms=now_ms - 10))
    assert {call(e, key=f"t{i}") for i in range(40)} == {"v1"}  # half of them would hash to v2
    assert call(e, model_version="v2") == "v1"  # pinned too: nobody watches the split any more
    assert e.route("k", Sampling())[1] == "expired"
    e.update(table(("v2", 50), ("v1", 50), stable="v1", expires_at_unix_ms=now_ms + 60_000,
                   decided_at_unix_ms=now_ms))  # renewed
    assert {call(e, key=f"t{i}") for i in range(40)} == {"v1", "v2"}


def test_a_failed_call_to_another_version_is_made_again_on_the_stable_version():
    server = Server("v1")  # v2's server lost it (or died): every call to v2 fails
    e = engine(server)
    e.update(table(("v2", 50), ("v1", 50), stable="v1", canary="v2"))
    before = e.metrics.fallbacks._value.get()
    keys = [f"t{i}" for i in range(40)]
    assert {call(e, key=k) for k in keys} == {"v1"}  # recorded as the stable version: the trajectory is mixed
    assert {call(e, key="t0", trajectory_version="v2")} == {"v1"}
    fell_back = e.metrics.fallbacks._value.get() - before
    assert fell_back == sum(e.table.pick(k).version == "v2" for k in keys) + 1 > 1
    with pytest.raises(EngineError):  # a pin wants its version
        call(e, model_version="v2")
    server.loaded.clear()
    with pytest.raises(EngineError):  # the stable version's own failure is the caller's
        call(e, key="t1")


def test_the_controller_renews_its_table_before_it_expires(monkeypatch):
    from agentflow.bus import codec

    now = [1_000_000_000]
    monkeypatch.setattr(codec, "now_ms", lambda: now[0])
    tables = []

    class OneServer:
        kind, target = "local", "one"

        def status(self):
            return BackendStatus((ServedVersion("v1", "file:///v1", 100),))

        def endpoint(self, version):
            return Endpoint(URL, version.name)

    settings = RolloutSettings(routing_ttl_s=60, tick_s=5, serving_url=URL)
    controller = RolloutController(settings, OneServer(), sink=lambda _: None, stable=Version("v1", "file:///v1"),
                                   metrics=RolloutMetrics(CollectorRegistry()),
                                   routes=lambda env: tables.append(RoutingTable.from_proto(env.planner_routing)))
    controller.tick()
    assert tables[-1].expires_at_unix_ms == now[0] + 60_000
    now[0] += 19_000
    controller.tick()
    assert len(tables) == 1  # not yet a third of the way
    now[0] += 2_000
    controller.tick()
    assert len(tables) == 2 and tables[-1].reason == "renewed" and tables[-1].routes == tables[0].routes
    assert tables[-1].expires_at_unix_ms == now[0] + 60_000
    with pytest.raises(InvalidInput, match="ROUTING_TTL_S"):
        RolloutSettings(routing_ttl_s=10, tick_s=5)


def test_the_planner_waits_for_its_first_table_then_consumes():
    """``wait_for_table`` (the planner service's prepare, before it consumes and reports SERVING): True as soon as
    a table is in force; without one, False after ``wait_s`` (calls then go to the configured endpoint)."""
    import threading
    import time
    from types import SimpleNamespace

    from services.planner import PlannerService

    engine = RoutedEngine(OpenAIEngineConfig(endpoint=URL, retries=0), "planner", wait_s=0.2)
    started = time.monotonic()
    assert engine.wait_for_table() is False and 0.2 <= time.monotonic() - started < 2
    assert engine.route("t1", Sampling()) == (None, "fallback")

    engine = RoutedEngine(OpenAIEngineConfig(endpoint=URL, retries=0), "planner", wait_s=30)
    threading.Timer(0.3, engine.update, [table(("v000001", 100))]).start()
    service = PlannerService(SimpleNamespace(planner=SimpleNamespace(engine=engine)))
    started = time.monotonic()
    service.prepare()  # returns once the table is in force, long before the 30 s bound
    assert engine.table is not None and time.monotonic() - started < 10
    PlannerService(SimpleNamespace(planner=SimpleNamespace(engine=object()))).prepare()  # no routing: no wait
