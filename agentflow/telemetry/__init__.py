"""Tracing and metrics set-up shared by every process.

Tracing: an SDK tracer provider is always installed (so trace ids exist and land in trajectory records); spans are
exported over OTLP when the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
variables are set (protocol from ``OTEL_EXPORTER_OTLP_PROTOCOL``: ``grpc`` or ``http/protobuf``), to the console with
``OTEL_TRACES_EXPORTER=console``, to an OTLP/JSON file (``AGENTFLOW_TRACES_DIR``: one ``traces-<service>.jsonl`` per
process, each line an ``ExportTraceServiceRequest`` as the collector's file exporter writes it), and nowhere
otherwise. gRPC servers get a server interceptor that continues the caller's trace from metadata and leaves health
checks out.

LLM calls: ``chat_span`` and ``http_client_span`` make the client spans of the OpenTelemetry GenAI and HTTP semantic
conventions (``chat {model}`` with its ``gen_ai.*`` attributes, an HTTP ``POST`` under it); they carry sizes (token
counts), never prompt or completion text. Logs: ``agentflow.telemetry.logs`` (text or JSON lines, secrets redacted).

Metrics: Prometheus collectors (``METRICS``) served on ``AGENTFLOW_METRICS_PORT`` by ``serve_metrics``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
from contextlib import contextmanager
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from agentflow.collectors import process_collectors

log = logging.getLogger(__name__)
_configured = False

# GenAI semantic conventions (the names opentelemetry.semconv._incubating.attributes.gen_ai_attributes defines;
# gen_ai.provider.name replaces the deprecated gen_ai.system)
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
AGENTFLOW_MODEL_VERSION = "agentflow.model_version"  # the version that served the call
ERROR_TYPE = "error.type"
LLM_TRACER = "agentflow.llm"


def setup_tracing(service_name: str) -> None:
    """Install the tracer provider for this process (once)."""
    global _configured
    if _configured:
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)}))
    exporter = None
    if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporter = OTLPSpanExporter()
    elif os.environ.get("OTEL_TRACES_EXPORTER") == "console":
        exporter = ConsoleSpanExporter()
    elif os.environ.get("AGENTFLOW_TRACES_DIR"):
        folder = os.environ["AGENTFLOW_TRACES_DIR"]
        exporter = OtlpJsonFileExporter(os.path.join(folder, f"traces-{service_name}.jsonl"))
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _configured = True


class OtlpJsonFileExporter:
    """Spans as OTLP/JSON lines in a file (what an OTLP collector's file exporter writes)."""

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.path = path

    def export(self, spans):
        from google.protobuf import json_format
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        from opentelemetry.sdk.trace.export import SpanExportResult

        request = json_format.MessageToDict(encode_spans(spans))
        for resource in request.get("resourceSpans", []):
            for scope in resource.get("scopeSpans", []):
                for span in scope.get("spans", []):
                    _hex_ids(span)
                    for link in span.get("links", []):
                        _hex_ids(link)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(request, separators=(",", ":")) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _hex_ids(item: dict) -> None:
    """OTLP/JSON writes trace and span ids as hex, where the protobuf JSON mapping writes base64."""
    for key in ("traceId", "spanId", "parentSpanId"):
        if item.get(key):
            item[key] = base64.b64decode(item[key]).hex()


def _attribute_number(value, kind):
    """``value`` as an int or float span attribute, or None: a setting the engine will refuse (a seed "abc", a
    seed too large for 64 bits) must fail the call there, not here."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = kind(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if kind is int and not -2 ** 63 <= number < 2 ** 63:
        return None
    return number


@contextmanager
def chat_span(provider: str, model: str, sampling, *, server_url: str = ""):
    """The GenAI client span of one chat call, ``chat {model}``, current while the call runs.

    The caller adds what the response tells (``record_chat_response``); an exception sets the span's status and
    ``error.type`` and goes on. ``model`` may be empty until known (then ``name_chat_span``)."""
    attributes = {GEN_AI_OPERATION_NAME: "chat", GEN_AI_PROVIDER_NAME: provider}
    for key, value, kind in ((GEN_AI_REQUEST_TEMPERATURE, sampling.temperature, float),
                             (GEN_AI_REQUEST_TOP_P, sampling.top_p, float),
                             (GEN_AI_REQUEST_MAX_TOKENS, sampling.max_tokens, int),
                             (GEN_AI_REQUEST_SEED, sampling.seed, int)):
        number = _attribute_number(value, kind)
        if number is not None:
            attributes[key] = number
    if model:
        attributes[GEN_AI_REQUEST_MODEL] = model
    if server_url:
        attributes.update(_server_attributes(server_url))
    tracer = trace.get_tracer(LLM_TRACER)
    with tracer.start_as_current_span(f"chat {model}" if model else "chat", kind=SpanKind.CLIENT,
                                      attributes=attributes, record_exception=False,
                                      set_status_on_exception=False) as span:
        try:
            yield span
        except BaseException as e:
            mark_failed(span, _exception_type(e))
            raise


def name_chat_span(span, model: str) -> None:
    """Name a chat span after its model once the model is known (a server's first listed one)."""
    span.update_name(f"chat {model}")
    span.set_attribute(GEN_AI_REQUEST_MODEL, model)


def record_chat_response(span, *, response_model: str, finish_reasons, input_tokens: int, output_tokens: int,
                         model_version: str, response_id: str = "") -> None:
    """What the response says: its model, why it ended, tokens in and out, the served version (sizes only)."""
    span.set_attributes({GEN_AI_RESPONSE_MODEL: response_model,
                         GEN_AI_RESPONSE_FINISH_REASONS: [r for r in finish_reasons if r],
                         GEN_AI_USAGE_INPUT_TOKENS: int(input_tokens), GEN_AI_USAGE_OUTPUT_TOKENS: int(output_tokens),
                         AGENTFLOW_MODEL_VERSION: model_version})
    if response_id:
        span.set_attribute(GEN_AI_RESPONSE_ID, response_id)


@contextmanager
def http_client_span(method: str, url: str, resend_count: int = 0):
    """The HTTP client span of one request attempt (named by its method, as the HTTP conventions name a client
    span without a URL template). The caller sets the status code (``record_http_status``)."""
    attributes = {"http.request.method": method, "url.full": redact_url(url), **_server_attributes(url)}
    if resend_count:
        attributes["http.request.resend_count"] = resend_count
    tracer = trace.get_tracer(LLM_TRACER)
    with tracer.start_as_current_span(method, kind=SpanKind.CLIENT, attributes=attributes, record_exception=False,
                                      set_status_on_exception=False) as span:
        try:
            yield span
        except BaseException as e:
            if ERROR_TYPE not in (getattr(span, "attributes", None) or {}):
                mark_failed(span, _exception_type(e))
            raise


def record_http_status(span, status_code: int) -> None:
    """The response's status; 4xx and 5xx fail a client span, with the code as ``error.type``."""
    span.set_attribute("http.response.status_code", status_code)
    if status_code >= 400:
        mark_failed(span, str(status_code))


def mark_failed(span, error_type: str) -> None:
    span.set_attribute(ERROR_TYPE, error_type)
    span.set_status(Status(StatusCode.ERROR, error_type))


def _exception_type(e: BaseException) -> str:
    kind = type(e)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _server_attributes(url: str) -> dict:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    out = {"server.address": parts.hostname or ""}
    if port:
        out["server.port"] = port
    return out


_SECRET_QUERY_KEY = re.compile(r"key|token|sig|secret|password|auth|credential", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` fit for a span: user and password as ``REDACTED``, and so the values of query parameters that
    look like credentials (keys, tokens, signatures)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "REDACTED:REDACTED@" + netloc.rsplit("@", 1)[1]
    query = urlencode([(k, "REDACTED" if _SECRET_QUERY_KEY.search(k) else v)
                       for k, v in parse_qsl(parts.query, keep_blank_values=True)], safe="/:")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def shutdown_tracing() -> None:
    """Flush spans still buffered (call while draining)."""
    provider = trace.get_tracer_provider()
    if hasattr(provider, "shutdown"):
        provider.shutdown()


def grpc_server_interceptor():
    """Continues the caller's trace (W3C context in gRPC metadata); health checks are not traced."""
    from opentelemetry.instrumentation.grpc import filters, server_interceptor

    return server_interceptor(filter_=filters.negate(filters.health_check()))


def instrument_grpc_clients() -> None:
    """Outgoing gRPC calls carry the current trace context."""
    from opentelemetry.instrumentation.grpc import GrpcInstrumentorClient

    GrpcInstrumentorClient().instrument()


class Metrics:
    """The project's Prometheus collectors, created once per process."""

    def __init__(self):
        from prometheus_client import Counter, Histogram

        self.stage_latency = Histogram("agentflow_stage_latency_seconds", "Time a service spent handling one event",
                                       ["service", "stage"], buckets=(.005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))
        self.errors = Counter("agentflow_errors_total", "Handler errors by reason", ["service", "reason"])


def metrics() -> Metrics:
    return process_collectors(Metrics)


def timed_handler(service: str, handle):
    """``handle`` observed: latency per event kind, errors by reason."""
    import time

    m = metrics()

    def timed(envelope):
        started = time.perf_counter()
        try:
            return handle(envelope)
        except Exception as e:
            m.errors.labels(service, getattr(e, "reason", type(e).__name__)).inc()
            raise
        finally:
            m.stage_latency.labels(service, envelope.WhichOneof("payload") or "none").observe(
                time.perf_counter() - started)

    return timed


class WorkerCollector:
    """Exports a worker's own counters (consumer lag, dead letters, retries, ...) at scrape time."""

    def __init__(self, service: str, worker):
        self.service, self.worker = service, worker

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        values = self.worker.metrics()
        lag = GaugeMetricFamily("agentflow_consumer_lag", "Records behind the end of the input topics", labels=["service"])
        lag.add_metric([self.service], values.get("lag", 0))
        ready = GaugeMetricFamily("agentflow_worker_ready", "1 when the worker is connected and assigned",
                                  labels=["service"])
        ready.add_metric([self.service], values.get("ready", 0))
        yield lag
        yield ready
        for name in ("records_processed", "deadlettered", "retries", "handler_errors", "decode_errors", "commits"):
            counter = CounterMetricFamily(f"agentflow_worker_{name}", f"Worker {name.replace('_', ' ')}",
                                          labels=["service"])
            counter.add_metric([self.service], values.get(name, 0))
            yield counter


def serve_metrics(port: int, host: str = "127.0.0.1") -> int:
    """Start the Prometheus endpoint (``/metrics``) on a background thread; returns the bound port."""
    from prometheus_client import start_http_server

    from agentflow.httpd import cannot_listen

    try:
        server, _thread = start_http_server(port, addr=host)
    except (OSError, OverflowError) as e:
        raise cannot_listen("/metrics", host, port, e) from None
    return server.server_address[1]
