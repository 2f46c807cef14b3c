"""The local OpenAI-compatible server over the embedded engine, driven by the project's own OpenAIEngine."""

import json
import socket

import httpx
import pytest

from agentflow.errors import EngineError
from agentflow.llm.base import Sampling
from agentflow.llm.embedded import EmbeddedEngine
from agentflow.llm.openai_engine import OpenAIEngine, OpenAIEngineConfig
from agentflow.llm.server import make_server, serve_in_background


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    engine = EmbeddedEngine(tiny_model_dir, version="tiny-v1")
    httpd = make_server(engine, "planner", "tiny-v1")
    serve_in_background(httpd)
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", engine
    httpd.shutdown()
    engine.close()


def test_engine_round_trip_records_tokens_and_version(server):
    url, embedded = server
    client = OpenAIEngine(OpenAIEngineConfig(endpoint=url))
    msgs = [{"role": "user", "content": "hello"}]
    c = client.complete(msgs, Sampling(max_tokens=6), timeout=30)
    assert c.model_version == "tiny-v1" and c.prompt_token_ids == embedded.encode_chat(msgs)
    assert len(c.token_ids) == len(c.logprobs) > 0
    schema = {"type": "object", "properties": {"tool": {"type": "string", "enum": ["python", "search"]}}}
    assert json.loads(client.complete(msgs, Sampling(max_tokens=8), timeout=30, json_schema=schema).text)["tool"] in (
        "python", "search")


@pytest.mark.parametrize("body,status", [
    (b"not json", 400), (b"[1]", 400), (json.dumps({"messages": []}).encode(), 400),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "model": "other"}).encode(), 404),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).encode(), 400),
])
def test_bad_requests_get_clear_errors(server, body, status):
    response = httpx.post(f"{server[0]}/chat/completions", content=body, timeout=30)
    assert response.status_code == status and response.json()["error"]["message"]


def test_wrong_model_name_is_an_engine_error(server):
    with pytest.raises(EngineError, match="404"):
        OpenAIEngine(OpenAIEngineConfig(endpoint=server[0], model="nope")).complete(
            [{"role": "user", "content": "x"}], Sampling(max_tokens=2), timeout=10)


# --- several versions: admin API, weights, sticky routing -------------------------------------------------------


@pytest.fixture
def versioned(tiny_model_dir, tmp_path):
    """A server holding versions of the tiny model, with the admin API behind a token."""
    from agentflow.llm.versions import Versions

    versions = Versions(lambda name, uri: EmbeddedEngine(uri, version=name), close_grace_s=0.1)
    versions.add("v1", str(tiny_model_dir))
    httpd = make_server(versions, "planner", admin_token="secret")
    serve_in_background(httpd)
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    admin = httpx.Client(base_url=base + "/admin", headers={"Authorization": "Bearer secret"}, timeout=60)
    yield base, admin, tiny_model_dir
    httpd.shutdown()
    versions.close()


def _weights(admin) -> dict:
    return {v["name"]: v["weight"] for v in admin.get("/versions").json()["versions"]}


def _served(base: str, trajectory_id: str, pin: str = "", status: int = 200) -> str:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
    headers = {"x-trajectory-id": trajectory_id, **({"x-model-version-pin": pin} if pin else {})}
    response = httpx.post(base + "/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert response.status_code == status, response.text
    return response.headers.get("x-model-version", "")


def test_canary_weights_split_traffic_and_stick_to_a_trajectory(versioned):
    base, admin, model_dir = versioned
    assert admin.post("/versions", json={"name": "v2", "uri": str(model_dir)}).status_code == 201
    assert _weights(admin) == {"v1": 100, "v2": 0}
    assert {_served(base, f"t{i}") for i in range(10)} == {"v1"}
    assert admin.put("/weights", json={"weights": {"v1": 50, "v2": 50}}).status_code == 200
    first = {f"t{i}": _served(base, f"t{i}") for i in range(10, 50)}
    assert set(first.values()) == {"v1", "v2"}  # 40 trajectories, 50/50: both get traffic
    admin.put("/weights", json={"weights": {"v1": 100, "v2": 0}})
    assert all(_served(base, tid) == version for tid, version in first.items())  # sticky across the change
    assert _served(base, "new-trajectory") == "v1"
    # pinned calls (training rollouts, evaluations) ignore the weights
    assert _served(base, "t10", pin="latest") == "v2" and _served(base, "t10", pin="v1") == "v1"
    assert _served(base, "t10", pin="v7", status=404) == ""


@pytest.mark.parametrize("method,path,body,status,message", [
    ("post", "/versions", {"name": "v1", "uri": "x"}, 409, "already loaded"),
    ("post", "/versions", {"name": "v9", "uri": "/nonexistent/model"}, 400, "could not be loaded"),
    ("post", "/versions", {"name": "", "uri": "x"}, 400, "non-empty"),
    ("put", "/weights", {"weights": {"v1": 60}}, 400, "sum to 100"),
    ("put", "/weights", {"weights": {"v1": 50, "nope": 50}}, 400, "unknown version"),
    ("put", "/weights", {"weights": {"v1": 100.5}}, 400, "integers"),
    ("delete", "/versions/v1", None, 409, "still has weight"),
    ("delete", "/versions/nope", None, 404, "unknown version"),
])
def test_bad_admin_requests_are_refused_and_serving_goes_on(versioned, method, path, body, status, message):
    base, admin, _ = versioned
    kwargs = {"json": body} if body is not None else {}
    response = getattr(admin, method)(path, **kwargs)
    assert response.status_code == status and message in response.json()["error"]["message"]
    assert _weights(admin) == {"v1": 100} and _served(base, "t") == "v1"


def test_admin_api_needs_the_token(versioned):
    base, _, _ = versioned
    assert httpx.get(base + "/admin/versions").status_code == 401
    assert httpx.put(base + "/admin/weights", json={"weights": {"v1": 100}}).status_code == 401


def test_unloading_an_idle_version(versioned):
    base, admin, model_dir = versioned
    admin.post("/versions", json={"name": "v2", "uri": str(model_dir)})
    admin.put("/weights", json={"weights": {"v2": 100}})
    assert admin.delete("/versions/v1").status_code == 200
    assert _weights(admin) == {"v2": 100} and _served(base, "t") == "v2"


# --- version names and response headers: no CR/LF, no control or non-ASCII characters ----------------------------

@pytest.fixture
def scripted():
    """A server on 127.0.0.1 over scripted versions (no model), its admin API behind a token."""
    from agentflow.llm.scripted import ScriptedEngine
    from agentflow.llm.versions import Versions

    versions = Versions(lambda name, uri: ScriptedEngine(["ok"], version=name), close_grace_s=0.0)
    versions.add("v1", "/models/v1")
    httpd = make_server(versions, "planner", admin_token="secret")
    serve_in_background(httpd)
    port = httpd.server_address[1]
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": "Bearer secret"},
                      timeout=30) as client:
        yield client, versions, port
    httpd.shutdown()


