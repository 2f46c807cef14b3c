"""A degraded planner version is rolled back on reward within the same number of trajectories on every backend.

Each run: a real rollout controller on one backend, its routing tables handed to a real routing client
(``RoutedEngine``), which sends every planner call over HTTP to real ``agentflow serve-llm`` processes (the tiny
model). A trajectory is two planner calls — the first routed by its id, the second kept on the first one's version —
and its reward is 0 when the canary served it, 1 when the stable version did (a test double of the reward: the
canary is "degraded" by definition, so that every backend sees the same evidence). The trajectory ids are the same
on every backend, so are the routes (a hash of the id): the rollback must come after the same number of
canary-routed trajectories everywhere, no trajectory may mix versions, and the stable version keeps answering.
"""

from __future__ import annotations

import itertools

import pytest
from prometheus_client import CollectorRegistry

from agentflow.llm.base import Sampling
from agentflow.llm.openai_engine import OpenAIEngineConfig
from agentflow.llm.routing import RoutedEngine, RoutingTable
from agentflow.proto.v1 import events_pb2 as pb
from agentflow.rollout.backends import LocalBackend, SeparateBackend, Version
from agentflow.rollout.controller import RolloutController
from agentflow.rollout.metrics import RolloutMetrics
from agentflow.rollout.settings import RolloutSettings

ADMIN, API = "admin-secret", "api-secret"
STABLE = "v0"
MESSAGES = [{"role": "user", "content": "hi"}]
SETTINGS = dict(min_samples=12, alpha=0.05, reward_margin=0.1, error_margin=0.25, latency_ratio=10, latency_cap_s=30,
                canary_percent=25, steps="25,100", drain_s=0.0)
_canaries = itertools.count(1)


@pytest.fixture(scope="module")
def servers(tiny_model_dir, tmp_path_factory):
    """Two serve-llm processes, each starting with the base model as v0, the admin API behind a token."""
    from agentflow.services.cluster import Cluster

    cluster = Cluster(log_dir=tmp_path_factory.mktemp("llm-logs"))
    env = {"AGENTFLOW_LLM_ADMIN_TOKEN": ADMIN, "AGENTFLOW_LLM_API_TOKEN": API}
    try:
        urls = [cluster.spawn(f"llm-{slot}", ["serve-llm", "--model", str(tiny_model_dir), "--version", STABLE,
                                              "--served-name", "planner",
                                              "--allow-model-uri", str(tiny_model_dir.parent)], 180, env)
                .info["url"].removesuffix("/v1") for slot in ("a", "b")]
        yield urls, tiny_model_dir
    finally:
        cluster.stop()


def canary_version(model_dir) -> Version:
    return Version(f"v{next(_canaries)}", str(model_dir))  # the same weights: "degraded" is the reward's doing


def roll(backend, canary: Version, stable: Version, settings: RolloutSettings, fallback: str,
         reconcile=lambda: None, trajectories: int = 400, api_key: str = API, rejected: Version | None = None) -> dict:
    """Drive trajectories until the controller rolls the canary back; what happened. ``fallback``: the planner's
    configured endpoint (used until the first table); ``rejected``: a version published first that the backend
    cannot load (it must be rejected and change nothing)."""
    client = RoutedEngine(OpenAIEngineConfig(endpoint=fallback, api_key=api_key, retries=0), "planner",
                          allowed_endpoints=("http://127.0.0.1:*",))
    decisions = []
    controller = RolloutController(settings, backend, sink=decisions.append, stable=stable,
                                   metrics=RolloutMetrics(CollectorRegistry()),
                                   routes=lambda env: client.update(RoutingTable.from_proto(env.planner_routing)))
    controller.tick()
    if rejected is not None:
        before = client.table
        controller.on_version(pb.PlannerVersion(version=rejected.name, checkpoint_uri=rejected.uri))
        assert [d.rollout_decision.action for d in decisions] == ["reject"]
        assert (client.table.routes, client.table.latest) == (before.routes, before.latest)  # nothing changed
        assert client.complete(MESSAGES, Sampling(max_tokens=2), timeout=30, key="r").model_version == STABLE
        decisions.clear()
    controller.on_version(pb.PlannerVersion(version=canary.name, checkpoint_uri=canary.uri))
    routed, mixed, rolled_back_after = 0, 0, None
    for i in range(trajectories):
        reconcile()
        controller.tick()
        table = client.table
        canary_routed = table is not None and any(r.version == canary.name and r.weight for r in table.routes)
        tid = f"traj-{i}"
        first = client.complete(MESSAGES, Sampling(max_tokens=2), timeout=30, key=tid).model_version
        second = client.complete(MESSAGES, Sampling(max_tokens=2, trajectory_version=first), timeout=30,
                                 key=tid).model_version
        mixed += first != second
        routed += canary_routed
        controller.on_trajectory({
            "trajectory_id": tid, "status": "answered", "started_at_unix": 0.0,
            "turns": [{"step": 0, "planner": {"model_version": first}}, {"step": 1, "planner": {"model_version":
                                                                                                 second}}],
            "rewards": [{"value": 0.0 if first == canary.name else 1.0, "source": "rule"}],
            "totals": {"latency_s": 1.0}})
        if any(d.rollout_decision.action == "rollback" for d in decisions):
            rolled_back_after = routed
            break
    for _ in range(2):  # drain_s 0: the canary is retired; the table follows what the backend reports
        controller.tick()
        reconcile()
    controller.tick()
    after = client.complete(MESSAGES, Sampling(max_tokens=2), timeout=30, key="after").model_version
    client.close()
    return {"actions": [d.rollout_decision.action for d in decisions], "routed": rolled_back_after, "mixed": mixed,
            "after": after, "routes": {r.version: r.weight for r in client.table.routes}}


