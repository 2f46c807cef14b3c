"""The record view (``agentflow.domain.trajectory.Record``): one reward precedence and the shared reads, by hand."""

import math

import pytest

from agentflow.domain.trajectory import RATINGS_FIRST, REWARD_PRECEDENCE, Record


def rewards(*pairs) -> dict:
    return {"rewards": [{"value": v, "source": s, "detail": ""} for s, v in pairs]}


def test_precedence_is_rule_then_human_then_vote_then_judge_unless_ratings_come_first():
    assert REWARD_PRECEDENCE == ("rule", "human", "vote", "judge")
    r = rewards(("judge", 0.2), ("vote", 0.4), ("rule", 0.6), ("human", 0.8))
    assert Record(r).reward() == 0.6  # ratings never override the ground truth by default
    assert Record(rewards(("judge", 0.2), ("vote", 0.4), ("human", 0.8))).reward() == 0.8
    assert Record(rewards(("judge", 0.2), ("vote", 0.4))).reward() == 0.4
    assert Record(rewards(("judge", 0.2))).reward() == 0.2
    assert Record(rewards(("rule", 0.6), ("human", 0.0))).reward() == 0.6
    assert Record(rewards(("rule", 0.6), ("human", 0.0))).reward(precedence=RATINGS_FIRST) == 0.0  # said explicitly
    assert Record(r).reward(precedence=RATINGS_FIRST) == 0.8


def test_sources_restrict_without_changing_the_precedence():
    r = Record(rewards(("judge", 0.2), ("rule", 0.6), ("human", 0.8)))
    assert r.reward(["rule"]) == 0.6 and r.reward(["judge"]) == 0.2 and r.reward(["vote"]) is None
    assert r.reward(["judge", "rule"]) == r.reward(["rule", "judge"]) == 0.6
    assert r.reward(["human", "rule"]) == 0.6 and r.reward(["feedback"]) == 0.8  # the source's other name
    with pytest.raises(ValueError, match="unknown reward source"):
        r.reward(["any"])


def test_the_latest_reward_of_a_source_wins():
    assert Record(rewards(("rule", 1.0), ("rule", 0.0))).reward() == 0.0
    assert Record(rewards(("human", 1.0), ("judge", 0.5), ("human", 0.25))).reward() == 0.25
    assert Record(rewards(("human", 1.0), ("feedback", 0.0))).reward() == 0.0  # one source under two names
    assert Record(rewards(("rule", 1.0), ("rule", 0.0))).rewards("rule") == [1.0, 0.0]


def test_values_are_clipped_and_non_numbers_count_as_absent():
    assert Record(rewards(("rule", 7))).reward() == 1.0
    assert Record(rewards(("rule", -0.5))).reward() == 0.0
    assert Record(rewards(("rule", 0.3), ("rule", math.nan))).reward() == 0.3
    assert Record(rewards(("rule", "1"), ("rule", True), ("rule", None))).reward() is None
    assert Record(rewards(("human", math.inf), ("judge", 0.5))).reward() == 0.5


def test_no_reward_is_none():
    assert Record({}).reward() is None
    assert Record({"rewards": []}).reward() is None
    assert Record(rewards(("custom", 1.0))).reward() is None  # a source outside the precedence is not read
    assert Record(rewards(("judge", 1.0))).reward(["rule"]) is None


def planner(version: str) -> dict:
    return {"model_version": version}


def test_planner_versions():
    assert Record({}).planner_versions() == set()
    empty = {"analysis_call": {}, "turns": [{"planner": planner("")}, {"planner": {}}, {}]}
    assert Record(empty).planner_versions() == set()
    one = {"analysis_call": planner("v2"), "turns": [{"planner": planner("v2")}, {"planner": planner("")}]}
    assert Record(one).planner_versions() == {"v2"}
    mixed = {"analysis_call": planner("v1"), "turns": [{"planner": planner("v2")}, {"planner": planner("v2")}]}
    assert Record(mixed).planner_versions() == {"v1", "v2"}


def test_turn_reads():
    record = {"analysis_call": planner("v1"), "status": "answered", "totals": {"latency_s": 2.5}, "turns": [
        {"planner": planner("v1"), "decision": {"tool": "python"}, "tool_error": "boom", "parse_error": ""},
        {"decision": {"tool": ""}, "tool_error": "", "parse_error": "no JSON"},
        {"planner": planner("v1"), "decision": {"tool": "search"}, "tool_error": "", "parse_error": ""},
        {"planner": planner("v1"), "tool_error": "", "parse_error": ""}]}
    r = Record(record)
    assert r.planner_calls() == [planner("v1"), {}, planner("v1"), planner("v1")]  # the analysis is not a turn
    assert r.tools() == ["python", "", "search", ""]
    assert r.error_rate() == 0.5 and r.latency_s() == 2.5
    assert Record({**record, "status": "error"}).error_rate() == 1.0
    assert Record({"status": "answered"}).error_rate() == 0.0 and Record({}).latency_s() == 0.0
    assert Record({"totals": {"latency_s": -1.0}}).latency_s() == 0.0