def _raw_head(port: int, request: bytes) -> str:
    """The status line and headers of the answer to ``request``, as they came over the socket."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data.decode("latin-1").partition("\r\n\r\n")[0]


INJECTION = "v2\r\nSet-Cookie: pwned=1"


@pytest.mark.parametrize("name", [INJECTION, "v2\nX-Injected: 1", "v2\r", "v2\x00", "v2\x7f", "v\u00e9", "v 2",
                                  "v/2", "../v2", "a" * 129])
def test_version_names_outside_the_charset_are_refused_on_every_admin_route(scripted, name):
    client, versions, _ = scripted
    for path, body in (("/admin/versions", {"name": name, "uri": "/models/v2"}),
                       ("/v1/load_lora_adapter", {"lora_name": name, "lora_path": "/models/v2"})):
        response = client.post(path, json=body)
        assert response.status_code == 400 and "version name" in response.json()["error"]["message"], response.text
    response = client.delete("/admin/versions/v2%0D%0ASet-Cookie:%20pwned=1")
    assert response.status_code == 400 and "version name" in response.json()["error"]["message"], response.text
    assert versions.names() == ["v1"]


def test_a_version_name_never_splits_a_response_header(scripted):
    """The attack: a name with CR/LF given to the admin API, then asked for by a chat request (which answers with
    the version's name in ``x-model-version``)."""
    client, _, port = scripted
    client.post("/admin/versions", json={"name": INJECTION, "uri": "/models/v2"})
    body = json.dumps({"model": INJECTION, "messages": [{"role": "user", "content": "hi"}]}).encode()
    head = _raw_head(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                           b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    assert head.startswith("HTTP/1.1 404 ") and "set-cookie" not in head.lower(), head


def test_httpd_never_writes_a_header_value_with_a_line_break_or_outside_ascii():
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from agentflow import httpd

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            httpd.send(self, 200, {"ok": True}, headers={"x-model-version": INJECTION, "x-other": "v\u2028",
                                                          "x-kept": "v1"})

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    serve_in_background(server)
    try:
        head = _raw_head(server.server_address[1], b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    finally:
        server.shutdown()
    lines = head.split("\r\n")
    assert lines[0] == "HTTP/1.1 200 OK" and "x-kept: v1" in lines, head
    assert not any(line.lower().startswith(("set-cookie", "x-model-version", "x-other")) for line in lines), head


def scrape(url: str) -> dict:
    """``GET /metrics`` parsed: {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    response = httpx.get(url, timeout=10)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain; version=")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def test_metrics_count_requests_tokens_and_latency_per_version(server):
    url, _ = server
    root = url.removesuffix("/v1")
    before = scrape(f"{root}/metrics")
    ok = OpenAIEngine(OpenAIEngineConfig(endpoint=url)).complete([{"role": "user", "content": "hello"}],
                                                                  Sampling(max_tokens=5), timeout=30)
    httpx.post(f"{url}/chat/completions", content=b"not json", timeout=30)
    after = scrape(f"{root}/metrics")

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    assert delta("agentflow_llm_requests_total", version="tiny-v1", code="200") == 1
    assert delta("agentflow_llm_requests_total", version="none", code="400") == 1  # refused before routing
    assert delta("agentflow_llm_prompt_tokens_total", version="tiny-v1") == len(ok.prompt_token_ids)
    assert delta("agentflow_llm_generation_tokens_total", version="tiny-v1") == len(ok.token_ids) > 0
    assert delta("agentflow_llm_request_duration_seconds_count", version="tiny-v1") == 1
    assert delta("agentflow_llm_time_to_first_token_seconds_count", version="tiny-v1") == 1
    assert 0 < delta("agentflow_llm_time_to_first_token_seconds_sum", version="tiny-v1") \
        <= delta("agentflow_llm_request_duration_seconds_sum", version="tiny-v1")
    assert after[("agentflow_llm_batch_capacity", (("version", "tiny-v1"),))] == 8
    assert after[("agentflow_llm_batch_rows", (("version", "tiny-v1"),))] == 0  # idle again
    assert after[("agentflow_llm_queue_length", (("version", "tiny-v1"),))] == 0