def check(outcome: dict) -> None:
    assert outcome["actions"] == ["canary", "rollback"], outcome
    assert outcome["mixed"] == 0 and outcome["after"] == STABLE and outcome["routes"] == {STABLE: 100}, outcome


ROLLED_BACK_AFTER: dict[str, int] = {}


def test_local_backend(servers):
    (url, _), model_dir = servers
    settings = RolloutSettings(backend="local", llm_url=url, admin_token=ADMIN, **SETTINGS)
    backend = LocalBackend(url, token=ADMIN, serving_url=f"{url}/v1")
    canary = canary_version(model_dir)
    outcome = roll(backend, canary, Version(STABLE, str(model_dir)), settings, f"{url}/v1")
    check(outcome)
    assert canary.name not in {v.name for v in backend.status().versions}  # retired
    ROLLED_BACK_AFTER["local"] = outcome["routed"]


def test_separate_backend(servers):
    urls, model_dir = servers
    settings = RolloutSettings(backend="separate", llm_url=",".join(urls), admin_token=ADMIN, **SETTINGS)
    backend = SeparateBackend(urls, token=ADMIN)
    canary = canary_version(model_dir)
    outcome = roll(backend, canary, Version(STABLE, str(model_dir)), settings, f"{urls[0]}/v1")
    check(outcome)
    assert all(canary.name not in {v.name for v in s.status().versions} for s in backend.servers)  # retired
    ROLLED_BACK_AFTER["separate"] = outcome["routed"]


# --- LoRA: adapters on one server (serve-llm's LoRA routes, and the real vLLM) ---------------------------------------


@pytest.fixture(scope="module")
def lora_store(tiny_model_dir, tmp_path_factory):
    """<store>/v0 the tiny model, <store>/v1 and v2 rank-8 adapters over it (the trainer's adapter layout)."""
    import shutil

    from test_lora_backend import _adapter

    root = tmp_path_factory.mktemp("lora-routing")
    shutil.copytree(tiny_model_dir, root / "v0")
    for seed, name in enumerate(("v000001", "v000002"), 1):
        _adapter(root / "v0", root / name, rank=8, seed=seed)
    return root


def lora_roll(url: str, token: str, store, canary_name: str, api_key: str) -> dict:
    from agentflow.rollout.lora import LoraBackend

    settings = RolloutSettings(backend="lora", llm_url=url, admin_token=token, **SETTINGS)
    backend = LoraBackend(url, token=token, timeout_s=60)
    canary = Version(canary_name, str(store / canary_name))
    bad = Version("v000007", str(store / "missing"))  # an adapter that fails to load: rejected, nothing changes
    return roll(backend, canary, Version(STABLE, str(store / "v0")), settings, f"{url}/v1", api_key=api_key,
                rejected=bad)


def lora_fleet(url: str, token: str, store) -> tuple:
    """The same server as a one-slot rollout fleet (agentflow.rollout.fleet): two versions published in turn; what
    it holds then, which adapters the server lists, and which version answers a call naming the newest."""
    from agentflow.llm.openai_engine import OpenAIEngine
    from agentflow.rollout.fleet import RolloutFleet, fleet_server
    from agentflow.rollout.lora import LoraBackend

    fleet = RolloutFleet(fleet_server("lora", url, token=token, timeout_s=60), 1)
    for name in ("v000001", "v000002"):
        fleet.publish(Version(name, str(store / name)), 0.0)
        fleet.sync(force=True)
    adapters = {m.name for m in LoraBackend(url, token=token)._models() if not m.base}
    engine = OpenAIEngine(OpenAIEngineConfig(endpoint=f"{url}/v1", api_key=token, model="v000002", retries=0))
    served = engine.complete(MESSAGES, Sampling(max_tokens=2), timeout=60).model_version
    engine.close()
    return fleet.versions, adapters, served


