"""Hostile and unlucky clients of the LLM server (issue 15): malformed fields, oversized requests, clients that go
away, calls without credentials, version URIs outside the allowed roots. A real server on 127.0.0.1 over the tiny
model."""

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from agentflow.children import spawn_tied
from agentflow.errors import EngineError
from agentflow.llm.base import Sampling
from agentflow.llm.embedded import EmbeddedEngine
from agentflow.llm.protocol import ServerSettings
from agentflow.llm.server import make_server, serve_in_background
from agentflow.llm.versions import Versions

pytestmark = pytest.mark.faults

CHAT = {"Authorization": "Bearer chat-secret"}
ADMIN = {"Authorization": "Bearer admin-secret"}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    """One version on one batch slot, with both tokens and small caps."""
    versions = Versions(lambda name, uri: EmbeddedEngine(uri, version=name, max_batch=1), close_grace_s=0.1)
    versions.add("v1", str(tiny_model_dir))
    settings = ServerSettings(max_tokens=3000, max_prompt_tokens=64, max_body_bytes=32 * 1024, api_token="chat-secret",
                              admin_token="admin-secret", request_timeout_s=120)
    httpd = make_server(versions, "planner", settings=settings)
    serve_in_background(httpd)
    yield f"http://127.0.0.1:{httpd.server_address[1]}", versions
    httpd.shutdown()
    versions.close()


def _chat(base: str, http_timeout: float = 30, headers=CHAT, **fields) -> httpx.Response:
    body = {"messages": HI, "max_tokens": 4, "temperature": 0, **fields}
    return httpx.post(base + "/v1/chat/completions", content=json.dumps(body, allow_nan=True),
                      headers={"Content-Type": "application/json", **headers}, timeout=http_timeout)


@pytest.mark.parametrize("fields,param", [
    ({"seed": "abc"}, "seed"), ({"seed": 10 ** 30}, "seed"), ({"seed": -1}, "seed"), ({"seed": 1.5}, "seed"),
    ({"temperature": float("nan")}, "temperature"), ({"temperature": float("inf")}, "temperature"),
    ({"temperature": -1}, "temperature"), ({"temperature": "hot"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"top_p": -1, "temperature": 1}, "top_p"), ({"top_p": 2}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": -5}, "max_tokens"), ({"max_tokens": "9"}, "max_tokens"),
    ({"max_tokens": 10 ** 9}, "max_tokens"), ({"n": 2}, "n"), ({"n": "1"}, "n"),
    ({"stop": [1]}, "stop"), ({"stop": [""]}, "stop"), ({"stop": ["x"] * 50}, "stop"), ({"stop": {"a": 1}}, "stop"),
    ({"logprobs": "yes"}, "logprobs"), ({"return_token_ids": 1}, "return_token_ids"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"), ({"messages": [{"role": "root", "content": "x"}]},
                                                                   "messages"),
    ({"messages": ["hi"]}, "messages"), ({"messages": {"role": "user"}}, "messages"),
    ({"response_format": "json"}, "response_format"), ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": []}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"a": {"type": "string", "enum": []}}}}}}, "response_format"),
    ({"timeout": -1}, "timeout"), ({"timeout": float("nan")}, "timeout"), ({"model": 7}, "model"),
])
def test_a_malformed_field_fails_its_request_and_serving_goes_on(served, fields, param):
    base, _ = served
    response = _chat(base, **fields)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and error["type"] == "invalid_request_error"
    assert _chat(base).status_code == 200
    assert httpx.get(base + "/health").json()["status"] == "ok"


def test_an_engine_failure_fails_one_request_only(tiny_model_dir):
    """Settings the server would refuse, given to the engine directly: that request fails, the engine serves on."""
    engine = EmbeddedEngine(tiny_model_dir, max_batch=2)
    try:
        for bad in (Sampling(seed="abc", temperature=1.0), Sampling(seed=10 ** 30, temperature=1.0),
                    Sampling(temperature=1.0, top_p="x", max_tokens=4)):
            with pytest.raises(EngineError):
                engine.complete(HI, bad, timeout=30)
            assert engine.complete(HI, Sampling(max_tokens=4), timeout=30).token_ids
        assert engine.healthy
    finally:
        engine.close()
    assert not engine.healthy


def test_oversized_requests_are_refused(served):
    base, _ = served
    assert _chat(base, max_tokens=3001).status_code == 400
    long_prompt = [{"role": "user", "content": "hello there " * 100}]  # > 64 tokens
    response = _chat(base, messages=long_prompt)
    assert response.status_code == 400 and "64" in response.json()["error"]["message"]
    assert _chat(base, messages=[{"role": "user", "content": "x" * 40_000}]).status_code == 413
    response = httpx.post(base + "/v1/chat/completions", content=b"[" * 10_000 + b"]" * 10_000, headers=CHAT)
    assert response.status_code == 400
    assert _chat(base).status_code == 200


def test_a_client_that_goes_away_frees_its_slot(served):
    """One batch slot: a long request whose client leaves after 1 s must not hold the slot for its whole length."""
    base, _ = served
    with pytest.raises(httpx.ReadTimeout):
        # a stop string nothing produces: all 3000 steps (the client leaves after 1 s)
        _chat(base, http_timeout=1.0, max_tokens=3000, stop=["\u2603"])
    started = time.monotonic()
    assert _chat(base, http_timeout=60).status_code == 200
    assert time.monotonic() - started < 5.0


def test_a_request_past_its_deadline_is_cut(served):
    base, _ = served
    started = time.monotonic()
    response = _chat(base, http_timeout=60, max_tokens=3000, stop=["\u2603"], timeout=0.5)
    assert response.status_code == 504 and time.monotonic() - started < 5.0
    assert _chat(base).status_code == 200


def test_calls_without_the_tokens_are_refused(served):
    base, _ = served
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "chat-secret"}, ADMIN):
        assert _chat(base, headers=headers).status_code == 401
        # what is served may be read with the admin token too (the lora backend's one token)
        assert httpx.get(base + "/v1/models", headers=headers).status_code == (200 if headers is ADMIN else 401)
    for headers in ({}, {"Authorization": "Bearer wrong"}, CHAT):
        assert httpx.get(base + "/admin/versions", headers=headers).status_code == 401
        assert httpx.put(base + "/admin/weights", json={"weights": {"v1": 100}}, headers=headers).status_code == 401
        assert httpx.delete(base + "/admin/versions/v1", headers=headers).status_code == 401
    assert httpx.get(base + "/health").status_code == 200  # probes need no token
    assert httpx.get(base + "/admin/versions", headers=ADMIN).status_code == 200
    assert _chat(base).status_code == 200


