"""Shared fixtures: model folders built or converted once per test session.

Every process the tests start (the ring's services, the demo, the trainer) polls the broker every 100 ms instead of
the default 10 ms, as the demo does: on CI's 2 cores the idle consumers' polling otherwise takes most of a core
(docs/event-bus.md, "Latency and idle CPU"). Measured on test_ring.py's throughput tests: 45 % less CPU, 35 % less
wall time. The bus's own tests build ``BusConfig`` directly and keep the default (test_bus_worker checks the hop).
"""

import os

import pytest

os.environ.setdefault("AGENTFLOW_KAFKA_FETCH_MAX_WAIT_MS", "100")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from agentflow.llm.models import build_tiny

    return build_tiny(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="session")
def smollm2_model_dir():
    from agentflow.llm.models import smollm2_dir

    return smollm2_dir()
