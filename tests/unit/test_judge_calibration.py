"""A judge that can say no (agentflow/rewards/calibration.py, services/judge, docs/judge.md "Calibration"): the
decision as a pure function of verdicts and labels against hand-computed numbers, and the gate in the judge service
with scripted judges: always-CORRECT is refused (nothing published), right-by-construction is accepted, the check is
repeated, the refusal logged once, an engine outage decides nothing."""

from __future__ import annotations

import json
import logging

import pytest
from prometheus_client import CollectorRegistry

from agentflow.bus.codec import new_envelope
from agentflow.config import from_env
from agentflow.domain.convert import from_dict
from agentflow.errors import EngineError, InvalidInput
from agentflow.llm.scripted import ScriptedEngine
from agentflow.proto.v1 import trajectory_pb2
from agentflow.rewards.calibration import binomial_tail, decide, load_items
from agentflow.services.judge import JudgeMetrics, JudgeService, JudgeSettings
from tests.standins.judge import always, labelled

T, F = True, False


# --- the decision, by hand ---------------------------------------------------------------------------------------


def test_binomial_tail_by_hand():
    assert binomial_tail(0, 5) == 1.0 and binomial_tail(3, 3) == 0.125
    assert binomial_tail(9, 10) == pytest.approx(11 / 1024)  # C(10,9) + C(10,10) = 11
    assert binomial_tail(5, 10) == pytest.approx(638 / 1024)  # 252 + 210 + 120 + 45 + 10 + 1


def test_a_judge_that_says_correct_to_everything_is_refused_on_every_count():
    c = decide([T] * 10, [T] * 5 + [F] * 5)
    assert (c.n, c.agreed, c.wrong, c.accepted_wrong) == (10, 5, 5, 5)
    assert c.accuracy == 0.5 and c.accept_rate_on_wrong == 1.0 and c.p_value == pytest.approx(638 / 1024)
    assert not c.accepted
    assert c.reason == ("accuracy 0.50 < 0.7; not better than chance (binomial p=0.623 > 0.05); accepts 5/5 wrong "
                        "answers (1.00 > 0.3)")


def test_a_judge_right_nine_times_in_ten_is_accepted():
    c = decide([T, T, T, T, T] + [T, F, F, F, F], [T] * 5 + [F] * 5)
    assert (c.agreed, c.accuracy, c.accepted_wrong, c.accept_rate_on_wrong) == (9, 0.9, 1, 0.2)
    assert c.p_value == pytest.approx(11 / 1024) and c.accepted and c.reason == ""


def test_seventy_percent_of_ten_is_not_better_than_chance():
    c = decide([T, T, T, F, F] + [T, F, F, F, F], [T] * 5 + [F] * 5)
    assert (c.agreed, c.accuracy, c.accept_rate_on_wrong) == (7, 0.7, 0.2)
    assert c.p_value == pytest.approx(176 / 1024)  # 120 + 45 + 10 + 1
    assert not c.accepted and c.reason == "not better than chance (binomial p=0.172 > 0.05)"


def test_an_accurate_judge_that_accepts_too_many_wrong_answers_is_refused():
    c = decide([T] * 10 + [T] * 4 + [F] * 6, [T] * 10 + [F] * 10)
    assert (c.agreed, c.accuracy, c.accepted_wrong, c.accept_rate_on_wrong) == (16, 0.8, 4, 0.4)
    assert c.p_value == pytest.approx((4845 + 1140 + 190 + 20 + 1) / 2 ** 20)
    assert not c.accepted and c.reason == "accepts 4/10 wrong answers (0.40 > 0.3)"
    assert decide([T] * 10 + [T] * 4 + [F] * 6, [T] * 10 + [F] * 10, max_accept_rate_on_wrong=0.4).accepted


