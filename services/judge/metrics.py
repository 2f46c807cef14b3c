"""The judge service's Prometheus collectors (served by ``agentflow.telemetry.serve_metrics``)."""

from __future__ import annotations

from agentflow.collectors import default_registry, process_collectors


class JudgeMetrics:
    """The judge's Prometheus collectors (served by ``agentflow.telemetry.serve_metrics``)."""

    def __init__(self, registry=None):
        from prometheus_client import Counter, Gauge, Histogram

        registry = default_registry(registry)
        self.records = Counter(
            "agentflow_judge_records", "Trajectory records read by the judge, by what it did (judged: an LLM call; "
            "cached; no_answer, no_evidence and injection: 0 without a call; skip_eval, skip_judged: already carries "
            "a judge reward, skip_unsampled, skip_not_trajectory, skip_uncalibrated: the judge is refused as a "
            "reward source)", ["outcome"], registry=registry)
        self.calls = Counter(
            "agentflow_judge_calls", "Judge LLM calls by outcome (correct, incorrect, parse_error: no readable "
            "verdict, engine_error: the engine failed or timed out)", ["outcome"], registry=registry)
        self.prompt_tokens = Counter(
            "agentflow_judge_prompt_tokens", "Prompt tokens sent to the judge (its cost), counted exactly from the "
            "server's token ids or estimated at 4 characters a token when it returns none", ["counted"],
            registry=registry)
        self.completion_tokens = Counter(
            "agentflow_judge_completion_tokens", "Tokens the judge generated, counted as for the prompt tokens",
            ["counted"], registry=registry)
        self.cache_hits = Counter("agentflow_judge_cache_hits", "Verdicts answered from the cache, without a call",
                                  registry=registry)
        self.call_seconds = Histogram("agentflow_judge_call_seconds", "Duration of one judge LLM call, failed ones too",
                                      buckets=(.1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60, 120), registry=registry)
        self.rate_limit_wait = Counter("agentflow_judge_rate_limit_wait_seconds",
                                       "Time judge calls spent waiting for the rate limit", registry=registry)
        self.injections = Counter(
            "agentflow_judge_injections", "Texts of judged records that address the judge, by where (answer: the "
            "record gets 0 without a call; evidence: the tool result is withheld from the prompt) and the guard's "
            "rule that flagged them", ["where", "rule"], registry=registry)
        self.calibrated = Gauge("agentflow_judge_calibrated", "1 while the judge passed its last calibration check "
                                "and its verdicts are published, else 0 (also with calibrate off)", registry=registry)
        self.calibration_accuracy = Gauge("agentflow_judge_calibration_accuracy", "The judge's accuracy on the "
                                          "labelled set at its last calibration check", registry=registry)
        self.calibration_accept_rate_on_wrong = Gauge(
            "agentflow_judge_calibration_accept_rate_on_wrong", "Share of the labelled set's wrong answers the judge "
            "called CORRECT at its last calibration check", registry=registry)
        self.calibration_checks = Counter(
            "agentflow_judge_calibration_checks", "Calibration checks of the judge by result (accepted, refused, "
            "engine_error: the engine failed, nothing decided)", ["result"], registry=registry)
        self.calibration_calls = Counter(
            "agentflow_judge_calibration_calls", "LLM calls of calibration checks by outcome (correct, incorrect, "
            "parse_error, engine_error); not in agentflow_judge_calls", ["outcome"], registry=registry)


def judge_metrics() -> JudgeMetrics:
    return process_collectors(JudgeMetrics)
