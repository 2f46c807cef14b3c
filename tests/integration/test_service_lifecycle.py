"""A service process's life: NOT_SERVING until Kafka appears, SERVING after, a clean drain on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from agentflow.bus.broker import free_port, start_tansu
from agentflow.rpc.client import health_status, wait_serving

pytestmark = pytest.mark.slow
SERVING, NOT_SERVING = 1, 2


def spawn(name: str, bootstrap: str, tmp_path) -> tuple[subprocess.Popen, str]:
    log = (tmp_path / f"{name}.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "agentflow.cli", "-v", "serve", name, "--port", "0",
                                "--bootstrap", bootstrap, "--endpoint", "http://127.0.0.1:9/v1"],
                               stdout=subprocess.PIPE, stderr=log, text=True)
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
    assert "planner: stopped" in log and "Traceback" not in log
