"""The GenAI chat span takes the request's settings as they come: one the engine will refuse (a seed "abc", a seed
past 64 bits) is left off the span, so the engine's own error reaches the caller."""

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentflow import telemetry
from agentflow.llm.base import Sampling


@pytest.fixture
def exporter(monkeypatch):
    provider, exporter = TracerProvider(), InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(telemetry.trace, "get_tracer", provider.get_tracer)
    return exporter


@pytest.mark.parametrize("seed, kept", [(7, 7), ("abc", None), (10 ** 30, None), (None, None)])
def test_a_seed_is_on_the_span_only_when_it_is_a_64_bit_int(exporter, seed, kept):
    with telemetry.chat_span("p", "m", Sampling(seed=seed, temperature=1.0, top_p="x", max_tokens=4)):
        pass
    (span,) = exporter.get_finished_spans()
    assert span.attributes.get(telemetry.GEN_AI_REQUEST_SEED) == kept
    assert telemetry.GEN_AI_REQUEST_TOP_P not in span.attributes  # "x": left off too
    assert span.attributes[telemetry.GEN_AI_REQUEST_MAX_TOKENS] == 4
