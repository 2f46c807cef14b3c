"""GenAI client spans on LLM calls: the OpenAIEngine against the project's own OpenAI-compatible server (over the
tiny embedded model), and the embedded engine itself. Attributes follow the OpenTelemetry GenAI and HTTP semantic
conventions; the numbers are checked against the server's actual response."""

import json

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from agentflow.errors import EngineError
from agentflow.llm.base import Sampling
from agentflow.llm.embedded import EmbeddedEngine
from agentflow.llm.openai_engine import OpenAIEngine, OpenAIEngineConfig
from agentflow.llm.server import make_server, serve_in_background
from agentflow.telemetry import redact_url

PROMPT = "tell me about zebra-prompt-marker"


@pytest.fixture(scope="module")
def spans():
    """Every span this process ends, from the global provider (installed here unless one already is)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        pytest.skip("a non-SDK tracer provider is installed")
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    engine = EmbeddedEngine(tiny_model_dir, version="tiny-v1")
    httpd = make_server(engine, "planner", "tiny-v1")
    serve_in_background(httpd)
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", engine, httpd.server_address[1]
    httpd.shutdown()
    engine.close()


class Recording(httpx.HTTPTransport):
    """A real transport that keeps each request's headers and each response's JSON body."""

    def __init__(self):
        super().__init__()
        self.requests, self.bodies = [], []

    def handle_request(self, request):
        response = super().handle_request(request)
        response.read()
        self.requests.append(request)
        self.bodies.append(json.loads(response.content))
        return response


def _trace_of(exporter, span) -> list:
    return [s for s in exporter.get_finished_spans() if s.context.trace_id == span.context.trace_id]


def _only(found: list):
    assert len(found) == 1, [s.name for s in found]
    return found[0]


def test_a_chat_call_is_a_genai_span_with_the_servers_usage(spans, server):
    url, _embedded, port = server
    transport = Recording()
    engine = OpenAIEngine(OpenAIEngineConfig(endpoint=url, model="planner"), transport=transport)
    sampling = Sampling(max_tokens=5, temperature=0.5, seed=7)
    completion = engine.complete([{"role": "user", "content": PROMPT}], sampling, timeout=30)
    [body] = transport.bodies
    chat = _only([s for s in spans.get_finished_spans() if s.name == "chat planner"
                  and s.attributes.get("gen_ai.response.id") == body["id"]])
    assert chat.kind == SpanKind.CLIENT and chat.status.status_code == StatusCode.UNSET
    a = chat.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "openai"
    assert a["gen_ai.request.model"] == "planner" and a["gen_ai.response.model"] == body["model"] == "planner"
    assert a["gen_ai.request.temperature"] == 0.5 and a["gen_ai.request.max_tokens"] == 5
    assert a["gen_ai.request.seed"] == 7
    assert a["gen_ai.usage.input_tokens"] == body["usage"]["prompt_tokens"] == len(completion.prompt_token_ids) > 0
    assert a["gen_ai.usage.output_tokens"] == body["usage"]["completion_tokens"] == len(completion.token_ids) > 0
    assert list(a["gen_ai.response.finish_reasons"]) == [body["choices"][0]["finish_reason"]]
    assert a["agentflow.model_version"] == completion.model_version == "tiny-v1"
    assert (a["server.address"], a["server.port"]) == ("127.0.0.1", port)

    # one HTTP client span under it, whose context the request carried
    http = _only([s for s in _trace_of(spans, chat) if s.parent and s.parent.span_id == chat.context.span_id])
    assert http.kind == SpanKind.CLIENT and http.name == "POST" and http.status.status_code == StatusCode.UNSET
    assert http.attributes["http.request.method"] == "POST"
    assert http.attributes["url.full"] == f"{url}/chat/completions"
    assert http.attributes["http.response.status_code"] == 200
    assert (http.attributes["server.address"], http.attributes["server.port"]) == ("127.0.0.1", port)
    [request] = transport.requests
    _version, trace_id, parent_id, _flags = request.headers["traceparent"].split("-")
    assert (trace_id, parent_id) == (f"{chat.context.trace_id:032x}", f"{http.context.span_id:016x}")

    # sizes only: neither the prompt nor the completion is on any span
    for s in _trace_of(spans, chat):
        text = json.dumps({**dict(s.attributes), "events": [dict(e.attributes or {}) for e in s.events]}, default=str)
        assert "zebra-prompt-marker" not in text
        assert not completion.text.strip() or completion.text not in text


def test_a_model_the_server_lacks_fails_both_spans(spans, server):
    url = server[0]
    with pytest.raises(EngineError, match="404"):
        OpenAIEngine(OpenAIEngineConfig(endpoint=url, model="nope", retries=0)).complete(
            [{"role": "user", "content": "x"}], Sampling(max_tokens=2), timeout=10)
    chat = [s for s in spans.get_finished_spans() if s.name == "chat nope"][-1]
    assert chat.status.status_code == StatusCode.ERROR
    assert chat.attributes["error.type"] == "agentflow.errors.EngineError"
    assert "gen_ai.usage.input_tokens" not in chat.attributes
    http = _only([s for s in _trace_of(spans, chat) if s.name == "POST"])
    assert http.parent.span_id == chat.context.span_id and http.status.status_code == StatusCode.ERROR
    assert http.attributes["http.response.status_code"] == 404 and http.attributes["error.type"] == "404"


def test_an_unnamed_model_is_named_after_the_servers_first_and_listing_is_traced(spans, server):
    url = server[0]
    completion = OpenAIEngine(OpenAIEngineConfig(endpoint=url)).complete(
        [{"role": "user", "content": "hi"}], Sampling(max_tokens=2), timeout=30)
    chat = [s for s in spans.get_finished_spans() if s.name == "chat planner"][-1]
    assert chat.attributes["gen_ai.request.model"] == "planner"
    assert chat.attributes["gen_ai.usage.output_tokens"] == len(completion.token_ids)
    children = sorted((s.attributes["url.full"].rsplit("/", 1)[1], s.name) for s in _trace_of(spans, chat)
                      if s.parent and s.parent.span_id == chat.context.span_id)
    assert children == [("completions", "POST"), ("models", "GET")]


def test_each_retry_is_its_own_http_span(spans):
    answers = iter([httpx.Response(503, text="busy"),
                    httpx.Response(200, json={"id": "r1", "model": "m", "choices": [
                        {"message": {"content": "ok"}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 11, "completion_tokens": 1}})])
    engine = OpenAIEngine(OpenAIEngineConfig(endpoint="http://llm.test:8000/v1", model="m", backoff_s=0.01),
                          transport=httpx.MockTransport(lambda request: next(answers)))
    engine.complete([{"role": "user", "content": "x"}], Sampling(), timeout=10)
    chat = _only([s for s in spans.get_finished_spans() if s.attributes.get("gen_ai.response.id") == "r1"])
    assert chat.status.status_code == StatusCode.UNSET and chat.attributes["gen_ai.usage.input_tokens"] == 11
    attempts = sorted((s for s in _trace_of(spans, chat) if s.name == "POST"), key=lambda s: s.start_time)
    assert [s.attributes["http.response.status_code"] for s in attempts] == [503, 200]
    assert attempts[0].attributes["error.type"] == "503" and attempts[0].status.status_code == StatusCode.ERROR
    assert "http.request.resend_count" not in attempts[0].attributes
    assert attempts[1].attributes["http.request.resend_count"] == 1
    assert attempts[1].attributes["server.address"] == "llm.test" and attempts[1].attributes["server.port"] == 8000


def test_the_embedded_engine_traces_its_calls(spans, server):
    embedded = server[1]
    completion = embedded.complete([{"role": "user", "content": PROMPT}], Sampling(max_tokens=4), timeout=30)
    chat = [s for s in spans.get_finished_spans() if s.name == "chat tiny-v1"][-1]
    a = chat.attributes
    assert chat.kind == SpanKind.CLIENT and a["gen_ai.provider.name"] == "agentflow.embedded"
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "tiny-v1"
    assert a["gen_ai.usage.input_tokens"] == len(completion.prompt_token_ids) > 0
    assert a["gen_ai.usage.output_tokens"] == len(completion.token_ids) > 0
    assert list(a["gen_ai.response.finish_reasons"]) == [completion.finish_reason]
    assert a["agentflow.model_version"] == a["gen_ai.response.model"] == "tiny-v1"
    assert "zebra-prompt-marker" not in json.dumps(dict(a), default=str)


def test_a_timed_out_embedded_call_fails_its_span(spans, server):
    embedded = server[1]
    with pytest.raises(EngineError):
        embedded.complete([{"role": "user", "content": "x"}], Sampling(max_tokens=200), timeout=0.0)
    chat = [s for s in spans.get_finished_spans() if s.name == "chat tiny-v1"][-1]
    assert chat.status.status_code == StatusCode.ERROR
    assert chat.attributes["error.type"] == "agentflow.errors.EngineTimeout"


@pytest.mark.parametrize("url,expected", [
    ("http://user:pw@llm:8000/v1/chat/completions", "http://REDACTED:REDACTED@llm:8000/v1/chat/completions"),
    ("https://llm/v1/models?api-key=s3cret&api-version=2024", "https://llm/v1/models?api-key=REDACTED&api-version=2024"),
    ("https://llm/v1/x?sig=abc&token=t", "https://llm/v1/x?sig=REDACTED&token=REDACTED"),
])
def test_urls_on_spans_carry_no_credentials(url, expected):
    assert redact_url(url) == expected
