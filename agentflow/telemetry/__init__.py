"""Tracing and metrics set-up shared by every process.

Tracing: an SDK tracer provider is always installed (so trace ids exist and land in trajectory records); spans are
exported over OTLP when the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
variables are set (protocol from ``OTEL_EXPORTER_OTLP_PROTOCOL``: ``grpc`` or ``http/protobuf``), to the console with
``OTEL_TRACES_EXPORTER=console``, and nowhere otherwise. gRPC servers get a server interceptor that continues the
caller's trace from metadata and leaves health checks out.

Metrics: Prometheus collectors (``METRICS``) served on ``AGENTFLOW_METRICS_PORT`` by ``serve_metrics``.
"""

from __future__ import annotations

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
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _configured = True


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
        from prometheus_client import Counter, Gauge, Histogram

        self.stage_latency = Histogram("agentflow_stage_latency_seconds", "Time spent in one stage of a turn",
                                       ["service", "stage"], buckets=(.005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))
        self.events = Counter("agentflow_events_total", "Events handled", ["service", "topic", "outcome"])
        self.deadletters = Counter("agentflow_deadletters_total", "Records sent to the dead-letter topic", ["service"])
        self.errors = Counter("agentflow_errors_total", "Errors by reason", ["service", "reason"])
        self.consumer_lag = Gauge("agentflow_consumer_lag", "Records behind the end of the input topic",
                                  ["service", "topic"])


_metrics: Metrics | None = None


def metrics() -> Metrics:
    global _metrics
    if _metrics is None:
        _metrics = Metrics()
    return _metrics


def serve_metrics(port: int, host: str = "127.0.0.1") -> int:
    """Start the Prometheus endpoint (``/metrics``) on a background thread; returns the bound port."""
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=host)
    return server.server_address[1]
