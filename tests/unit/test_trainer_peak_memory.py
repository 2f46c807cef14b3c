"""Peak memory per rank as step metrics (``placement.peak_memory``) and as the trainer's Prometheus gauges."""

import torch
from prometheus_client import CollectorRegistry

from agentflow.trainer.metrics import TrainerMetrics
from agentflow.trainer.placement import peak_memory


def test_peak_memory_reads_this_process_host_rss_and_no_device_on_a_cpu():
    before = peak_memory(torch.device("cpu"))
    big = torch.ones(64 * 2 ** 20, dtype=torch.uint8)  # 64 MiB touched: the peak can only grow
    after = peak_memory(torch.device("cpu"))
    assert set(after) == {"peak_host_rss_gb"}
    assert 0.01 < before["peak_host_rss_gb"] <= after["peak_host_rss_gb"] < 1000
    assert after["peak_host_rss_gb"] >= big.numel() / 1e9


def test_the_step_peaks_are_gauges():
    registry = CollectorRegistry()
    TrainerMetrics(registry).observe({"version": 3, "peak_host_rss_gb": 12.5, "peak_device_gb": 40.25})
    assert registry.get_sample_value("agentflow_trainer_peak_host_rss_gigabytes") == 12.5
    assert registry.get_sample_value("agentflow_trainer_peak_device_memory_gigabytes") == 40.25
