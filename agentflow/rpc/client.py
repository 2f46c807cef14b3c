"""Client helpers: channels with TLS when asked, health polling, and the gateway's `ask`."""

from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def channel(target: str, *, tls_ca: str = "", token: str = "") -> grpc.Channel:
    """A channel to ``target`` (TLS with ``tls_ca``) whose calls carry the service ``token`` when one is given."""
    if tls_ca:
        from pathlib import Path

        ch = grpc.secure_channel(target, grpc.ssl_channel_credentials(Path(tls_ca).read_bytes()))
    else:
        ch = grpc.insecure_channel(target)
    return grpc.intercept_channel(ch, _Bearer(token)) if token else ch


class _Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, token: str):
        self.header = ("authorization", f"Bearer {token}")

    def _with_token(self, details):
        return details._replace(metadata=[*(details.metadata or ()), self.header])

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)


def health_status(target: str, service: str = "", timeout_s: float = 1.0) -> int | None:
    """The health status of ``service`` at ``target``, or None when it cannot be asked."""
    with grpc.insecure_channel(target) as ch:
        try:
            return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service),
                                                        timeout=timeout_s).status
        except grpc.RpcError:
            return None


def is_serving(target: str, service: str = "") -> bool:
    return health_status(target, service) == health_pb2.HealthCheckResponse.SERVING


def wait_serving(target: str, timeout_s: float, service: str = "") -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if is_serving(target, service):
            return True
        time.sleep(0.1)
    return False
