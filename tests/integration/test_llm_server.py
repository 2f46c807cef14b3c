"""The local OpenAI-compatible server over the embedded engine, driven by the project's own OpenAIEngine."""

import json

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
