"""OpenAIEngine against a local HTTP server on 127.0.0.1: request shape, token details, retries, errors.

The real vLLM server is exercised in tests/integration/test_vllm_engine.py; this covers failure handling that a
healthy server cannot show.
"""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentflow.errors import EngineError, EngineTimeout
from agentflow.llm.base import Sampling
from agentflow.llm.openai_engine import OpenAIEngine, OpenAIEngineConfig

VLLM_STYLE = {
    "model": "planner-v2",
    "prompt_token_ids": [1, 2, 3],
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"}, "finish_reason": "stop",
                 "token_ids": [42, 7],
                 "logprobs": {"content": [{"token": "Hel", "logprob": -0.5}, {"token": "lo", "logprob": -0.25}]}}],
}


class Server:
    """Answers each POST with the next scripted (status, body, delay); records the request bodies."""

    def __init__(self, script):
        self.script, self.requests = list(script), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                self._reply(200, {"data": [{"id": "served-model"}]})

            def do_POST(self):
                outer.requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                status, body, delay = outer.script.pop(0) if len(outer.script) > 1 else outer.script[0]
                time.sleep(delay)
                self._reply(status, body)

            def _reply(self, status, body):
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("x-model-version", "v7") if status == 200 else None
                self.end_headers()
                self.wfile.write(data)

        class Quiet(ThreadingHTTPServer):
            def handle_error(self, request, client_address):  # clients that time out hang up on purpose
                pass

        self.httpd = Quiet(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def serve():
    servers = []

    def start(*script):
        servers.append(Server(script))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


MSGS = [{"role": "user", "content": "hi"}]


def engine(url, **kw):
    return OpenAIEngine(OpenAIEngineConfig(endpoint=url, backoff_s=0.01, **kw))


def test_records_token_ids_logprobs_and_served_version(serve):
    server = serve((200, VLLM_STYLE, 0))
    c = engine(server.url).complete(MSGS, Sampling(temperature=0.7, max_tokens=9, seed=3), timeout=5, key="traj-1")
    assert (c.text, c.prompt_token_ids, c.token_ids, c.logprobs) == ("Hello", [1, 2, 3], [42, 7], [-0.5, -0.25])
    assert c.model_version == "v7" and c.finish_reason == "stop" and c.latency_s > 0
    body = server.requests[0]
    assert body["model"] == "served-model" and body["return_token_ids"] is True and body["logprobs"] is True
    assert (body["temperature"], body["max_tokens"], body["seed"]) == (0.7, 9, 3)


def test_sends_a_json_schema_when_asked(serve):
    server = serve((200, VLLM_STYLE, 0))
    engine(server.url).complete(MSGS, Sampling(), timeout=5, json_schema={"type": "object"})
    assert server.requests[0]["response_format"]["json_schema"]["schema"] == {"type": "object"}


def test_a_background_call_carries_its_priority_only_to_servers_that_schedule_by_it(serve):
    from agentflow.llm.base import llm_priority

    server = serve((200, VLLM_STYLE, 0))
    scheduling, plain = engine(server.url, priority_scheduling=True), engine(server.url)
    with llm_priority(True):  # a training rollout's event, as a ring service handles it
        scheduling.complete(MSGS, Sampling(), timeout=5)
        plain.complete(MSGS, Sampling(), timeout=5)  # vLLM without --scheduling-policy priority refuses one
    scheduling.complete(MSGS, Sampling(), timeout=5)  # users' calls: vLLM's default, 0
    assert [r.get("priority") for r in server.requests] == [1, None, None]


def test_retries_on_503_then_succeeds(serve):
    server = serve((503, {"error": "busy"}, 0), (503, {"error": "busy"}, 0), (200, VLLM_STYLE, 0))
    assert engine(server.url, retries=2).complete(MSGS, Sampling(), timeout=5).text == "Hello"
    assert len(server.requests) == 3


def test_gives_up_after_the_retries(serve):
    server = serve((503, {"error": "busy"}, 0))
    with pytest.raises(EngineError, match="503"):
        engine(server.url, retries=1).complete(MSGS, Sampling(), timeout=5)
    assert len(server.requests) == 2


def test_a_client_error_is_not_retried(serve):
    server = serve((400, {"error": "bad request"}, 0))
    with pytest.raises(EngineError, match="HTTP 400"):
        engine(server.url).complete(MSGS, Sampling(), timeout=5)
    assert len(server.requests) == 1


def test_slow_server_times_out_within_the_deadline(serve):
    server = serve((200, VLLM_STYLE, 3))
    started = time.monotonic()
    with pytest.raises(EngineTimeout):
        engine(server.url).complete(MSGS, Sampling(), timeout=0.5)
    assert time.monotonic() - started < 1.5


def test_refused_connection_is_a_clear_error():
    with pytest.raises(EngineError, match="cannot reach"):
        engine("http://127.0.0.1:9/v1", retries=0).complete(MSGS, Sampling(), timeout=2)


def test_malformed_response_is_an_engine_error(serve):
    server = serve((200, {"unexpected": True}, 0))
    with pytest.raises(EngineError, match="malformed"):
        engine(server.url, model="m").complete(MSGS, Sampling(), timeout=5)


def test_non_json_response_is_an_engine_error(serve):
    server = serve((200, b"<html>proxy error</html>", 0))
    with pytest.raises(EngineError, match="non-JSON"):
        engine(server.url, model="m").complete(MSGS, Sampling(), timeout=5)


def test_endpoint_must_be_a_url():
    with pytest.raises(EngineError, match="http"):
        engine("localhost:8000")
