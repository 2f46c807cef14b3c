"""``create_server(...) -> (server, port)`` builds a gRPC server without starting it (tests use port 0).

Every server gets standard health checking (NOT_SERVING until the service says it is ready), reflection, the error
interceptor, message-size limits, and TLS or mTLS when certificates are configured.
"""

from __future__ import annotations

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

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass(frozen=True)
class RpcConfig:
    host: str = setting("127.0.0.1", "address to bind (0.0.0.0 in a container)")
    port: int = setting(0, "port to bind; 0 picks a free one")
    max_workers: int = setting(16, "threads serving calls")
    max_message_mb: int = setting(16, "largest request or response")
    grace_s: float = setting(10.0, "how long in-flight calls may finish after SIGTERM")
    tls_cert: str = setting("", "PEM certificate chain; enables TLS")
    tls_key: str = setting("", "PEM private key for tls_cert")
    tls_client_ca: str = setting("", "PEM CA; when set, clients must present a certificate (mTLS)")

    def __post_init__(self):
        if not 0 <= self.port < 65536:
            raise InvalidInput(f"rpc port must be in 0..65535, got {self.port}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise InvalidInput("rpc tls_cert and tls_key must be given together")
        if self.tls_client_ca and not self.tls_cert:
            raise InvalidInput("rpc tls_client_ca (mTLS) needs tls_cert and tls_key")

    def credentials(self) -> grpc.ServerCredentials | None:
        if not self.tls_cert:
            return None
        ca = Path(self.tls_client_ca).read_bytes() if self.tls_client_ca else None
        pair = [(Path(self.tls_key).read_bytes(), Path(self.tls_cert).read_bytes())]
        return grpc.ssl_server_credentials(pair, root_certificates=ca, require_client_auth=ca is not None)


Registrar = Callable[[grpc.Server], None]


def create_server(config: RpcConfig, registrars: Iterable[Registrar], service_names: Iterable[str],
                  interceptors: Iterable[grpc.ServerInterceptor] = ()) -> tuple[grpc.Server, int, health.HealthServicer]:
    limit = config.max_message_mb * 1024 * 1024
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.max_workers),
        interceptors=[ErrorInterceptor(), *interceptors],
        options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)],
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
    port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    if port == 0:
        raise InvalidInput(f"cannot bind gRPC server to {address}")
    return server, port, health_servicer


def set_serving(health_servicer: health.HealthServicer, names: Iterable[str], serving: bool) -> None:
    for name in ["", *names]:
        health_servicer.set(name, SERVING if serving else NOT_SERVING)
