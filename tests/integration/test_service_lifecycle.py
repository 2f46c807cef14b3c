"""A service process's life: NOT_SERVING until Kafka appears, SERVING after, a clean drain on SIGTERM."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from agentflow.bus.broker import free_port, start_tansu
from agentflow.children import spawn_tied
from agentflow.rpc.client import health_status, wait_serving

pytestmark = pytest.mark.slow
SERVING, NOT_SERVING = 1, 2


def spawn(name: str, bootstrap: str, tmp_path, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    import os

    log = (tmp_path / f"{name}.log").open("wb")
    process = spawn_tied([sys.executable, "-m", "agentflow.cli", "-v", "serve", name, "--port", "0",
                          "--bootstrap", bootstrap, "--endpoint", "http://127.0.0.1:9/v1"],
                         stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, **(env or {})})
    info = json.loads(process.stdout.readline())
    return process, f"127.0.0.1:{info['grpc_port']}"


def test_not_serving_until_the_broker_appears_then_serving(tmp_path):
    port = free_port()
    process, target = spawn("memory", f"127.0.0.1:{port}", tmp_path)
    try:
        for _ in range(10):
            assert health_status(target) == NOT_SERVING
            time.sleep(0.3)
        with start_tansu(port):
            assert wait_serving(target, 60), (tmp_path / "memory.log").read_text()[-2000:]
    finally:
        process.kill()
        process.wait()


def test_sigterm_drains_and_exits_cleanly(tmp_path):
    with start_tansu() as broker:
        process, target = spawn("planner", broker.bootstrap, tmp_path)
        assert wait_serving(target, 60)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        assert time.monotonic() - started < 20
    log = (tmp_path / "planner.log").read_text()
    assert "planner: stopped" in log and "Traceback" not in _without_closed_socket_noise(log)


def _without_closed_socket_noise(log: str) -> str:
    """The log without kafka-python's own ERROR record, traceback included, for a receive on a transport that its
    close had already shut ("<KafkaTCPTransport [none] (closed)>: Error receiving network data"): a race inside
    kafka-python while the consumer closes, not a failure of the drain."""
    records = re.split(r"\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", log)
    return "\n".join(r for r in records if not ("kafka.net.transport" in r.split("\n", 1)[0]
                                                 and "(closed)>: Error receiving" in r.split("\n", 1)[0]))


def test_gateway_stops_promptly_when_the_broker_is_gone(tmp_path):
    """SIGTERM after the broker died, with a query whose record Kafka never confirmed: the stop is bounded (the
    publisher's close used to wait a timeout per batch, twice: over 30 s) and the log says what was not flushed."""
    import threading

    import grpc

    from agentflow.proto.v1 import gateway_pb2, gateway_pb2_grpc

    with start_tansu() as broker:
        process, target = spawn("gateway", broker.bootstrap, tmp_path, env={"AGENTFLOW_RPC_GRACE_S": "2"})
        try:
            assert wait_serving(target, 60), (tmp_path / "gateway.log").read_text()[-2000:]
            broker.kill()

            def solve():
                with grpc.insecure_channel(target) as channel:
                    try:
                        gateway_pb2_grpc.AgentFlowStub(channel).Solve(gateway_pb2.SolveRequest(query="2+2?"), timeout=60)
                    except grpc.RpcError:
                        pass

            caller = threading.Thread(target=solve, daemon=True)
            caller.start()
            time.sleep(1.0)  # the query is published, unconfirmed
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            assert process.wait(40) == 0
            stop_s = time.monotonic() - started
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    log = (tmp_path / "gateway.log").read_text()
    print(f"gateway stop with the broker gone: {stop_s:.1f} s")
    assert stop_s < 15, (stop_s, log[-2000:])  # gRPC grace (2 s) + the publisher's bounded close (5 s) + exit
    assert "not confirmed by Kafka" in log, log[-2000:]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_up_starts_everything_and_ctrl_c_stops_it(tiny_model_dir, tmp_path, signum):
    """`agentflow up` as a user runs it: endpoints printed; Ctrl-C the moment they are printed stops everything
    (a SIGINT before the handler was in used to leave all of it running), and even `kill -9` of `up` leaves no
    process behind (the kernel SIGTERMs its children)."""
    import os
    import re

    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "AGENTFLOW_LOOP_MAX_STEPS": "1"}
    process = spawn_tied([sys.executable, "-m", "agentflow.cli", "up", "--model", str(tiny_model_dir),
                          "--log-dir", str(tmp_path / "logs")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=env)
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                break
        if signum == signal.SIGINT:  # `ask` finds this gateway without being told; every metrics port is printed
            asked = subprocess.run([sys.executable, "-m", "agentflow.cli", "ask", "What is 2+2?"], env=env,
                                   capture_output=True, text=True, timeout=300)
            assert asked.returncode in (0, 3) and "trajectory " in asked.stdout, asked.stderr
            metrics = re.findall(r"metrics (http://127\.0\.0\.1:\d+/metrics)", "".join(lines))
            assert len(metrics) == 6, lines
        process.send_signal(signum)
        text = "".join(lines)
        ports = [int(p) for p in re.findall(r"gRPC on 127\.0\.0\.1:(\d+)", text)]
        assert len(ports) == 6, text
        others = [int(p) for p in re.findall(r"(?:LLM server on http://|broker \(tansu\) on )127\.0\.0\.1:(\d+)", text)]
        assert len(others) == 2, text
        assert process.wait(60) == (0 if signum == signal.SIGINT else -signal.SIGKILL)

        def gone(port: int) -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                return False
            except OSError:
                return True

        deadline = time.monotonic() + 30  # a killed `up` cannot wait for its children: they drain on their own
        while not all(gone(p) for p in ports + others) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert [p for p in ports + others if not gone(p)] == [], text
        if signum == signal.SIGINT:
            assert not (tmp_path / "state" / "agentflow" / "up.json").exists()  # a stopped `up` is not found again
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
