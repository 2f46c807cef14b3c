"""The judge service's logic (services/judge): what it judges, with which prompt, what it emits, and how it behaves
when the engine is slow, down or unreadable. Scripted engines only; the real model and broker are in
tests/integration/test_judge_service.py."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry

from agentflow.bus import topics
from agentflow.bus.codec import new_envelope
from agentflow.config import EngineSettings, from_env
from agentflow.domain.convert import from_dict, record_from_proto
from agentflow.domain.trajectory import Record
from agentflow.errors import EngineError, EngineTimeout, InvalidInput
from agentflow.llm.base import Completion
from agentflow.llm.scripted import ScriptedEngine
from agentflow.proto.v1 import events_pb2, trajectory_pb2
from agentflow.rewards.judge import MAX_EVIDENCE_CHARS, Judge
from agentflow.rewards.judge_calls import TokenBucket
from agentflow.rewards.judge_case import evidence, reference_answers, sample_point
from agentflow.services.judge import JudgeMetrics, JudgeService, JudgeSettings

CORRECT = "Analysis: both name Paris\nVerdict: CORRECT"
INCORRECT = "Analysis: Lyon is not Paris\nVerdict: INCORRECT"
ALL = dict(traffic_share=1.0)  # judge every traffic record


def record(tid="t1", *, answer="Paris", ground_truth="Paris", source="traffic", status="answered", rewards=(),
           steps=None, query="What is the capital of France?") -> dict:
    steps = [{"step": 0, "tool": "search", "command": "capital of France", "result": "Paris is the capital of France."}
             ] if steps is None else steps
    return {"trajectory_id": tid, "query": query, "ground_truth": ground_truth, "source": source, "status": status,
            "answer": answer, "turns": [{"step": s["step"], "result": s.get("result", "")} for s in steps],
            "memory": {"query": query, "steps": steps}, "rewards": list(rewards)}


def envelope(data: dict) -> events_pb2.Envelope:
    return new_envelope(data["trajectory_id"], len(data["turns"]), from_dict(data, trajectory_pb2.Trajectory))


class Clock:
    """A fake monotonic clock: sleeping advances it."""

    def __init__(self):
        self.now, self.slept = 100.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class Engine:
    """Replays completions or raises errors, in order; the last item repeats."""

    supports_structured_output = False

    def __init__(self, *items):
        self.items, self.calls = list(items), []

    def complete(self, messages, sampling, *, timeout, json_schema=None, key=""):
        self.calls.append(list(messages))
        item = self.items.pop(0) if len(self.items) > 1 else self.items[0]
        if isinstance(item, Exception):
            raise item
        return item if isinstance(item, Completion) else Completion(text=item)


def service(engine, clock=None, **settings) -> tuple[JudgeService, CollectorRegistry]:
    registry = CollectorRegistry()
    clock = clock or Clock()
    # calibration off unless a test turns it on: these tests count calls, and an always-CORRECT script is refused
    settings = {"max_calls_per_s": 0, "backoff_s": 0.5, "calibrate": False, **settings}
    svc = JudgeService(engine, JudgeSettings(**settings), metrics=JudgeMetrics(registry), clock=clock,
                       sleep=clock.sleep)
    return svc, registry


def metric(registry, name, **labels) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def the_reward(outputs) -> trajectory_pb2.Reward:
    assert len(outputs) == 1
    topic, out = outputs[0]
    assert topic == topics.FEEDBACK and out.WhichOneof("payload") == "feedback"
    assert out.feedback.trajectory_id == out.trajectory_id and out.feedback.author == "llm-judge"
    return out.feedback.reward


# --- verdicts ------------------------------------------------------------------------------------------------------


def test_a_correct_answer_against_the_reference_gets_a_judge_reward_of_one():
    engine = ScriptedEngine([CORRECT])
    svc, registry = service(engine, **ALL)
    reward = the_reward(svc.handle(envelope(record(answer="It is Paris."))))
    assert (reward.value, reward.source, reward.author) == (1.0, "judge", "llm-judge")
    assert "both name Paris" in reward.detail and "reference" in reward.detail
    prompt = engine.calls[0][-1]["content"]
    assert "<accepted_answer>\nParis\n</accepted_answer>" in prompt
    assert "<proposed_answer>\nIt is Paris.\n</proposed_answer>" in prompt
    assert "Tool results" not in prompt  # with a reference, the reference prompt
    assert metric(registry, "agentflow_judge_calls_total", outcome="correct") == 1


def test_a_wrong_answer_gets_zero():
    svc, registry = service(ScriptedEngine([INCORRECT]), **ALL)
    reward = the_reward(svc.handle(envelope(record(answer="Lyon"))))
    assert (reward.value, reward.source) == (0.0, "judge") and "Lyon is not Paris" in reward.detail
    assert metric(registry, "agentflow_judge_calls_total", outcome="incorrect") == 1


def test_several_accepted_answers_stored_as_a_json_list_all_reach_the_prompt():
    engine = ScriptedEngine([CORRECT])
    svc, _ = service(engine, **ALL)
    svc.handle(envelope(record(ground_truth=json.dumps(["Paris", "Paris, France"]))))
    prompt = engine.calls[0][-1]["content"]
    assert "<accepted_answer>\nParis\n</accepted_answer>\n<accepted_answer>\nParis, France\n" in prompt
    assert reference_answers("[1, 2]") == ["1", "2"] and reference_answers("[not json") == ["[not json"]


def test_without_a_reference_the_rubric_sees_the_tool_results_but_not_the_failed_calls():
    engine = ScriptedEngine(["Analysis: the search result states it\nVerdict: CORRECT"])
    svc, _ = service(engine, **ALL)
    steps = [{"step": 0, "tool": "python", "command": "print(1/0)", "error": "ZeroDivisionError", "result": ""},
             {"step": 1, "tool": "search", "command": "capital of France", "result": "Paris is the capital."}]
    reward = the_reward(svc.handle(envelope(record(ground_truth="", steps=steps))))
    assert reward.value == 1.0 and "rubric" in reward.detail
    prompt = engine.calls[0][-1]["content"]
    assert "Tool results the agent saw" in prompt and "Paris is the capital." in prompt
    assert "[step 1] search: capital of France" in prompt and "ZeroDivisionError" not in prompt
    assert "<proposed_answer>\nParis\n</proposed_answer>" in prompt and "<accepted_answer>" not in prompt


def test_the_rubric_says_incorrect_when_the_evidence_does_not_support_the_answer():
    svc, _ = service(ScriptedEngine(["Analysis: no tool result mentions Lyon\nVerdict: INCORRECT"]), **ALL)
    assert the_reward(svc.handle(envelope(record(ground_truth="", answer="Lyon")))).value == 0.0


def test_evidence_is_bounded_and_keeps_the_latest_results():
    steps = [{"step": i, "tool": "search", "command": f"query {i}", "result": f"result {i} " + "x" * 5000}
             for i in range(6)]
    text = evidence({"memory": {"steps": steps}})
    assert len(text) <= MAX_EVIDENCE_CHARS and "result 5" in text and "chars cut" in text
    prompt = Judge.rubric_prompt("q", "a", "y" * 50_000)[-1]["content"]
    assert len(prompt) < MAX_EVIDENCE_CHARS + 2000
    # a record whose memory has no steps: the turns hold the same results
    turns = {"memory": {}, "turns": [{"step": 0, "decision": {"tool": "python"}, "command": "print(6*7)",
                                      "result": "42", "tool_error": ""}]}
    assert evidence(turns) == "[step 0] python: print(6*7)\n42"


def test_a_rubric_record_without_any_tool_result_gets_zero_without_a_call():
    engine = ScriptedEngine([CORRECT])
    svc, registry = service(engine, **ALL)
    failed = [{"step": 0, "tool": "python", "command": "x", "result": "", "error": "NameError"}]
    reward = the_reward(svc.handle(envelope(record(ground_truth="", steps=failed))))
    assert (reward.value, reward.source) == (0.0, "judge") and "no tool result" in reward.detail
    assert engine.calls == [] and metric(registry, "agentflow_judge_records_total", outcome="no_evidence") == 1


@pytest.mark.parametrize("answer,status,why", [("", "answered", "empty"), ("Paris", "error", "status error"),
                                               ("Paris", "cancelled", "status cancelled")])
def test_no_answer_is_zero_without_a_call(answer, status, why):
    engine = ScriptedEngine([CORRECT])
    svc, registry = service(engine, **ALL)
    reward = the_reward(svc.handle(envelope(record(answer=answer, status=status))))
    assert (reward.value, reward.source) == (0.0, "judge") and why in reward.detail
    assert engine.calls == [] and metric(registry, "agentflow_judge_records_total", outcome="no_answer") == 1


def test_the_feedback_event_id_is_the_same_for_the_same_record():
    svc, _ = service(ScriptedEngine([CORRECT]), cache_size=0, **ALL)
    first = svc.handle(envelope(record("t9")))[0][1]
    again = svc.handle(envelope(record("t9")))[0][1]
    other = svc.handle(envelope(record("t10")))[0][1]
    assert first.event_id == again.event_id == f"t9:1:judge-llm-judge" and other.event_id != first.event_id
    assert first.feedback == again.feedback


# --- what is judged --------------------------------------------------------------------------------------------------


def test_traffic_is_sampled_by_a_stable_hash_of_the_trajectory_id():
    ids = [f"traj-{i}" for i in range(4000)]
    svc, _ = service(ScriptedEngine([CORRECT]), traffic_share=0.25)
    chosen = {tid for tid in ids if svc.sampled(tid, "traffic")}
    assert 0.22 < len(chosen) / len(ids) < 0.28
    again, _ = service(ScriptedEngine([CORRECT]), traffic_share=0.25)  # another replica, a restart: the same choice
    assert {tid for tid in ids if again.sampled(tid, "traffic")} == chosen
    wider, _ = service(ScriptedEngine([CORRECT]), traffic_share=0.5)  # a larger share keeps the smaller one's picks
    assert chosen <= {tid for tid in ids if wider.sampled(tid, "traffic")}
    none, _ = service(ScriptedEngine([CORRECT]), traffic_share=0.0)
    every, _ = service(ScriptedEngine([CORRECT]), traffic_share=1.0)
    assert not any(none.sampled(t, "traffic") for t in ids) and all(every.sampled(t, "traffic") for t in ids)
    assert all(0.0 <= sample_point(t) < 1.0 for t in ids[:50])


def test_unsampled_traffic_is_skipped_and_training_is_judged_by_its_own_switch():
    engine = ScriptedEngine([CORRECT])
    svc, registry = service(engine, traffic_share=0.0)
    assert svc.handle(envelope(record("traffic-1"))) == []
    assert metric(registry, "agentflow_judge_records_total", outcome="skip_unsampled") == 1
    assert the_reward(svc.handle(envelope(record("train-1", source="training")))).value == 1.0
    off, _ = service(engine, traffic_share=1.0, judge_training=False)
    assert off.handle(envelope(record("train-2", source="training"))) == []
    assert len(engine.calls) == 1


def test_eval_records_are_never_judged():
    engine = ScriptedEngine([CORRECT])
    svc, registry = service(engine, **ALL)
    assert svc.handle(envelope(record(source="eval"))) == [] and engine.calls == []
    assert metric(registry, "agentflow_judge_records_total", outcome="skip_eval") == 1


@pytest.mark.parametrize("source", ["judge", "judge_error"])
def test_a_record_already_judged_is_skipped(source):
    engine = ScriptedEngine([CORRECT])
    svc, registry = service(engine, **ALL)
    judged = record(rewards=[{"value": 1.0, "source": "rule", "detail": "math"},
                             {"value": 0.0, "source": source, "detail": "x", "author": "another-judge"}])
    assert svc.handle(envelope(judged)) == [] and engine.calls == []
    assert metric(registry, "agentflow_judge_records_total", outcome="skip_judged") == 1
    ruled = record(rewards=[{"value": 0.0, "source": "rule", "detail": "math"}])  # a rule reward alone: judged
    assert the_reward(svc.handle(envelope(ruled))).source == "judge"


def test_other_payloads_are_skipped():
    svc, registry = service(ScriptedEngine([CORRECT]), **ALL)
    feedback = new_envelope("t1", 0, events_pb2.Feedback(trajectory_id="t1"))
    assert svc.handle(feedback) == []
    assert metric(registry, "agentflow_judge_records_total", outcome="skip_not_trajectory") == 1


def test_with_the_memory_service_a_record_is_judged_once_and_the_reemission_does_not_loop():
    from agentflow.services.memory import MemoryService

    engine = ScriptedEngine([CORRECT])
    judge, _ = service(engine, **ALL)
    memory = MemoryService()
    finished = record("loop-1")
    state = events_pb2.MemoryState(record=from_dict(finished, trajectory_pb2.Trajectory), phase="done")
    assert memory.restore([new_envelope("loop-1", 1, state, stage="state-done")]) == []

    feedback = judge.handle(envelope(finished))
    reemitted = [out for topic, out in memory.handle(feedback[0][1]) if topic == topics.TRAJECTORIES]
    assert len(reemitted) == 1
    joined = record_from_proto(reemitted[0].trajectory)
    assert [(r["source"], r["author"], r["value"]) for r in joined["rewards"]] == [("judge", "llm-judge", 1.0)]
    assert Record(joined).reward() == 1.0
    assert judge.handle(reemitted[0]) == []  # the record comes back with the judge's reward: not judged again
    assert len(engine.calls) == 1
    # a redelivered record (before the join was seen) is judged from the cache: the same feedback, a no-op
    again = judge.handle(envelope(finished))
    assert again[0][1].event_id == feedback[0][1].event_id and len(engine.calls) == 1
    assert [t for t, _ in memory.handle(again[0][1]) if t == topics.TRAJECTORIES] == []


# --- cost control ----------------------------------------------------------------------------------------------------


def test_a_cached_verdict_avoids_the_call():
    engine = ScriptedEngine([CORRECT])
    svc, registry = service(engine, **ALL)
    first = the_reward(svc.handle(envelope(record("a"))))
    second = the_reward(svc.handle(envelope(record("b"))))  # same question, answer and reference
    assert first == second and len(engine.calls) == 1
    assert metric(registry, "agentflow_judge_cache_hits_total") == 1
    svc.handle(envelope(record("c", answer="paris")))  # another answer: another key
    assert len(engine.calls) == 2


def test_the_cache_is_an_lru_of_its_size_and_can_be_off():
    engine = ScriptedEngine([CORRECT])
    svc, _ = service(engine, cache_size=1, **ALL)
    for tid, answer in [("1", "A"), ("2", "B"), ("3", "A")]:  # B evicts A
        svc.handle(envelope(record(tid, answer=answer)))
    assert len(engine.calls) == 3
    off, _ = service(engine, cache_size=0, **ALL)
    off.handle(envelope(record("4")))
    off.handle(envelope(record("5")))
    assert len(engine.calls) == 5


def test_calls_are_rate_limited_by_a_token_bucket():
    clock = Clock()
    engine = ScriptedEngine([CORRECT])
    svc, registry = service(engine, clock, max_calls_per_s=2, cache_size=0, **ALL)
    for i in range(6):
        svc.handle(envelope(record(f"r{i}")))
    assert len(engine.calls) == 6
    assert sum(clock.slept) == pytest.approx(2.0)  # a burst of 2, then 4 calls at 2 a second
    assert metric(registry, "agentflow_judge_rate_limit_wait_seconds_total") == pytest.approx(2.0)
    clock.now += 10  # idle: the bucket refills to its burst, not beyond
    before = len(clock.slept)
    for i in range(2):
        svc.handle(envelope(record(f"later{i}")))
    assert len(clock.slept) == before
    assert TokenBucket(0).acquire() == 0.0  # 0: no limit


def test_cached_and_uncalled_verdicts_spend_no_rate():
    clock = Clock()
    svc, _ = service(ScriptedEngine([CORRECT]), clock, max_calls_per_s=1, **ALL)
    for i in range(5):
        svc.handle(envelope(record(f"same{i}")))  # one call, four cache hits
        svc.handle(envelope(record(f"none{i}", answer="")))  # no answer: no call
    assert clock.slept == []


# --- failures --------------------------------------------------------------------------------------------------------


def test_an_unreadable_reply_is_a_judge_error_reward_not_a_silent_zero():
    svc, registry = service(ScriptedEngine(["I think it might be fine, or not."]), **ALL)
    reward = the_reward(svc.handle(envelope(record())))
    assert (reward.value, reward.source, reward.author) == (0.0, "judge_error", "llm-judge")
    assert "parse_error" in reward.detail and "might be fine" in reward.detail
    assert metric(registry, "agentflow_judge_calls_total", outcome="parse_error") == 1
    assert Record({"rewards": [{"value": reward.value, "source": reward.source}]}).reward() is None  # ignored
    assert svc.cache.items == {}  # not cached: a later record with the same content is asked again


def test_a_transient_engine_error_is_retried_with_backoff():
    clock = Clock()
    engine = Engine(EngineError("connection refused"), EngineTimeout("slow"), CORRECT)
    svc, registry = service(engine, clock, attempts=3)
    assert the_reward(svc.handle(envelope(record(source="training")))).value == 1.0
    assert len(engine.calls) == 3 and clock.slept == [0.5, 1.0]
    assert metric(registry, "agentflow_judge_calls_total", outcome="engine_error") == 2
    assert metric(registry, "agentflow_judge_call_seconds_count") == 3


def test_an_engine_that_stays_down_raises_for_the_worker_and_publishes_nothing():
    from agentflow.bus.worker import is_retryable

    clock = Clock()
    engine = Engine(EngineError("connection refused"))
    svc, registry = service(engine, clock, attempts=3)
    with pytest.raises(EngineError) as info:
        svc.handle(envelope(record(source="training")))
    assert is_retryable(info.value)  # the worker retries the record, then dead-letters it
    assert len(engine.calls) == 3 and clock.slept == [0.5, 1.0]
    assert metric(registry, "agentflow_judge_calls_total", outcome="engine_error") == 3
    assert svc.cache.items == {}


def test_tokens_are_counted_exactly_from_token_ids_and_estimated_without_them():
    engine = Engine(Completion(text=CORRECT, prompt_token_ids=list(range(120)), token_ids=list(range(9))))
    svc, registry = service(engine, **ALL)
    svc.handle(envelope(record()))
    assert metric(registry, "agentflow_judge_prompt_tokens_total", counted="exact") == 120
    assert metric(registry, "agentflow_judge_completion_tokens_total", counted="exact") == 9
    scripted, registry = service(ScriptedEngine([CORRECT]), **ALL)
    scripted.handle(envelope(record()))
    assert metric(registry, "agentflow_judge_prompt_tokens_total", counted="estimated") > 50
    assert metric(registry, "agentflow_judge_completion_tokens_total", counted="estimated") == (len(CORRECT) + 3) // 4
    assert metric(registry, "agentflow_judge_call_seconds_count") == 1


def test_judge_metrics_have_help_and_prometheus_names():
    registry = CollectorRegistry()
    JudgeMetrics(registry)
    names = {m.name: m.documentation for m in registry.collect()}
    assert all(name.startswith("agentflow_judge_") and len(doc) > 20 for name, doc in names.items())
    samples = {s.name for m in registry.collect() for s in m.samples}
    assert {"agentflow_judge_cache_hits_total", "agentflow_judge_call_seconds_bucket"} <= samples


# --- settings and serving ------------------------------------------------------------------------------------------


def test_judge_settings_from_the_environment_and_their_checks():
    settings = from_env(JudgeSettings, "JUDGE_", environ={"AGENTFLOW_JUDGE_TRAFFIC_SHARE": "0.5",
                                                          "AGENTFLOW_JUDGE_JUDGE_TRAINING": "false",
                                                          "AGENTFLOW_JUDGE_MAX_CALLS_PER_S": "1.5",
                                                          "AGENTFLOW_JUDGE_NAME": "judge-b"})
    assert (settings.traffic_share, settings.judge_training, settings.max_calls_per_s, settings.name) == (
        0.5, False, 1.5, "judge-b")
    defaults = JudgeSettings()
    assert (defaults.traffic_share, defaults.judge_training, defaults.max_calls_per_s) == (0.1, True, 5.0)
    for bad in ({"traffic_share": 1.5}, {"attempts": 0}, {"timeout_s": 0}, {"cache_size": -1}, {"name": "a b"},
                {"name": "x:y"}, {"max_calls_per_s": -1}):
        with pytest.raises(InvalidInput):
            JudgeSettings(**bad)


def test_serving_builds_the_judge_on_the_modules_engine(monkeypatch):
    from agentflow.bus.config import BusConfig
    from agentflow.flow.loop import LoopConfig
    from agentflow.llm.openai_engine import OpenAIEngine
    from agentflow.services.serving import OPTIONAL_SERVICES, SERVICES, build_service

    monkeypatch.setenv("AGENTFLOW_JUDGE_NAME", "judge-x")
    engine = EngineSettings(engine="openai", endpoint="http://127.0.0.1:9/v1")
    svc, grpc_name = build_service("judge", engine, engine, BusConfig(), LoopConfig(), [])
    assert isinstance(svc, JudgeService) and isinstance(svc.judge.engine, OpenAIEngine)
    assert svc.settings.name == "judge-x" and svc.input_topics == (topics.TRAJECTORIES,)
    assert grpc_name == "agentflow.v1.Judge" and "judge" in OPTIONAL_SERVICES and "judge" not in SERVICES


def test_serving_cli_knows_serve_judge(capsys):
    from agentflow.cli import main

    with pytest.raises(SystemExit) as info:
        main(["serve", "judge", "--help"])
    assert info.value.code == 0 and "judge" in capsys.readouterr().out


def test_the_judge_library_offers_the_rubric_beside_the_reference_check():
    engine = ScriptedEngine(["Analysis: step 0 printed 42\nVerdict: CORRECT"])
    verdict = Judge(engine).supported_verdict("What is 6*7?", "42", "[step 0] python: print(6*7)\n42")
    assert verdict.correct and verdict.analysis == "step 0 printed 42" and verdict.completion.text == verdict.raw
    assert "Tool results the agent saw" in engine.calls[0][-1]["content"]
    assert Judge(ScriptedEngine([INCORRECT])).verdict("q", "Lyon", "Paris").correct is False  # unchanged API
