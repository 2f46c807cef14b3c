"""One way to the process's Prometheus collectors (``agentflow.collectors``): every accessor hands out one
instance, also to threads that ask at once, in the registry the metrics endpoint serves."""

import threading

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Counter

from agentflow.collectors import default_registry, process_collectors


def test_threads_that_ask_at_once_share_one_instance():
    class Slow:
        made = 0

        def __init__(self):
            Slow.made += 1
            threading.Event().wait(0.05)  # a window in which a second thread would make its own

    got = []
    threads = [threading.Thread(target=lambda: got.append(process_collectors(Slow))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Slow.made == 1 and all(g is got[0] for g in got)


def test_a_test_registry_or_the_served_one():
    mine = CollectorRegistry()
    assert default_registry(mine) is mine and default_registry() is REGISTRY
    Counter("agentflow_test_only", "x", registry=default_registry(mine)).inc()
    assert mine.get_sample_value("agentflow_test_only_total") == 1


@pytest.mark.parametrize("accessor", [
    "agentflow.telemetry:metrics", "agentflow.rpc.metrics:collectors", "agentflow.llm.metrics:routing_metrics",
    "agentflow.llm.metrics:server_metrics", "agentflow.rollout.metrics:rollout_metrics",
    "agentflow.services.judge:judge_metrics", "agentflow.services.memory.metrics:trajectory_metrics",
    "agentflow.trainer.metrics:trainer_metrics", "agentflow.trainer.drive:drive_metrics",
])
def test_every_accessor_hands_out_one_instance(accessor):
    import importlib

    module, name = accessor.split(":")
    get = getattr(importlib.import_module(module), name)
    assert get() is get()
