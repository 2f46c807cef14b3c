"""The judge service: scores finished trajectories with an LLM judge (docs/judge.md).

  trajectories -> feedback (one ``Feedback`` per judged trajectory: a "judge" reward, or "judge_error")

It reads every record on ``trajectories`` and judges a sample of them: every ``training`` record (unless
``judge_training`` is off), a stable ``traffic_share`` of ``traffic`` records (by a hash of the trajectory id, so a
record re-emitted later is sampled the same way), never ``eval`` records. A record that already carries a "judge" or
"judge_error" reward is the memory service's re-emission after a join: it is skipped, so the judge never loops.

With a ground truth the judge checks the answer against it (agentflow/prompts/judge.md: a paraphrase check); without
one it applies the rubric (agentflow/prompts/judge_rubric.md): the answer must answer the question AND be supported by
the tool results in the record's memory. A record without an answer (empty, or status error/cancelled) gets 0.0, and a
rubric record without any tool result gets 0.0, both without an LLM call.

A reply with no readable verdict is not a silent 0: it becomes a "judge_error" reward (recorded on the trajectory,
ignored by reward readers). Transient engine failures are retried here (``attempts``, exponential backoff), then
raised: the worker retries the record and finally dead-letters it; no default reward is ever published. Verdicts are
cached (LRU) and calls rate-limited (a token bucket over the whole process).

The judge is guarded (agentflow/rewards/guard.py): what others wrote reaches it as escaped blocks it is told are
data; an answer that addresses the judge gets 0.0 without a call, a tool result that does is withheld from the
prompt. And it must earn its place: before its verdicts count it is calibrated on a labelled set
(agentflow/rewards/calibration.py), and a judge near chance, or one that accepts wrong answers, is refused: health
names the judge's gRPC service NOT_SERVING, records are skipped (``skip_uncalibrated``: nothing is published), the
refusal is logged once, and the check is repeated every ``calibration_interval_s``.

Here: the bus handler, the calls and the calibration schedule (settings in ``settings.py``, metrics in ``metrics.py``);
what judging a record takes is pure, in agentflow/rewards/judge_case.py and judge_calls.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from agentflow.bus import topics
from agentflow.bus.codec import new_envelope
from agentflow.domain.convert import record_from_proto
from agentflow.domain.memory import approx_tokens
from agentflow.errors import EngineError, ParseFailure
from agentflow.llm.base import Completion, Engine, Message
from agentflow.proto.v1 import events_pb2, trajectory_pb2
from agentflow.rewards import calibration
from agentflow.rewards.calibration import Calibration
from agentflow.rewards.judge import Judge, parse_verdict
from agentflow.rewards.judge_calls import TokenBucket, VerdictCache, verdict_key
from agentflow.rewards.judge_case import Case, judge_case, reward_by, sample_point, verdict_reward
from agentflow.services.judge.metrics import JudgeMetrics, judge_metrics
from agentflow.services.judge.settings import JudgeSettings

log = logging.getLogger(__name__)

GRPC_SERVICE = "agentflow.v1.Judge"  # health and reflection only: the judge has no gRPC API of its own
JUDGE_SOURCES = ("judge", "judge_error")  # a record carrying either has been judged already
Outputs = list[tuple[str, events_pb2.Envelope]]


class JudgeService:
    name = "judge"
    input_topics = (topics.TRAJECTORIES,)

    def __init__(self, engine: Engine, settings: JudgeSettings = JudgeSettings(), *,
                 metrics: JudgeMetrics | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.settings = settings
        self.judge = Judge(engine, timeout_s=settings.timeout_s, max_tokens=settings.max_tokens, name=settings.name)
        self.metrics = metrics or judge_metrics()
        self.cache = VerdictCache(settings.cache_size)
        self.bucket = TokenBucket(settings.max_calls_per_s, clock=clock, sleep=sleep)
        self.clock, self.sleep = clock, sleep
        # the calibration gate: the labelled set (read at start: a bad file fails here), the last decision
        self.calibration_items = calibration.load_items(settings.calibration_set) if settings.calibrate else []
        self.calibration: Calibration | None = None
        self._checked_at = 0.0
        self._check_lock = threading.Lock()  # one check at a time
        self._recheck: threading.Thread | None = None

    def register(self, server) -> None:
        """No gRPC API: the runner's server answers health checks only."""

    # --- the ring ------------------------------------------------------------------------------------------------
    def handle(self, envelope: events_pb2.Envelope) -> Outputs:
        if envelope.WhichOneof("payload") != "trajectory":
            self.metrics.records.labels("skip_not_trajectory").inc()
            return []
        message = envelope.trajectory
        tid = message.trajectory_id or envelope.trajectory_id
        skip = self.skip_reason(tid, message) or ("" if self.verdicts_count() else "skip_uncalibrated")
        if skip:
            self.metrics.records.labels(skip).inc()
            return []
        reward = self.score(record_from_proto(message))
        feedback = events_pb2.Feedback(trajectory_id=tid, reward=trajectory_pb2.Reward(**reward),
                                       author=self.settings.name)
        # the same id for the same trajectory, however often it is judged: the memory service drops repeats
        return [(topics.FEEDBACK, new_envelope(tid, len(message.turns), feedback, stage=f"judge-{self.settings.name}"))]

    def skip_reason(self, tid: str, message: trajectory_pb2.Trajectory) -> str:
        """Why a record is not judged ("" when it is)."""
        source = message.source or "traffic"
        if source == "eval":
            return "skip_eval"
        if any(r.source in JUDGE_SOURCES for r in message.rewards):
            return "skip_judged"
        if not self.sampled(tid, source):
            return "skip_unsampled"
        return ""

    def sampled(self, tid: str, source: str) -> bool:
        if source == "training":
            return self.settings.judge_training
        return sample_point(tid) < self.settings.traffic_share  # traffic (and any source not named above)

    # --- judging -------------------------------------------------------------------------------------------------
    def case(self, record: dict) -> Case:
        """What judging ``record`` takes, after the guard (``agentflow.rewards.judge_case.judge_case``)."""
        return judge_case(record, self.settings.name)

    def score(self, record: dict) -> dict:
        """The reward for one finished record (a dict of ``agentflow.v1.Reward``'s fields). Raises EngineError when
        the engine keeps failing."""
        case = self.case(record)
        if case.screened is not None:
            for flag in case.screened.answer_flags:
                self.metrics.injections.labels("answer", flag.rule).inc()
            for flags in case.screened.withheld:
                for flag in flags:
                    self.metrics.injections.labels("evidence", flag.rule).inc()
        if case.reward is not None:
            self.metrics.records.labels(case.outcome).inc()
            if case.outcome == "injection":
                log.warning("%s: the answer of %s addresses the judge: 0.0 (%s)", self.settings.name,
                            record.get("trajectory_id"), case.reward["detail"][:200])
            return case.reward
        mode, screened = case.mode, case.screened
        key = verdict_key(mode, record.get("query") or "", (record.get("answer") or "").strip(), screened.context)
        if (cached := self.cache.get(key)) is not None:
            self.metrics.cache_hits.inc()
            self.metrics.records.labels("cached").inc()
            return cached
        self.metrics.records.labels("judged").inc()
        completion = self._call(screened.prompt, self.metrics.calls)
        try:
            correct, analysis = parse_verdict(completion.text)
        except ParseFailure as e:
            self.metrics.calls.labels("parse_error").inc()
            log.warning("%s: unreadable judge reply for %s: %s", self.settings.name, record.get("trajectory_id"), e)
            return reward_by(self.settings.name, 0.0, f"{mode}: {e.reason}: {e}", source="judge_error")
        self.metrics.calls.labels("correct" if correct else "incorrect").inc()
        reward = verdict_reward(case, correct, analysis, self.settings.name)
        self.cache.put(key, reward)
        return reward

    # --- the calibration gate -------------------------------------------------------------------------------------
    def verdicts_count(self) -> bool:
        """Whether the judge's verdicts may be published: calibration is off, or its last check accepted it. The
        first call runs the first check (raising EngineError while the engine is down: the worker retries the
        record); a decision older than ``calibration_interval_s`` is re-checked in the background, the old one
        holding meanwhile."""
        if not self.settings.calibrate:
            return True
        decision = self.calibration
        if decision is None:
            decision = self.first_check()
        elif self._recheck_due():
            self._recheck = threading.Thread(target=self._recheck_quietly, name=f"{self.name}-calibration",
                                             daemon=True)
            self._recheck.start()
        return decision.accepted

    def serving(self) -> bool:
        """Health of the judge's gRPC service name (services/runtime.py): SERVING while its verdicts count."""
        return not self.settings.calibrate or bool(self.calibration and self.calibration.accepted)

    def prepare(self) -> None:
        """Before consuming (services/runtime.py): the first check, so that records find a decision. An engine that
        is down leaves it to the first record."""
        if not self.settings.calibrate:
            return
        try:
            self.first_check()
        except EngineError as e:
            log.warning("%s: cannot calibrate the judge yet (%s: %s); the first record tries again",
                        self.settings.name, e.reason, e)

    def first_check(self) -> Calibration:
        """The decision, checking once if there is none (concurrent callers wait for the one check)."""
        with self._check_lock:
            if self.calibration is None:
                self._check()
            return self.calibration

    def check_calibration(self) -> Calibration:
        """Check the judge now and publish the decision. Raises EngineError when the engine fails (the last decision
        stays)."""
        with self._check_lock:
            return self._check()

    def calibrate(self) -> Calibration:
        """The judge's verdicts on the labelled set, through the same guarded path as records (no cache), and the
        decision on them. Items the guard decides without a call are not the judge's and do not count."""
        judged = self.judge_items(self.calibration_items or calibration.load_items(self.settings.calibration_set))
        asked = [(item, verdict) for item, case, verdict in judged if case.reward is None]
        return calibration.decide([v for _, v in asked], [item.label for item, _ in asked],
                                  min_accuracy=self.settings.calibration_min_accuracy,
                                  max_accept_rate_on_wrong=self.settings.calibration_max_accept_rate_on_wrong)

    def judge_items(self, items: list[calibration.Item]) -> list[tuple[calibration.Item, Case, bool | None]]:
        """Each item with its case and the judge's verdict (None: unreadable, or the guard decided without a call).
        One call at a time: a call's deadline must not run while it waits behind the others in an embedded engine's
        queue, and an engine that is down fails the first call, not a batch of them. Raises EngineError."""
        judged = []
        for item in items:
            case = self.case(item.record())
            judged.append((item, case, self._calibration_verdict(case) if case.reward is None else None))
        return judged

    def _calibration_verdict(self, case: Case) -> bool | None:
        completion = self._call(case.screened.prompt, self.metrics.calibration_calls)
        try:
            correct, _ = parse_verdict(completion.text)
        except ParseFailure:
            self.metrics.calibration_calls.labels("parse_error").inc()
            return None
        self.metrics.calibration_calls.labels("correct" if correct else "incorrect").inc()
        return correct

    def _check(self) -> Calibration:
        try:
            result = self.calibrate()
        except EngineError:
            self.metrics.calibration_checks.labels("engine_error").inc()
            raise
        previous, self.calibration, self._checked_at = self.calibration, result, self.clock()
        self.metrics.calibration_checks.labels("accepted" if result.accepted else "refused").inc()
        self.metrics.calibrated.set(1 if result.accepted else 0)
        self.metrics.calibration_accuracy.set(result.accuracy)
        self.metrics.calibration_accept_rate_on_wrong.set(result.accept_rate_on_wrong)
        if result.accepted and (previous is None or not previous.accepted):
            log.info("%s: judge calibrated, its verdicts count: %s", self.settings.name, result.summary())
        elif not result.accepted and (previous is None or previous.accepted):  # once per refusal, not per check
            again = (f"checked again every {self.settings.calibration_interval_s:g} s"
                     if self.settings.calibration_interval_s else "not checked again (calibration_interval_s 0)")
            log.error("%s: judge refused as a reward source: %s (%s). No verdict is published until a check "
                      "passes (%s; docs/judge.md, \"Calibration\")", self.settings.name, result.reason,
                      result.summary(), again)
        return result

    def _recheck_due(self) -> bool:
        interval = self.settings.calibration_interval_s
        return (interval > 0 and self.clock() - self._checked_at >= interval
                and not (self._recheck is not None and self._recheck.is_alive()) and not self._check_lock.locked())

    def _recheck_quietly(self) -> None:
        try:
            self.check_calibration()
        except EngineError as e:
            self._checked_at = self.clock()  # try again one interval later
            log.warning("%s: calibration re-check failed (%s: %s); the last decision holds", self.settings.name,
                        e.reason, e)
        except Exception:  # noqa: BLE001 - a background thread: log, never die silently
            log.exception("%s: calibration re-check failed; the last decision holds", self.settings.name)

    def _call(self, prompt: list[Message], calls) -> Completion:
        """One judge call: rate-limited, metered (engine errors in ``calls``: the records' or the calibration's
        counter), transient failures retried with exponential backoff."""
        delay = self.settings.backoff_s
        for attempt in range(1, self.settings.attempts + 1):
            waited = self.bucket.acquire()
            if waited:
                self.metrics.rate_limit_wait.inc(waited)
            started = self.clock()
            try:
                completion = self.judge.ask(prompt)
            except EngineError as e:
                self.metrics.call_seconds.observe(max(0.0, self.clock() - started))
                calls.labels("engine_error").inc()
                if attempt == self.settings.attempts:
                    raise
                log.warning("%s: judge call failed (%s: %s); try %d of %d in %.2f s", self.settings.name, e.reason,
                            e, attempt + 1, self.settings.attempts, delay)
                self.sleep(delay)
                delay *= 2
                continue
            self.metrics.call_seconds.observe(max(0.0, self.clock() - started))
            self._count_tokens(prompt, completion)
            return completion
        raise AssertionError("unreachable")

    def _count_tokens(self, prompt: list[Message], completion: Completion) -> None:
        if completion.prompt_token_ids:
            self.metrics.prompt_tokens.labels("exact").inc(len(completion.prompt_token_ids))
        else:
            self.metrics.prompt_tokens.labels("estimated").inc(
                approx_tokens("\n".join(str(m.get("content", "")) for m in prompt)))
        if completion.token_ids:
            self.metrics.completion_tokens.labels("exact").inc(len(completion.token_ids))
        else:
            self.metrics.completion_tokens.labels("estimated").inc(approx_tokens(completion.text))