@pytest.mark.slow
def test_lora_backend_on_serve_llm(lora_store, tmp_path):
    from agentflow.services.cluster import Cluster

    cluster = Cluster(log_dir=tmp_path)
    try:  # started as vLLM would be: the base model is the stable version, under its own name
        url = cluster.spawn("llm-lora", ["serve-llm", "--model", str(lora_store / "v0"), "--version", STABLE,
                                         "--served-name", STABLE, "--model-store", str(lora_store)], 180,
                            {"AGENTFLOW_LLM_ADMIN_TOKEN": ADMIN}).info["url"].removesuffix("/v1")
        outcome = lora_roll(url, ADMIN, lora_store, "v000001", api_key="")
        fleet = lora_fleet(url, ADMIN, lora_store)
    finally:
        cluster.stop()
    check(outcome)
    assert fleet == (("v000002",), {"v000002"}, "v000002"), fleet
    ROLLED_BACK_AFTER["lora (serve-llm)"] = outcome["routed"]


@pytest.mark.slow
@pytest.mark.vllm
def test_lora_backend_on_vllm(lora_store):
    from conftest import _vllm_unavailable

    from agentflow.llm import vllm_server

    try:
        vllm_server.vllm_python()
    except vllm_server.VLLMNotInstalled as e:
        _vllm_unavailable(str(e))
    server = vllm_server.start_vllm(lora_store / "v0", served_model_name=STABLE, dtype="float32",
                                    startup_timeout_s=420.0, api_key=API,
                                    extra_args=["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2"],
                                    extra_env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    try:
        outcome = lora_roll(server.url.removesuffix("/v1"), API, lora_store, "v000002", api_key=API)
        fleet = lora_fleet(server.url.removesuffix("/v1"), API, lora_store)
    finally:
        server.stop()
    check(outcome)
    assert fleet == (("v000002",), {"v000002"}, "v000002"), fleet
    ROLLED_BACK_AFTER["lora (vLLM)"] = outcome["routed"]


# --- KServe against the API emulator, two serve-llm processes standing in for the predictors ---------------------------


class KServeStandIn:
    """What KServe and its pods would do, played by the test (the emulator has no controller): each
    InferenceService's spec is served by a serve-llm process (the version its first served name names, loaded from
    its storageUri through the admin API), and its status is written as KServe writes it, with that process's URL.

    ``pair``: the stable InferenceService on server A, the canary one on server B. ``canary`` (one InferenceService,
    Knative revisions): each new spec is a revision on the other server; the traffic block tags the latest revision
    ``latest`` and the last one rolled out with 100 % ``prev``, as KServe does with tag routing."""

    def __init__(self, kube, urls: list[str], name: str, mode: str):
        self.kube, self.urls, self.name, self.mode = kube, urls, name, mode
        self.revisions: list[tuple[str, str, str]] = []  # (storageUri, version, server url)
        self.rolled_out = 0  # index of the revision last rolled out with 100 %

    def __call__(self) -> None:
        names = [self.name, f"{self.name}-canary"] if self.mode == "pair" else [self.name]
        for name, url in zip(names, self.urls):
            obj = self._get(name)
            if obj is not None:
                (self._pair if self.mode == "pair" else self._revisions)(name, obj, url)

    def _pair(self, name, obj, url) -> None:
        uri, version = self._spec(obj)
        self._serve(url, version, uri)
        self._status(name, obj, {"url": url, "address": {"url": url},
                                 "components": {"predictor": self._revision(name, obj)}})

    def _revisions(self, name, obj, _url) -> None:
        uri, version = self._spec(obj)
        if not self.revisions or self.revisions[-1][:2] != (uri, version):
            server = self.urls[len(self.revisions) % 2]
            self._serve(server, version, uri)
            self.revisions.append((uri, version, server))
        percent = obj["spec"]["predictor"].get("canaryTrafficPercent")
        latest = len(self.revisions) - 1
        if percent is None:
            self.rolled_out = latest
        component = self._revision(name, obj, latest)
        component["address"] = {"url": self.revisions[latest][2]}
        component["traffic"] = [
            {"tag": "latest", "revisionName": f"{name}-r{latest}", "latestRevision": True,
             "url": self.revisions[latest][2], "percent": 100 if percent is None else percent},
            {"tag": "prev", "revisionName": f"{name}-r{self.rolled_out}", "latestRevision": False,
             "url": self.revisions[self.rolled_out][2], "percent": 0 if percent is None else 100 - percent}]
        self._status(name, obj, {"url": self.revisions[latest][2], "components": {"predictor": component}})

    @staticmethod
    def _spec(obj) -> tuple[str, str]:
        from agentflow.rollout.kserve.base import served_names

        model = obj["spec"]["predictor"]["model"]
        return model["storageUri"], served_names(model.get("args"))[0]

    @staticmethod
    def _revision(name, obj, index=None) -> dict:
        revision = f"{name}-r{obj['metadata']['generation'] if index is None else index}"
        return {"latestCreatedRevision": revision, "latestReadyRevision": revision}

    @staticmethod
    def _serve(url: str, version: str, uri: str) -> None:
        backend = LocalBackend(url, token=ADMIN)
        if backend.status().weight(version) is None:
            backend.admin.request("POST", "/admin/versions", json={"name": version, "uri": uri}, accept=(201,))
        backend._set_weights({version: 100})

    def _get(self, name):
        from kubernetes.client.exceptions import ApiException

        from agentflow.rollout.kserve.base import API_VERSION, GROUP, PLURAL

        try:
            return self.kube.api.get_namespaced_custom_object(GROUP, API_VERSION, "agentflow", PLURAL, name)
        except ApiException as e:
            assert e.status == 404
            return None

    def _status(self, name, obj, status) -> None:
        from agentflow.rollout.kserve.base import API_VERSION, GROUP, PLURAL

        status = {"observedGeneration": obj["metadata"]["generation"],
                  "conditions": [{"type": "Ready", "status": "True"},
                                 {"type": "PredictorReady", "status": "True", "reason": "NewReplicaSetAvailable"}],
                  "modelStatus": {"transitionStatus": "UpToDate"}, **status}
        self.kube.api.patch_namespaced_custom_object_status(GROUP, API_VERSION, "agentflow", PLURAL, name,
                                                            {"status": status})


def kserve_roll(servers, mode: str) -> dict:
    import shutil

    from agentflow.rollout.kserve import kserve_backend
    from agentflow.rollout.kserve.base import API_VERSION, GROUP, PLURAL
    from tests.unit.kube_emulator import KubeApi

    urls, model_dir = servers
    name = f"planner-{mode}"
    canary = canary_version(model_dir)
    copy = model_dir.parent / f"{name}-{canary.name}"  # a canary's own storageUri (KServe tells them apart by it)
    shutil.copytree(model_dir, copy, dirs_exist_ok=True)
    canary = Version(canary.name, str(copy))
    settings = RolloutSettings(backend="kserve", kserve_mode=mode, namespace="agentflow", inference_service=name,
                               served_model_name="planner", kserve_openai_path="/v1", **SETTINGS)
    with KubeApi() as kube:
        isvc = {"apiVersion": f"{GROUP}/{API_VERSION}", "kind": "InferenceService",
                "metadata": {"name": name, "namespace": "agentflow",
                             "annotations": {"serving.kserve.io/deploymentMode": "Knative" if mode == "canary"
                                             else "RawDeployment"}},
                "spec": {"predictor": {"model": {"modelFormat": {"name": "vllm"}, "storageUri": str(model_dir),
                                                 "args": ["--served-model-name", STABLE, "planner"]}}}}
        kube.api.create_namespaced_custom_object(GROUP, API_VERSION, "agentflow", PLURAL, isvc)
        stand_in = KServeStandIn(kube, urls, name, mode)
        stand_in()
        backend = kserve_backend(settings, api=kube.api)
        outcome = roll(backend, canary, Version(STABLE, str(model_dir)), settings, f"{urls[0]}/v1",
                       reconcile=stand_in)
    for url in urls:  # the stand-ins back to v0 alone for the next run
        server = LocalBackend(url, token=ADMIN)
        server._set_weights({STABLE: 100})
        for v in server.status().versions:
            if v.name != STABLE:
                server.retire(v)
    return outcome


def test_kserve_pair_mode(servers):
    outcome = kserve_roll(servers, "pair")
    check(outcome)
    ROLLED_BACK_AFTER["kserve pair"] = outcome["routed"]


def test_kserve_canary_mode_with_tag_routes(servers):
    outcome = kserve_roll(servers, "canary")
    check(outcome)
    ROLLED_BACK_AFTER["kserve canary"] = outcome["routed"]


def test_every_backend_rolled_back_after_the_same_number_of_trajectories():
    counts = dict(ROLLED_BACK_AFTER)
    print(f"\ncanary-routed trajectories before the rollback, per backend: {counts}")
    assert len(counts) >= 5 and len(set(counts.values())) == 1, counts
