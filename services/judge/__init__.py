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
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from agentflow.bus import topics
from agentflow.bus.codec import new_envelope
from agentflow.collectors import default_registry, process_collectors
from agentflow.config import setting
from agentflow.domain.convert import record_from_proto
from agentflow.domain.memory import approx_tokens
from agentflow.errors import EngineError, InvalidInput, ParseFailure
from agentflow.llm.base import Completion, Engine, Message
from agentflow.proto.v1 import events_pb2, trajectory_pb2
from agentflow.rewards import calibration
from agentflow.rewards.calibration import Calibration
from agentflow.rewards.judge import MAX_EVIDENCE_CHARS, Judge, Screened, parse_verdict
from agentflow.rewards.text import as_answers

log = logging.getLogger(__name__)

GRPC_SERVICE = "agentflow.v1.Judge"  # health and reflection only: the judge has no gRPC API of its own
JUDGE_SOURCES = ("judge", "judge_error")  # a record carrying either has been judged already
NO_ANSWER_STATUSES = ("error", "cancelled")
DETAIL_CHARS = 500  # a reward's detail is at most this long
_STEP_MIN_CHARS = 300  # each tool result keeps at least this much when the evidence budget is shared
_STEP_HEADER_CHARS = 260  # a result's "[step N] tool: command" line (the command clipped to 200)
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
Outputs = list[tuple[str, events_pb2.Envelope]]


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


class TokenBucket:
    """At most ``rate`` acquisitions a second on average, bursts of up to ``burst`` (default: one second's worth,
    at least 1). Callers over the rate reserve a token and wait their turn, so they are served in order."""

    def __init__(self, rate: float, burst: float | None = None, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.rate = rate
        self.capacity = burst if burst is not None else max(1.0, rate)
        self.clock, self.sleep = clock, sleep
        self.tokens = self.capacity
        self.updated = clock()
        self.lock = threading.Lock()

    def acquire(self) -> float:
        """Take one token, waiting until it is there; returns the seconds waited (0.0 without a limit)."""
        if self.rate <= 0:
            return 0.0
        with self.lock:
            now = self.clock()
            self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
            self.updated = now
            self.tokens -= 1
            wait = max(0.0, -self.tokens / self.rate)
        if wait:
            self.sleep(wait)
        return wait


class VerdictCache:
    """An LRU of rewards by key, safe across the worker's threads; size 0 keeps nothing."""

    def __init__(self, size: int):
        self.size = size
        self.items: OrderedDict[str, dict] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: str) -> dict | None:
        with self.lock:
            if key not in self.items:
                return None
            self.items.move_to_end(key)
            return dict(self.items[key])

    def put(self, key: str, reward: dict) -> None:
        if self.size <= 0:
            return
        with self.lock:
            self.items[key] = dict(reward)
            self.items.move_to_end(key)
            while len(self.items) > self.size:
                self.items.popitem(last=False)


def verdict_key(mode: str, question: str, answer: str, context: str) -> str:
    """The cache key: SHA-256 of the prompt's inputs (``context``: the reference, or the evidence)."""
    return hashlib.sha256(json.dumps([mode, question, answer, context], ensure_ascii=False).encode()).hexdigest()


def sample_point(trajectory_id: str) -> float:
    """A stable point in [0, 1) for a trajectory id: it is sampled when the point is below the share."""
    return int.from_bytes(hashlib.sha256(trajectory_id.encode()).digest()[:8], "big") / 2**64


def reference_answers(ground_truth: str) -> list[str]:
    """A record's accepted answers: its ground truth, or the answers of a JSON list (several accepted answers are
    stored that way, agentflow.rewards.ground_truth_text)."""
    text = (ground_truth or "").strip()
    if text.startswith("["):
        try:
            listed = json.loads(text)
        except ValueError:
            listed = None
        if isinstance(listed, list) and (answers := as_answers(listed)):
            return answers
    return as_answers(text)