def test_unreadable_replies_are_misses_not_accepts_and_no_wrong_item_decides_nothing():
    c = decide([None, T, None, F], [T, T, F, F])
    assert (c.agreed, c.unreadable, c.accepted_wrong, c.accuracy) == (2, 2, 0, 0.5)
    empty = decide([T, T], [T, T])
    assert not empty.accepted and "no wrong answer was judged" in empty.reason
    with pytest.raises(InvalidInput):
        decide([T], [T, F])


# --- the gate in the judge service -------------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def service(responder, clock=None, **settings) -> tuple[JudgeService, ScriptedEngine, CollectorRegistry]:
    registry = CollectorRegistry()
    engine = ScriptedEngine(responder)
    svc = JudgeService(engine, JudgeSettings(**{"traffic_share": 1.0, "max_calls_per_s": 0, "backoff_s": 0,
                                                **settings}),
                       metrics=JudgeMetrics(registry), clock=clock or Clock(), sleep=lambda s: None)
    return svc, engine, registry


def record(tid: str, answer: str = "Canberra") -> dict:
    step = {"step": 0, "tool": "wikipedia", "command": "capital of Australia",
            "result": "Canberra is the capital city of Australia."}
    return {"trajectory_id": tid, "query": "What is the capital of Australia?", "ground_truth": "",
            "source": "training", "status": "answered", "answer": answer,
            "turns": [{"step": 0, "result": step["result"]}], "memory": {"steps": [step]}}


def handle(svc, tid: str, answer: str = "Canberra"):
    data = record(tid, answer)
    return svc.handle(new_envelope(tid, 1, from_dict(data, trajectory_pb2.Trajectory)))


def value(registry, name, **labels) -> float:
    return registry.get_sample_value(name, labels) or 0.0


ASKED = sum(1 for i in load_items() if i.attack != "answer")  # items the guard leaves to the judge


def test_an_always_correct_judge_is_refused_and_nothing_it_says_is_published(caplog):
    svc, engine, registry = service(always(True))
    with caplog.at_level(logging.ERROR, logger="agentflow.services.judge"):
        assert handle(svc, "r1") == [] and handle(svc, "r2", "Sydney") == []
    assert len(engine.calls) == ASKED  # the check, and no call for the records
    assert value(registry, "agentflow_judge_records_total", outcome="skip_uncalibrated") == 2
    assert value(registry, "agentflow_judge_calibrated") == 0 and not svc.serving()
    assert value(registry, "agentflow_judge_calibration_accept_rate_on_wrong") == 1.0
    assert value(registry, "agentflow_judge_calibration_accuracy") == pytest.approx(15 / 34)
    assert value(registry, "agentflow_judge_calibration_checks_total", result="refused") == 1
    assert value(registry, "agentflow_judge_calibration_calls_total", outcome="correct") == ASKED
    assert value(registry, "agentflow_judge_calls_total", outcome="correct") == 0  # calibration is counted apart
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "judge refused as a reward source" in error.getMessage() and "accepts 19/19 wrong" in error.getMessage()


def test_a_judge_right_by_construction_is_accepted_and_its_verdicts_are_published():
    svc, engine, registry = service(labelled(load_items()))
    svc.prepare()  # what the runner does before consuming
    assert svc.calibration.accepted and svc.calibration.accuracy == 1.0 and svc.serving()
    assert value(registry, "agentflow_judge_calibrated") == 1
    assert value(registry, "agentflow_judge_calibration_accept_rate_on_wrong") == 0.0
    (_, right), = handle(svc, "r1")
    (_, wrong), = handle(svc, "r2", "Sydney")
    assert (right.feedback.reward.value, wrong.feedback.reward.value) == (1.0, 0.0)
    assert len(engine.calls) == ASKED + 2


