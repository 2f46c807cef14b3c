"""``create_server(...) -> (server, port)`` builds a gRPC server without starting it (tests use port 0).

Every server gets standard health checking (NOT_SERVING until the service says it is ready), reflection, call
metrics (``rpc/metrics.py``), the error interceptor, message-size limits, TLS or mTLS when certificates are configured, and the service token check when
one is configured. A server that listens beyond loopback must authenticate its callers (a service token or mTLS)
unless ``allow_unauthenticated`` says otherwise.
"""

from __future__ import annotations

import hmac
import ipaddress
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from agentflow.config import setting
from agentflow.errors import InvalidInput
from agentflow.rpc.errors import ErrorInterceptor
from agentflow.rpc.metrics import MetricsInterceptor

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass(frozen=True)
class RpcConfig:
    host: str = setting("127.0.0.1", "address to bind (0.0.0.0 in a container)")
    port: int = setting(0, "port to bind; 0 picks a free one")
    max_workers: int = setting(16, "threads serving calls")
    max_message_mb: int = setting(16, "largest request or response")
    max_request_kb: int = setting(0, "largest request, when smaller than max_message_mb (0: max_message_mb)")
    grace_s: float = setting(10.0, "how long in-flight calls may finish after SIGTERM")
    tls_cert: str = setting("", "PEM certificate chain; enables TLS")
    tls_key: str = setting("", "PEM private key for tls_cert")
    tls_client_ca: str = setting("", "PEM CA; when set, clients must present a certificate (mTLS)")
    service_token: str = setting("", "shared secret every caller presents as 'authorization: Bearer <token>' "
                                     "(health checks and a service's public API excepted); empty: no check",
                                 repr=False)
    allow_unauthenticated: bool = setting(False, "serve beyond loopback with neither a service token nor mTLS "
                                                 "(only behind a network that authenticates for you)")

    def __post_init__(self):
        if not 0 <= self.port < 65536:
            raise InvalidInput(f"rpc port must be in 0..65535, got {self.port}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise InvalidInput("rpc tls_cert and tls_key must be given together")
        if self.tls_client_ca and not self.tls_cert:
            raise InvalidInput("rpc tls_client_ca (mTLS) needs tls_cert and tls_key")
        if not (self.service_token or self.tls_client_ca or self.allow_unauthenticated or is_loopback(self.host)):
            raise InvalidInput(f"rpc host {self.host} is reachable from other machines, but callers are not "
                               "authenticated: set AGENTFLOW_RPC_SERVICE_TOKEN or mTLS (AGENTFLOW_RPC_TLS_CLIENT_CA), "
                               "or AGENTFLOW_RPC_ALLOW_UNAUTHENTICATED=true")

    def credentials(self) -> grpc.ServerCredentials | None:
        if not self.tls_cert:
            return None
        ca = Path(self.tls_client_ca).read_bytes() if self.tls_client_ca else None
        pair = [(Path(self.tls_key).read_bytes(), Path(self.tls_cert).read_bytes())]
        return grpc.ssl_server_credentials(pair, root_certificates=ca, require_client_auth=ca is not None)


Registrar = Callable[[grpc.Server], None]


def create_server(config: RpcConfig, registrars: Iterable[Registrar], service_names: Iterable[str],
                  interceptors: Iterable[grpc.ServerInterceptor] = (),
                  public: Iterable[str] = ()) -> tuple[grpc.Server, int, health.HealthServicer]:
    """``public``: gRPC services callable without the service token (a user API with its own authentication)."""
    limit = config.max_message_mb * 1024 * 1024
    request_limit = min(limit, config.max_request_kb * 1024) if config.max_request_kb > 0 else limit
    guards = [TokenInterceptor(config.service_token, public)] if config.service_token else []
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.max_workers),
        interceptors=[MetricsInterceptor(), *guards, ErrorInterceptor(), *interceptors],
        options=[("grpc.max_receive_message_length", request_limit), ("grpc.max_send_message_length", limit)],
    )
    for register in registrars:
        register(server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = list(service_names)
    for name in ["", *names]:
        health_servicer.set(name, NOT_SERVING)
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    address = f"{config.host}:{config.port}"
    credentials = config.credentials()
    try:  # grpcio raises RuntimeError where it cannot bind; older releases returned 0
        port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        raise InvalidInput(f"the gRPC server cannot listen on {address} (the port is taken, or the address is not "
                           "this machine's)")
    return server, port, health_servicer


def set_serving(health_servicer: health.HealthServicer, names: Iterable[str], serving: bool, *,
                server: bool | None = None) -> None:
    """``names`` SERVING or not, and the server's own "" likewise (or as ``server`` says, when given)."""
    health_servicer.set("", SERVING if (serving if server is None else server) else NOT_SERVING)
    for name in names:
        health_servicer.set(name, SERVING if serving else NOT_SERVING)


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses (UNAUTHENTICATED) a call without ``authorization: Bearer <token>``, except health checks (probes)
    and the ``public`` services."""

    def __init__(self, token: str, public: Iterable[str] = ()):
        self.expected = f"Bearer {token}".encode()
        self.open = {health.SERVICE_NAME, *public}

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        service = handler_call_details.method.split("/")[1] if handler_call_details.method.count("/") >= 2 else ""
        if handler is None or service in self.open:
            return handler
        given = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        given = given.encode() if isinstance(given, str) else given
        if hmac.compare_digest(given, self.expected):
            return handler
        return _refusing(handler)


def _refusing(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    def refuse(request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "this service needs 'authorization: Bearer <service token>'")

    kind = next(k for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream") if getattr(handler, k))
    return handler._replace(**{kind: refuse})


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps a server reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything
