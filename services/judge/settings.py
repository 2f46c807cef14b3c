"""`agentflow serve judge` settings (``JudgeSettings``), validated once at start-up."""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentflow.config import setting
from agentflow.errors import InvalidInput
from agentflow.rewards import calibration

_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True)
class JudgeSettings:
    """`agentflow serve judge` settings; each is also AGENTFLOW_JUDGE_<NAME>. The engine is the services' own
    (AGENTFLOW_ENGINE, AGENTFLOW_ENDPOINT, or ``--endpoint``)."""

    traffic_share: float = setting(0.1, "share of `traffic` records judged, chosen by a stable hash of the trajectory "
                                        "id (0: none, 1: all)")
    judge_training: bool = setting(True, "judge every `training` record")
    max_calls_per_s: float = setting(5.0, "judge LLM calls per second at most, over the whole process (a token "
                                          "bucket; 0: no limit)")
    timeout_s: float = setting(20.0, "deadline of one judge call")
    attempts: int = setting(2, "tries of a call that fails transiently (engine unreachable, timeout) before the error "
                               "goes to the worker, which retries the record and then dead-letters it")
    backoff_s: float = setting(0.5, "first wait between those tries; doubles after each")
    cache_size: int = setting(4096, "verdicts kept (LRU), keyed by the SHA-256 of question, answer and reference or "
                                    "evidence; 0: no cache")
    max_tokens: int = setting(128, "longest judge reply, in tokens")
    name: str = setting("llm-judge", "the judge's name: the author of its rewards, part of their event ids")
    calibrate: bool = setting(True, "check the judge on a labelled set before its verdicts count, and refuse it as "
                                    "a reward source when it is near chance or accepts wrong answers (false: every "
                                    "verdict counts unchecked)")
    calibration_interval_s: float = setting(3600.0, "seconds between two checks of the judge (the endpoint's model "
                                                    "may change); 0: only at start")
    calibration_min_accuracy: float = setting(calibration.MIN_ACCURACY, "accuracy on the labelled set a judge "
                                                                         "needs (and better than chance: a binomial "
                                                                         "test at 0.05)")
    calibration_max_accept_rate_on_wrong: float = setting(calibration.MAX_ACCEPT_RATE_ON_WRONG,
                                                          "share of the set's wrong answers a judge may call CORRECT")
    calibration_set: str = setting("", "the labelled set, a JSONL file (agentflow/rewards/calibration.py, Item); "
                                       "empty: the bundled agentflow/data/judge_calibration.jsonl")

    def __post_init__(self):
        if not 0.0 <= self.traffic_share <= 1.0:
            raise InvalidInput(f"traffic_share must be within [0, 1], got {self.traffic_share}")
        if self.max_calls_per_s < 0 or self.timeout_s <= 0 or self.backoff_s < 0:
            raise InvalidInput("max_calls_per_s and backoff_s must not be negative, timeout_s must be positive")
        if self.attempts < 1 or self.cache_size < 0 or self.max_tokens < 1:
            raise InvalidInput("attempts and max_tokens must be at least 1, cache_size at least 0")
        if not _NAME.fullmatch(self.name):
            raise InvalidInput(f"name must be 1-64 letters, digits, '.', '_' or '-', got {self.name!r}")
        if self.calibration_interval_s < 0:
            raise InvalidInput("calibration_interval_s must not be negative")
        if not (0.0 <= self.calibration_min_accuracy <= 1.0 and 0.0 <= self.calibration_max_accept_rate_on_wrong
                <= 1.0):
            raise InvalidInput("calibration_min_accuracy and calibration_max_accept_rate_on_wrong must be within "
                               "[0, 1]")