def evidence_parts(record: dict, limit: int = MAX_EVIDENCE_CHARS) -> tuple[list[str], str]:
    """The tool results the agent saw, one text each (``[step N] tool: command`` and the result; the summary of
    compacted steps first), oldest first, from the record's final memory (the turns' results when the memory has no
    steps), and a note of ours on what was left out. At most ``limit`` characters: each result gets an equal share;
    past the limit the oldest are left out. Failed tool calls are not evidence. No parts: no tool call returned a
    result."""
    memory = record.get("memory") or {}
    steps = memory.get("steps") or []
    if not steps and not memory.get("summary"):
        steps = [{"step": t.get("step", i), "tool": (t.get("decision") or {}).get("tool", ""),
                  "command": t.get("command", ""), "result": t.get("result", ""), "error": t.get("tool_error", "")}
                 for i, t in enumerate(record.get("turns") or [])]
    results = [s for s in steps if (s.get("result") or "").strip() and not s.get("error")]
    share = max(_STEP_MIN_CHARS, limit // max(1, len(results)) - _STEP_HEADER_CHARS)
    parts = []
    for s in results:
        result = s["result"].strip()
        if len(result) > share:
            result = result[:share] + f" …[{len(result) - share} chars cut]"
        command = " ".join((s.get("command") or "").split())[:200]
        parts.append(f"[step {s.get('step', '?')}] {s.get('tool') or 'tool'}: {command}\n{result}")
    if memory.get("summary"):
        parts.insert(0, f"Earlier steps (summarised):\n{memory['summary'].strip()}")
    kept, size, note = [], 0, ""
    for part in reversed(parts):  # the latest results first: the answer is most likely drawn from them
        if kept and size + len(part) > limit - 64:  # room for the note
            note = f"({len(parts) - len(kept)} earlier result(s) left out)"
            break
        kept.append(part)
        size += len(part) + 2
    return list(reversed(kept)), note


def evidence(record: dict, limit: int = MAX_EVIDENCE_CHARS) -> str:
    """``evidence_parts`` as one text (the note first). Empty when no tool call returned a result."""
    parts, note = evidence_parts(record, limit)
    return "\n\n".join([note, *parts] if note else parts)


@dataclass(frozen=True)
class Case:
    """What judging one record takes: a ``reward`` decided without a call (and the records ``outcome`` it counts
    as), or the ``screened`` prompt to ask."""

    mode: str = ""
    screened: Screened | None = None
    reward: dict | None = None
    outcome: str = ""


class JudgeService:
    name = "judge"
    input_topics = (topics.TRAJECTORIES,)

    def __init__(self, engine: Engine, settings: JudgeSettings = JudgeSettings(), *, metrics: JudgeMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
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
        """What judging ``record`` takes, after the guard (docs/judge.md, "The guard"): a reward without a call when
        there is no answer, no evidence, an answer that addresses the judge, or only evidence that does; else the
        screened prompt."""
        answer, status = (record.get("answer") or "").strip(), record.get("status") or ""
        if status in NO_ANSWER_STATUSES or not answer:
            why = f"status {status}" if status in NO_ANSWER_STATUSES else "the answer is empty"
            return Case(reward=self._reward(0.0, f"no answer to judge: {why}"), outcome="no_answer")
        question = record.get("query") or ""
        answers = reference_answers(record.get("ground_truth") or "")
        if answers:
            mode, screened = "reference", self.judge.screen_reference(question, answer, answers)
        else:
            mode, (parts, note) = "rubric", evidence_parts(record)
            if not parts:
                return Case(mode, reward=self._reward(0.0, "rubric: no tool result in the record's memory supports "
                                                           "the answer"), outcome="no_evidence")
            screened = self.judge.screen_rubric(question, answer, parts, note)
        if screened.answer_flags:
            return Case(mode, screened, self._reward(0.0, f"INCORRECT ({mode}): {screened.refusal}"), "injection")
        if screened.prompt is None:  # every tool result withheld
            return Case(mode, screened, self._reward(0.0, screened.refusal), "no_evidence")
        return Case(mode, screened)

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
            return self._reward(0.0, f"{mode}: {e.reason}: {e}", source="judge_error")
        self.metrics.calls.labels("correct" if correct else "incorrect").inc()
        label = "CORRECT" if correct else "INCORRECT"
        withheld = f" [{len(screened.withheld)} tool result(s) withheld by the guard]" if screened.withheld else ""
        reward = self._reward(1.0 if correct else 0.0, (f"{label} ({mode}): {analysis}" if analysis else
                                                        f"{label} ({mode})") + withheld)
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

    def _reward(self, value: float, detail: str, source: str = "judge") -> dict:
        return {"value": value, "source": source, "detail": detail[:DETAIL_CHARS], "author": self.settings.name}

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
