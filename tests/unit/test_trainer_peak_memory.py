"""Peak memory per rank and MFU as step metrics (``placement.peak_memory``, ``metrics.mfu``) and as the trainer's
Prometheus gauges."""

import torch
from prometheus_client import CollectorRegistry

from agentflow.trainer.metrics import TrainerMetrics, flops_per_token, mfu
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
    TrainerMetrics(registry).observe({"version": 3, "peak_host_rss_gb": 12.5, "peak_device_gb": 40.25, "mfu": 0.41})
    assert registry.get_sample_value("agentflow_trainer_peak_host_rss_gigabytes") == 12.5
    assert registry.get_sample_value("agentflow_trainer_peak_device_memory_gigabytes") == 40.25
    assert registry.get_sample_value("agentflow_trainer_mfu") == 0.41


def test_mfu_is_model_flops_over_the_devices_peak():
    """7.6 B parameters full-parameter (6 N a token) at 3,000 tokens/s on 8 devices of 989 TFLOP/s: 1.7 %."""
    flops = flops_per_token(7_600_000_000, 7_600_000_000)
    assert flops == 6 * 7_600_000_000
    assert mfu(flops, 3000.0, 989.0, 8) == (6 * 7.6e9 * 3000) / (989e12 * 8)
    assert flops_per_token(7_600_000_000, 160_000_000) == 4 * 7_600_000_000 + 2 * 160_000_000  # LoRA: about 4 N
