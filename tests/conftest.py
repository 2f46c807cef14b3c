"""Shared fixtures: model folders built or converted once per test session.

Every process the tests start (the ring's services, the demo, the trainer) polls the broker every 100 ms instead of
the default 10 ms, as the demo does: on CI's 2 cores the idle consumers' polling otherwise takes most of a core
(docs/event-bus.md, "Latency and idle CPU"). Measured on test_ring.py's throughput tests: 45 % less CPU, 35 % less
wall time. The bus's own tests build ``BusConfig`` directly and keep the default (test_bus_worker checks the hop).

Every process runs torch on one OpenMP thread (``OMP_NUM_THREADS=1``, set before any test imports torch): the
workers share the cores, and a torch process with a thread per core stalls at its barriers whenever another process
holds one (agentflow/cpus.py): test_ring.py's fifty queries took 167 s with two threads in the LLM server and 29 s
with one, on 2 cores beside two busy processes.
"""

import os

import pytest

os.environ.setdefault("AGENTFLOW_KAFKA_FETCH_MAX_WAIT_MS", "100")
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from agentflow.llm.models import build_tiny

    return build_tiny(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="session")
def smollm2_model_dir():
    from agentflow.llm.models import smollm2_dir

    return smollm2_dir()