def test_the_admin_api_is_off_without_a_token(tiny_model_dir):
    versions = Versions(lambda name, uri: EmbeddedEngine(uri, version=name))
    versions.add("v1", str(tiny_model_dir))
    httpd = make_server(versions, "planner")
    serve_in_background(httpd)
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        response = httpx.post(base + "/admin/versions", json={"name": "v2", "uri": str(tiny_model_dir)})
        assert response.status_code == 403 and "--admin-token" in response.json()["error"]["message"]
        assert versions.names() == ["v1"]
    finally:
        httpd.shutdown()
        versions.close()


def test_serve_llm_loads_versions_only_from_allowed_roots(tiny_model_dir, tmp_path):
    """`agentflow serve-llm`: relative, ~, http:// and folders outside --model and --model-store are refused."""
    import shutil

    store = tmp_path / "store"
    shutil.copytree(tiny_model_dir, store / "v000002")
    shutil.copytree(tiny_model_dir, tmp_path / "elsewhere")
    env = {**os.environ, "AGENTFLOW_LLM_ADMIN_TOKEN": "admin-secret", "OMP_NUM_THREADS": "1"}
    server = spawn_tied([sys.executable, "-m", "agentflow.cli", "serve-llm", "--model", str(tiny_model_dir),
                         "--version", "v000001", "--model-store", str(store)], env=env, cwd=tmp_path,
                        stdout=subprocess.PIPE, text=True)
    try:
        base = json.loads(server.stdout.readline())["url"].removesuffix("/v1")
        admin = httpx.Client(base_url=base + "/admin", headers=ADMIN, timeout=60)
        for uri in ("elsewhere", "./store/v000002", "~/model", "http://127.0.0.1:9/model",
                    "https://example.com/m", "memory://m", str(tmp_path / "elsewhere"), f"{store}/../elsewhere"):
            response = admin.post("/versions", json={"name": "evil", "uri": uri})
            assert response.status_code == 400, uri
            assert "absolute" in response.text or "outside the allowed" in response.text, response.text
        assert admin.post("/versions", json={"name": "v000002", "uri": str(store / "v000002")}).status_code == 201
        assert [v["name"] for v in admin.get("/versions").json()["versions"]] == ["v000001", "v000002"]
        assert httpx.post(base + "/admin/versions", json={"name": "x", "uri": str(store)}).status_code == 401
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
