"""Prometheus metrics for every gRPC server: calls by method and status code, latency, calls in flight, and
refused credentials. The interceptor is the outermost one, so it sees what the caller sees (a token refusal, a
domain error mapped to its code, a stream that ended early). Health checks are left out: probes would drown the
numbers."""

from __future__ import annotations

import time

import grpc

from agentflow.collectors import process_collectors

HEALTH_PREFIX = "/grpc.health.v1.Health/"
BUCKETS = (.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _Collectors:
    def __init__(self):
        from prometheus_client import Counter, Gauge, Histogram

        labels = ["grpc_service", "grpc_method"]
        self.handled = Counter("agentflow_grpc_server_handled", "gRPC calls this server finished, by method and "
                               "status code", [*labels, "grpc_code"])
        self.seconds = Histogram("agentflow_grpc_server_handling_seconds", "Time from a call's arrival to its last "
                                 "response message or error", labels, buckets=BUCKETS)
        self.in_flight = Gauge("agentflow_grpc_server_in_flight", "gRPC calls being handled now", labels)
        self.auth_failures = Counter("agentflow_grpc_server_auth_failures", "Calls refused for missing or wrong "
                                     "credentials (an API key or the service token)", labels)


def collectors() -> _Collectors:
    return process_collectors(_Collectors)


def split_method(full: str) -> tuple[str, str]:
    """``/agentflow.v1.AgentFlow/Solve`` -> (``agentflow.v1.AgentFlow``, ``Solve``)."""
    _, service, method = (full.split("/") + ["", ""])[:3]
    return service or "unknown", method or "unknown"


class MetricsInterceptor(grpc.ServerInterceptor):
    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(HEALTH_PREFIX):
            return handler
        labels = split_method(handler_call_details.method)
        if handler.unary_unary:
            return handler._replace(unary_unary=_unary(handler.unary_unary, labels))
        if handler.unary_stream:
            return handler._replace(unary_stream=_stream(handler.unary_stream, labels))
        return handler


def _finish(labels, started: float, context, fallback: grpc.StatusCode) -> None:
    """Count a finished call under the code it ended with (the context's, else ``fallback``)."""
    m = collectors()
    code = context.code() or fallback
    m.in_flight.labels(*labels).dec()
    m.seconds.labels(*labels).observe(time.perf_counter() - started)
    m.handled.labels(*labels, code.name).inc()
    if code == grpc.StatusCode.UNAUTHENTICATED:
        m.auth_failures.labels(*labels).inc()


def _unary(behaviour, labels):
    def call(request, context):
        collectors().in_flight.labels(*labels).inc()
        started, fallback = time.perf_counter(), grpc.StatusCode.UNKNOWN
        try:
            response = behaviour(request, context)
            fallback = grpc.StatusCode.OK
            return response
        finally:
            _finish(labels, started, context, fallback)

    return call


def _stream(behaviour, labels):
    def call(request, context):
        collectors().in_flight.labels(*labels).inc()
        started, fallback = time.perf_counter(), grpc.StatusCode.UNKNOWN
        try:
            yield from behaviour(request, context)
            fallback = grpc.StatusCode.OK
        except GeneratorExit:  # the caller went away mid-stream
            fallback = grpc.StatusCode.CANCELLED
            raise
        finally:
            _finish(labels, started, context, fallback)

    return call
