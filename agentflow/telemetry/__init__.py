"""Tracing and metrics set-up shared by every process.

Tracing: an SDK tracer provider is always installed (so trace ids exist and land in trajectory records); spans are
exported over OTLP when the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
variables are set (protocol from ``OTEL_EXPORTER_OTLP_PROTOCOL``: ``grpc`` or ``http/protobuf``), to the console with
``OTEL_TRACES_EXPORTER=console``, to an OTLP/JSON file (``AGENTFLOW_TRACES_DIR``: one ``traces-<service>.jsonl`` per
process, each line an ``ExportTraceServiceRequest`` as the collector's file exporter writes it), and nowhere
otherwise. gRPC servers get a server interceptor that continues the caller's trace from metadata and leaves health
checks out.

Metrics: Prometheus collectors (``METRICS``) served on ``AGENTFLOW_METRICS_PORT`` by ``serve_metrics``.
"""

from __future__ import annotations

import base64
import json
import logging
import os

from opentelemetry import trace

log = logging.getLogger(__name__)
_configured = False


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


_metrics: Metrics | None = None


def metrics() -> Metrics:
    global _metrics
    if _metrics is None:
        _metrics = Metrics()
    return _metrics


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

    server, _thread = start_http_server(port, addr=host)
    return server.server_address[1]
