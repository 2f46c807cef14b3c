"""gRPC plumbing on a real server: TLS, mTLS, error mapping, health and reflection."""

from __future__ import annotations

import subprocess

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentflow.errors import InvalidInput
from agentflow.proto.v1 import modules_pb2, modules_pb2_grpc
from agentflow.rpc.server import RpcConfig, create_server, set_serving
from agentflow.services.memory import GRPC_SERVICE, MemoryService


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with the openssl CLI."""
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
            "-subj", "/CN=agentflow-test-ca", cwd=d)
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}", cwd=d)
        (d / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext", cwd=d)
    return d


def start(config: RpcConfig):
    service = MemoryService()
    server, port, health = create_server(config, [service.register], [GRPC_SERVICE])
    server.start()
    set_serving(health, [GRPC_SERVICE], True)
    return server, port


def get(channel):
    return modules_pb2_grpc.MemoryStub(channel).Get(modules_pb2.MemoryGetRequest(trajectory_id="nope"), timeout=5)


def test_domain_errors_map_to_status_codes():
    server, port = start(RpcConfig())
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            with pytest.raises(grpc.RpcError) as info:
                get(ch)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in info.value.details()
            status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=GRPC_SERVICE),
                                                          timeout=5).status
            assert status == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.stop(0)


def test_tls_server_refuses_plaintext_and_serves_tls(pki):
    server, port = start(RpcConfig(tls_cert=str(pki / "server.pem"), tls_key=str(pki / "server.key")))
    try:
        creds = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{port}", creds) as ch:
            with pytest.raises(grpc.RpcError) as info:
                get(ch)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND  # reached the handler over TLS
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            with pytest.raises(grpc.RpcError) as info:
                get(ch)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(0)


def test_mtls_requires_a_client_certificate(pki):
    config = RpcConfig(tls_cert=str(pki / "server.pem"), tls_key=str(pki / "server.key"),
                       tls_client_ca=str(pki / "ca.pem"))
    server, port = start(config)
    ca = (pki / "ca.pem").read_bytes()
    try:
        with grpc.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(ca)) as ch:
            with pytest.raises(grpc.RpcError) as info:
                get(ch)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # handshake refused without a client cert
        client = grpc.ssl_channel_credentials(ca, (pki / "client.key").read_bytes(), (pki / "client.pem").read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{port}", client) as ch:
            with pytest.raises(grpc.RpcError) as info:
                get(ch)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        server.stop(0)


def test_bad_tls_settings_name_the_setting():
    with pytest.raises(InvalidInput, match="tls_cert and tls_key"):
        RpcConfig(tls_cert="x.pem")
    with pytest.raises(InvalidInput, match="mTLS"):
        RpcConfig(tls_client_ca="ca.pem")


def test_a_service_token_is_required_except_for_health_and_public_services():
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    from agentflow.rpc.client import channel

    service = MemoryService()
    server, port, health = create_server(RpcConfig(service_token="s3cret"), [service.register], [GRPC_SERVICE])
    server.start()
    set_serving(health, [GRPC_SERVICE], True)
    target = f"127.0.0.1:{port}"
    try:
        for token in ("", "wrong", "s3cret-and-more"):
            with channel(target, token=token) as ch:
                with pytest.raises(grpc.RpcError) as info:
                    get(ch)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, token
                with pytest.raises(grpc.RpcError) as info:  # a streaming method: reflection
                    list(reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
                        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
                status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status
                assert status == health_pb2.HealthCheckResponse.SERVING  # the probes need no token
        with channel(target, token="s3cret") as ch:
            with pytest.raises(grpc.RpcError) as info:
                get(ch)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND  # reached the handler
    finally:
        server.stop(0)
    server, port, _ = create_server(RpcConfig(service_token="s3cret"), [service.register], [GRPC_SERVICE],
                                    public=[GRPC_SERVICE])
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            with pytest.raises(grpc.RpcError) as info:
                get(ch)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND  # a public service: its own authentication
    finally:
        server.stop(0)


def test_listening_beyond_loopback_needs_authentication():
    for host in ("0.0.0.0", "10.0.0.7", "::", "agentflow-memory"):
        with pytest.raises(InvalidInput, match="AGENTFLOW_RPC_SERVICE_TOKEN"):
            RpcConfig(host=host)
        RpcConfig(host=host, service_token="t")
        RpcConfig(host=host, allow_unauthenticated=True)
    for host in ("127.0.0.1", "::1", "[::1]", "localhost"):
        RpcConfig(host=host)


def test_a_gateway_beyond_loopback_needs_api_keys():
    from agentflow.services.gateway import GatewayConfig
    from agentflow.services.serving import _check_gateway_auth

    exposed = RpcConfig(host="0.0.0.0", service_token="t")
    with pytest.raises(InvalidInput, match="AGENTFLOW_GATEWAY_API_KEYS"):
        _check_gateway_auth(GatewayConfig(), exposed)
    _check_gateway_auth(GatewayConfig(api_keys=("k",)), exposed)
    _check_gateway_auth(GatewayConfig(allow_anonymous=True), exposed)
    _check_gateway_auth(GatewayConfig(), RpcConfig())  # loopback: development
