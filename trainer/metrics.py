"""The trainer's Prometheus collectors (``agentflow train --metrics-port``): one set of gauges per finished step,
plus counters of steps and of what the consumer and the batch builder dropped. The JSON-lines metrics file keeps
every number of every step; these are the ones an alert or a dashboard reads."""

from __future__ import annotations

import time
from collections import OrderedDict

from agentflow.collectors import default_registry, process_collectors

# step metric -> (gauge name, help)
GAUGES = {
    "version": ("agentflow_trainer_version", "Planner version the last step produced"),
    "reward": ("agentflow_trainer_reward_mean", "Mean reward of the last step's scored trajectories"),
    "kl": ("agentflow_trainer_kl", "Token-mean KL to the reference policy in the last step"),
    "entropy": ("agentflow_trainer_entropy", "Token-mean policy entropy in the last step"),
    "grad_norm": ("agentflow_trainer_grad_norm", "Mean gradient norm before clipping in the last step"),
    "loss": ("agentflow_trainer_loss", "Loss of the last step"),
    "tokens_per_s": ("agentflow_trainer_tokens_per_second", "Training tokens per second in the last step"),
    "step_wall_s": ("agentflow_trainer_step_duration_seconds", "Wall time of the last step"),
    "behaviour_abs_s0": ("agentflow_trainer_behaviour_mismatch", "Mean |served - recomputed| log-prob per token "
                         "(nats) on the last step's rows of the version being trained (trainer/behaviour.py)"),
    "peak_host_rss_gb": ("agentflow_trainer_peak_host_rss_gigabytes", "Peak resident host memory of the trainer "
                         "process since it started, GB (rank 0's under torchrun)"),
    "peak_device_gb": ("agentflow_trainer_peak_device_memory_gigabytes", "Peak GPU memory PyTorch allocated in the "
                       "trainer process since it started, GB (rank 0's under torchrun)"),
    "mfu": ("agentflow_trainer_mfu", "Model FLOPs utilisation of the last step's updates (flops_per_token x "
            "tokens/s over peak_tflops x devices; set when the trainer's peak_tflops is)"),
}
DROPPED = ("turns_stale", "turns_unversioned", "turns_too_long", "groups_no_signal", "groups_unscored")


def flops_per_token(params: int, trainable: int) -> int:
    """Model FLOPs per token of one update: forward 2·N and input gradients 2·N through every weight, weight
    gradients 2·N_trainable (6·N full-parameter, ≈ 4·N with LoRA); the reference forward, activation recomputation
    and attention's own FLOPs are left out, as MFU conventions go."""
    return 4 * params + 2 * trainable


def mfu(flops: int, tokens_per_s: float, peak_tflops: float, devices: int) -> float:
    """The share of ``devices`` devices' peak (TFLOP/s each) that ``tokens_per_s`` at ``flops`` per token is."""
    return flops * tokens_per_s / (peak_tflops * 1e12 * devices)


class TrainerMetrics:
    def __init__(self, registry=None):
        from prometheus_client import Counter, Gauge, Histogram

        registry = default_registry(registry)
        self.gauges = {key: Gauge(name, text, registry=registry) for key, (name, text) in GAUGES.items()}
        self.clip_fraction = Gauge("agentflow_trainer_clip_fraction", "Share of tokens whose ratio was clipped "
                                   "(low plus high) in the last step", registry=registry)
        self.last_step = Gauge("agentflow_trainer_last_step_timestamp_seconds", "Unix time the last step ended "
                               "(an alert: no step for too long while trajectories arrive)", registry=registry)
        self.steps = Counter("agentflow_trainer_steps", "Steps by outcome (trained, skipped: no group with a "
                             "reward spread, format_warmup)", ["outcome"], registry=registry)
        self.dropped = Counter("agentflow_trainer_dropped", "What the batch builder left out, by reason (stale "
                               "and unversioned turns, groups without signal or reward, ...)", ["reason"],
                               registry=registry)
        self.lag = Gauge("agentflow_trainer_consumer_lag", "Trajectory records on the topic not yet read by the "
                         "trainer", registry=registry)
        self.quarantined = Counter("agentflow_trainer_quarantined_groups", "Groups not trained on because their "
                                   "served log-probs are not the named version's (trainer/behaviour.py)",
                                   registry=registry)
        self.version_lag = Histogram("agentflow_trainer_version_lag_seconds", "Seconds from a version's "
                                     "publication to the start of the first training rollout sampled from it",
                                     registry=registry, buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800))
        self.consumer = Gauge("agentflow_trainer_consumer", "The group collector's running counts (records, "
                              "groups timed out, dropped, partly rewarded, unrewarded, ...)", ["count"],
                              registry=registry)

    def observe(self, metrics: dict) -> None:
        outcome = ("format_warmup" if metrics.get("stage") == "format_warmup"
                   else "skipped" if metrics.get("skipped") else "trained")
        self.steps.labels(outcome).inc()
        self.last_step.set(time.time())
        for key, gauge in self.gauges.items():
            if isinstance(metrics.get(key), (int, float)):
                gauge.set(metrics[key])
        if "clip_frac_low" in metrics:
            self.clip_fraction.set(metrics["clip_frac_low"] + metrics.get("clip_frac_high", 0.0))
        for reason in DROPPED:
            if metrics.get(f"batch_{reason}"):
                self.dropped.labels(reason).inc(metrics[f"batch_{reason}"])
        if metrics.get("groups_quarantined"):
            self.quarantined.inc(metrics["groups_quarantined"])
        for key, value in metrics.items():
            if key.startswith("consumer_"):
                self.consumer.labels(key.removeprefix("consumer_")).set(value)


class VersionLag:
    """Publication to first rollout: the trainer notes when it publishes each version, and the first training
    record sampled from one gives that version's lag (the record's start minus the publication). ``take`` hands the
    lags since the last call to the step's metrics; each goes to the histogram as it is seen."""

    KEEP = 64  # versions waiting for their first rollout (older ones are never sampled any more)

    def __init__(self, histogram=None):
        self.histogram = histogram
        self.published: OrderedDict[str, float] = OrderedDict()
        self.lags: list[float] = []

    def publish(self, version: str, at_unix: float) -> None:
        self.published[version] = at_unix
        while len(self.published) > self.KEEP:
            self.published.popitem(last=False)

    def observe(self, record: dict) -> None:
        if record.get("source") != "training":
            return
        from agentflow.domain.trajectory import Record

        version = next((c.get("model_version") for c in Record(record).planner_calls() if c.get("model_version")), "")
        published = self.published.pop(version, None)
        if published is None:
            return
        lag = max(0.0, float(record.get("started_at_unix") or 0.0) - published)
        self.lags.append(lag)
        if self.histogram is not None:
            self.histogram.observe(lag)

    def take(self) -> list[float]:
        lags, self.lags = self.lags, []
        return lags


def trainer_metrics() -> TrainerMetrics:
    return process_collectors(TrainerMetrics)
