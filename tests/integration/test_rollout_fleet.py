"""The rollout fleet, and routing around a dead endpoint, on real servers: a rollout controller drives a production ``serve-llm`` (the local backend)
and a second one as the fleet (its admin API); its routing tables go to a real routing client (``RoutedEngine``),
whose calls go over HTTP. Each server answers with its own name and the version that served (scripted engines: the
weights do not matter here, where each call goes does). The lora fleet on serve-llm's and on vLLM's runtime LoRA API:
``lora_fleet`` in tests/integration/test_routing_backends.py."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry

from agentflow.llm.base import Sampling
from agentflow.llm.openai_engine import OpenAIEngineConfig
from agentflow.llm.routing import Route, RoutedEngine, RoutingTable
from agentflow.llm.scripted import ScriptedEngine
from agentflow.llm.server import make_server, serve_in_background
from agentflow.llm.versions import Versions
from agentflow.proto.v1 import events_pb2 as pb
from agentflow.rollout.backends import LocalBackend, Version
from agentflow.rollout.controller import RolloutController
from agentflow.rollout.fleet import RolloutFleet, fleet_server
from agentflow.rollout.metrics import RolloutMetrics
from agentflow.rollout.settings import RolloutSettings

ADMIN = "admin-secret"
HI = [{"role": "user", "content": "hi"}]


def _server(label: str):
    """serve-llm starting with v000000; a version loads from any URI except one under /refused."""

    def load(name: str, uri: str):
        if uri.startswith("/refused"):
            raise ValueError(f"{uri} is not a model folder")
        return ScriptedEngine([label], version=name)

    versions = Versions(load, close_grace_s=0.1)
    versions.add("v000000", "/store/v000000", engine=ScriptedEngine([label], version="v000000"))
    httpd = make_server(versions, "planner", admin_token=ADMIN)
    serve_in_background(httpd)
    return httpd, versions, f"http://127.0.0.1:{httpd.server_address[1]}"


@pytest.fixture
def started():
    started = [_server("production"), _server("fleet")]
    yield started
    for httpd, versions, _ in started:
        httpd.shutdown()
        httpd.server_close()
        versions.close()


@pytest.fixture
def servers(started):
    return [url for _, _, url in started]


def _admin_versions(url: str) -> dict[str, int]:
    body = httpx.get(url + "/admin/versions", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    return {v["name"]: v["weight"] for v in body["versions"]}


def test_rollouts_run_on_the_newest_version_and_users_never_reach_the_fleet(servers):
    production, fleet_url = servers
    client = RoutedEngine(OpenAIEngineConfig(endpoint=production + "/v1", retries=0), "planner",
                          allowed_endpoints=("http://127.0.0.1:*",))
    settings = RolloutSettings(llm_url=production, min_samples=1000, canary_percent=10, steps="10,100")
    fleet = RolloutFleet(fleet_server("local", fleet_url, token=ADMIN), 2)
    controller = RolloutController(settings, LocalBackend(production, token=ADMIN), sink=lambda _: None,
                                   fleet=fleet, stable=Version("v000000", "/store/v000000"),
                                   metrics=RolloutMetrics(CollectorRegistry()),
                                   routes=lambda env: client.update(RoutingTable.from_proto(env.planner_routing)))
    controller.tick()

    def publish(n: int, uri: str = "") -> None:
        controller.on_version(pb.PlannerVersion(version=f"v{n:06d}", checkpoint_uri=uri or f"/store/v{n:06d}"))
        controller.tick()

    def call(**sampling) -> tuple[str, str]:
        completion = client.complete(HI, Sampling(max_tokens=2, **sampling), timeout=10, key="t")
        return completion.text, completion.model_version

    for n in range(4):
        publish(n)
    # the fleet holds the newest two; v000001 is production's canary, v000002 and v000003 production never loaded
    assert set(_admin_versions(fleet_url)) == {"v000002", "v000003"}
    assert client.table.fleet_versions == ("v000003", "v000002") and client.table.latest == "v000003"
    assert call(model_version="latest") == ("fleet", "v000003")
    assert call(model_version="v000002") == ("fleet", "v000002")
    assert call(model_version="latest", trajectory_version="v000002") == ("fleet", "v000002")  # a rollout stays
    # users' traffic: production's versions only, even for a trajectory that names a fleet version
    for _ in range(20):
        assert call()[0] == "production"
    route, _ = client.route("t", Sampling(trajectory_version="v000003"))  # production's pin endpoint, if any
    assert not route.endpoint.startswith(fleet_url)
    # a version the fleet cannot load is skipped; the next one loads
    publish(4, uri="/refused/v000004")
    assert client.table.fleet_versions == ("v000003", "v000002")
    publish(5)
    assert client.table.fleet_versions == ("v000005", "v000003")
    assert set(_admin_versions(fleet_url)) == {"v000005", "v000003"}
    assert call(model_version="latest") == ("fleet", "v000005")
    client.close()


def test_a_dead_canary_endpoint_costs_no_turn(servers, tiny_model_dir, tmp_path):
    """The canary on a serve-llm process of its own, killed (SIGKILL) mid-run: each turn routed to it is made again
    on the stable version and recorded so (the trajectory is mixed, and the controller leaves it out)."""
    import os
    import signal

    from agentflow.services.cluster import Cluster

    production = servers[0]
    cluster = Cluster(log_dir=tmp_path)
    try:
        canary = cluster.spawn("llm-canary", ["serve-llm", "--model", str(tiny_model_dir), "--version", "v000001"],
                               180).info["url"]
        client = RoutedEngine(OpenAIEngineConfig(endpoint=production + "/v1", retries=0), "planner",
                              allowed_endpoints=("http://127.0.0.1:*",))
        routes = (Route("v000001", canary, "v000001", 50), Route("v000000", production + "/v1", "v000000", 50))
        assert client.update(RoutingTable(deployment="planner", routes=routes, stable="v000000", canary="v000001"))
        keys = [f"traj-{i}" for i in range(30)]

        def versions(**sampling) -> set[str]:
            return {client.complete(HI, Sampling(max_tokens=2, **sampling), timeout=30, key=k).model_version
                    for k in keys}

        assert versions() == {"v000001", "v000000"}
        os.killpg(cluster.children[0].process.pid, signal.SIGKILL)
        cluster.children[0].process.wait(30)
        assert versions() == {"v000000"}
        assert versions(trajectory_version="v000001") == {"v000000"}  # a later turn of a trajectory on the canary
        client.close()
    finally:
        cluster.stop()