def test_the_judge_is_checked_again_every_interval_and_the_refusal_is_logged_once(caplog):
    clock = Clock()
    answers = {"judge": always(True)}
    svc, engine, registry = service(lambda messages: answers["judge"](messages), clock, calibration_interval_s=60)
    with caplog.at_level(logging.INFO, logger="agentflow.services.judge"):
        assert handle(svc, "r1") == []
        clock.now += 61
        assert handle(svc, "r2") == []  # the old decision holds while the re-check runs in the background
        svc._recheck.join(10)
        assert value(registry, "agentflow_judge_calibration_checks_total", result="refused") == 2
        assert handle(svc, "r3") == []  # checked 0 s ago: no new check
        assert value(registry, "agentflow_judge_calibration_checks_total", result="refused") == 2
        answers["judge"] = labelled(load_items())  # the endpoint now serves a capable model
        clock.now += 61
        handle(svc, "r4")
        svc._recheck.join(10)
        (_, out), = handle(svc, "r5")
    assert out.feedback.reward.value == 1.0 and svc.serving()
    assert value(registry, "agentflow_judge_calibration_checks_total", result="accepted") == 1
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1  # refused twice, said once
    assert any("judge calibrated" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def test_with_the_engine_down_nothing_is_decided_and_the_record_goes_back_to_the_worker():
    state = {"down": True}

    def responder(messages):
        if state["down"]:
            raise EngineError("connection refused")
        return labelled(load_items())(messages)

    svc, engine, registry = service(responder, attempts=2)
    svc.prepare()  # logs, does not raise
    assert svc.calibration is None and not svc.serving()
    with pytest.raises(EngineError):
        handle(svc, "r1")
    # the first item goes alone: a dead engine fails once per check (2 tries each), not once per item
    assert value(registry, "agentflow_judge_calibration_calls_total", outcome="engine_error") == 4
    assert value(registry, "agentflow_judge_calibration_checks_total", result="engine_error") == 2
    state["down"] = False
    (_, out), = handle(svc, "r1")
    assert out.feedback.reward.value == 1.0 and svc.calibration.accepted


def test_calibration_off_publishes_unchecked_and_the_settings_are_checked(tmp_path):
    svc, engine, registry = service(always(True), calibrate=False)
    (_, out), = handle(svc, "r1", "Sydney")
    assert out.feedback.reward.value == 1.0 and len(engine.calls) == 1 and svc.serving()
    settings = from_env(JudgeSettings, "JUDGE_", environ={"AGENTFLOW_JUDGE_CALIBRATE": "false",
                                                          "AGENTFLOW_JUDGE_CALIBRATION_INTERVAL_S": "120",
                                                          "AGENTFLOW_JUDGE_CALIBRATION_MIN_ACCURACY": "0.8"})
    assert (settings.calibrate, settings.calibration_interval_s, settings.calibration_min_accuracy) == (F, 120, 0.8)
    defaults = JudgeSettings()
    assert defaults.calibrate and defaults.calibration_min_accuracy == 0.7
    assert defaults.calibration_max_accept_rate_on_wrong == 0.3 and defaults.calibration_interval_s == 3600
    for bad in ({"calibration_interval_s": -1}, {"calibration_min_accuracy": 1.5},
                {"calibration_max_accept_rate_on_wrong": -0.1}):
        with pytest.raises(InvalidInput):
            JudgeSettings(**bad)
    with pytest.raises(InvalidInput, match="cannot read"):
        service(always(True), calibration_set=str(tmp_path / "missing.jsonl"))
    (tmp_path / "bad.jsonl").write_text('{"id": "x"}\n')
    with pytest.raises(InvalidInput, match="bad.jsonl:1"):
        service(always(True), calibration_set=str(tmp_path / "bad.jsonl"))


def test_a_set_of_ones_own_replaces_the_bundled_one(tmp_path):
    items = [{"id": f"i{n}", "question": f"What is {n} + {n}?", "answer": str(2 * n + (n % 2)), "label": n % 2 == 0,
              "steps": [{"tool": "python", "command": f"print({n} + {n})", "result": str(2 * n)}]} for n in range(12)]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    svc, engine, _ = service(labelled(load_items(path)), calibration_set=str(path))
    assert svc.first_check().accepted and svc.calibration.n == 12 and len(engine.calls) == 12
