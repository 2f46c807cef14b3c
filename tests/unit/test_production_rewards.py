"""Rewards for production traffic without labels: the group vote, the feedback ledger, the trainer's group rewards
and its wait for them, the replay pool, the Feedback request checks and the memory service's join."""

from __future__ import annotations

import math

import pytest

from agentflow.bus import topics
from agentflow.bus.codec import new_envelope
from agentflow.domain.trajectory import Record
from agentflow.errors import InvalidInput
from agentflow.proto.v1 import events_pb2, gateway_pb2, trajectory_pb2
from agentflow.rewards.vote import FeedbackLedger, answer_key, majority, vote_rewards
from agentflow.services.gateway import feedback_reward
from agentflow.services.gateway.keys import Caller
from agentflow.trainer.drive import TrafficPool
from agentflow.trainer.rewarding import GroupRewards, parse_sources
from agentflow.trainer.service import GroupCollector


def rec(tid: str, answer: str, *, gid: str = "g", source: str = "training", truth: str = "", query: str = "Q?",
        rewards: list | None = None, status: str = "answered", train_ok: bool = True) -> dict:
    return {"trajectory_id": tid, "group_id": gid, "source": source, "answer": answer, "ground_truth": truth,
            "query": query, "status": status, "rewards": list(rewards or []), "train_ok": train_ok, "turns": []}


# --- the vote -----------------------------------------------------------------------------------------------------


def test_answer_keys_compare_what_the_kind_allows():
    assert answer_key("math", "It is 1,024.") == answer_key("math", "Answer: 1024") == "1024"
    assert answer_key("math", "0.5") == answer_key("math", "1/2")
    assert answer_key("math", "unknown") is None
    assert answer_key("search", "Answer: The Eiffel Tower") == answer_key("search", "eiffel tower")
    assert answer_key("mcq", "I pick (B)", {"options": ["cat", "dog"]}) == "B"
    with pytest.raises(InvalidInput):
        answer_key("gameof24", "1+2")


def test_the_majority_labels_the_group():
    group = [rec(f"t{i}", a) for i, a in enumerate(["42", "42", "42", "41", "unknown"])]
    rewards = vote_rewards(group, "math", min_agreement=0.6)
    assert [r["value"] for r in rewards] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert {r["source"] for r in rewards} == {"vote"} and "3 of 5" in rewards[0]["detail"]


def test_a_tie_or_too_little_agreement_gives_no_reward():
    tie = [rec(f"t{i}", a) for i, a in enumerate(["1", "1", "2", "2"])]
    assert vote_rewards(tie, "math", 0.25) is None and "tie" in majority(tie, "math", 0.25).why
    spread = [rec(f"t{i}", a) for i, a in enumerate(["1", "1", "2", "3", "4"])]
    assert vote_rewards(spread, "math", 0.5) is None  # 2 of 5 < 0.5
    assert vote_rewards([rec("t", "", status="timeout")] * 3, "math", 0.5) is None  # nothing to compare
    failed = [rec("a", "7"), rec("b", "7"), rec("c", "7", status="error")]
    assert [r["value"] for r in vote_rewards(failed, "math", 0.5)] == [1.0, 1.0, 0.0]  # an error does not vote


# --- the ledger ---------------------------------------------------------------------------------------------------


def rated(tid: str, answer: str, value: float, *, query: str = "Q?", train_ok: bool = True, rater: str = "") -> dict:
    """A rated production record; each by a rater of its own unless ``rater`` says who."""
    return rec(tid, answer, gid="", source="traffic", query=query, train_ok=train_ok,
               rewards=[{"value": value, "source": "human", "author": rater or f"user-{tid}"}])


def test_the_ledger_labels_a_replay_by_what_people_said_of_the_same_answer():
    ledger = FeedbackLedger("math")
    assert ledger.add(rated("p1", "It is 42", 1.0, query="What is 6 x 7?"))
    assert ledger.add(rated("p2", "42", 0.0, query="what is 6 X 7"))  # same query, normalised; a noisy rating
    assert ledger.add(rated("p3", "42", 1.0, query="What is 6 x 7?"))
    assert ledger.add(rated("p1", "It is 42", 1.0, query="What is 6 x 7?"))  # the same rater again: not twice
    assert not ledger.add(rated("p4", "42", 1.0, query="What is 6 x 7?", train_ok=False))  # opted out
    assert not ledger.add(rec("p5", "42", source="traffic"))  # not rated
    found = ledger.reward(rec("r1", "Answer: 42", query="What is 6 x 7?"))
    assert found["source"] == "human" and found["value"] == pytest.approx(3 / 5) and "3 rating" in found["detail"]
    unrated = ledger.reward(rec("r2", "41", query="What is 6 x 7?"))  # 2 up, 1 down: not confirmed yet
    assert unrated["value"] == 0.5 and "nobody rated" in unrated["detail"]  # the prior: between rated up and down
    ledger.add(rated("p6", "42", 1.0, query="What is 6 x 7?"))
    other = ledger.reward(rec("r2", "41", query="What is 6 x 7?"))  # nobody rated 41, and 42 is confirmed now
    assert other["value"] == 0.0 and "confirmed another answer" in other["detail"]
    assert ledger.reward(rec("r3", "unknown", query="What is 6 x 7?"))["value"] == 0.0  # no answer at all
    assert ledger.reward(rec("r4", "42", query="Another question?")) is None


def test_an_answer_nobody_rated_gets_the_prior_and_a_confirmed_one_zeroes_only_one_answer_kinds():
    ledger = FeedbackLedger("math")
    ledger.add(rated("p1", "7", 0.0))
    ledger.add(rated("p2", "8", 1.0))  # one noisy thumbs up is weak evidence: 2/3, and it confirms nothing
    assert ledger.reward(rec("r", "8"))["value"] == pytest.approx(2 / 3)
    assert ledger.reward(rec("r", "9"))["value"] == 0.5  # nobody rated 9: the prior
    assert ledger.reward(rec("r", "7"))["value"] == pytest.approx(1 / 3)
    assert ledger.reward(rec("r", "no number"))["value"] == 0.0  # no answer to a query people rated
    assert ledger.reward(rec("r", "8", status="timeout"))["value"] == 0.0  # a failed trajectory answered nothing
    assert ledger.reward(rec("r", "8", query="Nobody rated this?")) is None  # a query nobody rated: nothing
    text = FeedbackLedger("search")  # free text: a paraphrase of a confirmed answer is not wrong, only unrated
    for n in range(3):
        text.add(rated(f"p{n}", "Paris", 1.0))
    assert text.reward(rec("r", "the city of Paris"))["value"] == 0.5


def test_one_rater_has_one_vote_per_answer_however_many_trajectories_they_rate():
    ledger = FeedbackLedger("math")
    for n in range(3):  # three people confirm 42
        ledger.add(rated(f"h{n}", "42", 1.0))
    for n in range(10):  # one rater, ten trajectories: 42 down and 41 up on each
        ledger.add(rated(f"a{n}", "42", 0.0, rater="mallory"))
        ledger.add(rated(f"b{n}", "41", 1.0, rater="mallory"))
    assert ledger.reward(rec("r", "42"))["value"] == pytest.approx((3 + 1) / (4 + 2))  # one vote against, not ten
    assert ledger.reward(rec("r", "41"))["value"] == pytest.approx(2 / 3)  # one rater's vote: weak evidence
    assert ledger.reward(rec("r", "40"))["value"] == 0.0  # 42 is still the confirmed answer (margin 3 - 1 = 2)
    alone = FeedbackLedger("math")
    for n in range(5):  # one rater cannot confirm an answer alone, however often they rate it
        alone.add(rated(f"s{n}", "7", 1.0, rater="mallory"))
    assert alone.reward(rec("r", "8"))["value"] == 0.5
    for n in range(2):
        alone.add(rated(f"t{n}", "7", 1.0))
    assert alone.reward(rec("r", "8"))["value"] == 0.0  # three raters in favour: confirmed
    strict = FeedbackLedger("math", min_raters=4)
    for n in range(3):
        strict.add(rated(f"h{n}", "7", 1.0))
    assert strict.reward(rec("r", "8"))["value"] == 0.5  # margin 3, but only 3 of the 4 raters needed
    with pytest.raises(InvalidInput, match="min_raters"):
        FeedbackLedger("math", min_raters=0)


def test_the_ledger_forgets_the_oldest_queries_and_ratings():
    ledger = FeedbackLedger("math", max_queries=2, max_ratings=2)
    for n in range(3):
        ledger.add(rated(f"p{n}", "1", 1.0, query=f"question {n}"))
    assert len(ledger) == 2 and ledger.reward(rec("r", "1", query="question 0")) is None
    for n, value in enumerate([1.0, 0.0, 0.0]):
        ledger.add(rated(f"q{n}", "5", value, query="question 1"))
    assert ledger.reward(rec("r", "5", query="question 1"))["value"] == pytest.approx(1 / 4)  # the newest two


def test_the_ledger_is_saved_and_loaded_whole_and_bounded():
    ledger = FeedbackLedger("math")
    ledger.add(rated("p1", "42", 1.0, query="question 1"))
    ledger.add(rated("p2", "41", 0.0, query="question 1"))
    ledger.add(rated("p3", "7", 1.0, query="question 2"))
    again = FeedbackLedger("math")
    assert again.loads(ledger.dumps()) == 2
    for record in (rec("r", "42", query="question 1"), rec("r", "41", query="question 1"),
                   rec("r", "7", query="question 2")):
        assert again.reward(record) == ledger.reward(record) is not None
    small = FeedbackLedger("math", max_queries=1)
    assert small.loads(ledger.dumps()) == 1 and small.reward(rec("r", "7", query="question 2")) is not None
    with pytest.raises(InvalidInput, match="kind"):
        FeedbackLedger("mcq").loads(ledger.dumps())


# --- the trainer's group rewards and its wait for them ------------------------------------------------------------


def test_reward_sources_parse_and_refuse_unknown_names():
    assert parse_sources("feedback, vote") == ("human", "vote")
    for bad in ("", "rule,bogus", "any"):
        with pytest.raises(InvalidInput):
            parse_sources(bad)


def test_group_rewards_prefer_ground_truth_then_people_then_the_vote():
    rewards = GroupRewards("math", ("human", "rule", "vote"), min_agreement=0.5)
    labelled = rewards.apply([rec("a", "4", truth="4"), rec("b", "5", truth="4")])
    assert [rewards.reward(r) for r in labelled] == [1.0, 0.0]
    assert not any(Record(r).rewards("vote") for r in labelled)  # a labelled group is not voted on
    rewards.observe(rated("p1", "9", 1.0))
    rewards.observe(rated("p2", "9", 1.0))
    group = rewards.apply([rec("a", "9"), rec("b", "8"), rec("c", "8"), rec("d", "8")])
    assert [rewards.reward(r) for r in group] == [0.75, 0.0, 0.0, 0.0]  # people confirmed 9: the ledger wins
    assert not any(Record(r).rewards("vote") for r in group)  # one scale per group: the ledger's, not the vote's
    labelled = rewards.apply([rec("l1", "9", truth="8"), rec("l2", "8", truth="8"), rec("l3", "7", truth="8")])
    assert [rewards.reward(r) for r in labelled] == [0.0, 1.0, 0.0]  # ground truth: the ledger stays out
    again = rewards.apply(group)
    assert [len(r["rewards"]) for r in again] == [1, 1, 1, 1]  # nothing added twice
    unrated = rewards.apply([rec(t, a, query="Other?") for t, a in (("e", "8"), ("f", "8"), ("g", "8"), ("h", "7"))])
    assert [rewards.reward(r) for r in unrated] == [1.0, 1.0, 1.0, 0.0]  # nobody rated it: the vote
    no_vote = GroupRewards("math", ("rule", "vote"), min_agreement=0.9).apply([rec("a", "1"), rec("b", "2")])
    assert [GroupRewards("math", ("rule", "vote")).reward(r) for r in no_vote] == [None, None]


def test_a_group_waits_for_its_rewards_then_trains_on_the_rewarded_or_is_dropped():
    rewards = GroupRewards("math", ("human", "judge"))
    c = GroupCollector(3, timeout_s=100.0, rewards=rewards, reward_wait_s=30.0)
    judged = [{"value": 1.0, "source": "judge", "author": "j"}]
    for n in range(3):
        c.add(rec(f"a{n}", "1", gid="a"), 0, n, now=0.0)
    assert c.ready_count(now=1.0) == 0  # complete, not rewarded: waiting (a judge outage leaves it waiting)
    c.add(rec("a0", "1", gid="a", rewards=judged), 0, 3, now=2.0)  # re-emitted with the judge's reward
    c.add(rec("a1", "1", gid="a", rewards=[{"value": 0.0, "source": "human", "author": "u"}]), 0, 4, now=2.0)
    assert c.ready_count(now=20.0) == 0
    assert c.resume_offsets() == {0: 0}  # nothing it waits on is committed
    assert c.ready_count(now=31.0) == 1 and c.counts["groups_partly_rewarded"] == 1
    assert sorted(r["trajectory_id"] for r in c.take(1)[0]) == ["a0", "a1"]  # never a default for a2
    for n in range(3):
        c.add(rec(f"b{n}", "1", gid="b"), 0, 10 + n, now=40.0)
    assert c.ready_count(now=41.0) == 0 and c.ready_count(now=80.0) == 0
    assert c.counts["groups_unrewarded"] == 1 and "b" in c.trained  # dropped: nothing to learn, nothing invented
    c.add(rated("p", "1", 1.0), 0, 20, now=81.0)
    assert c.counts["ratings"] == 1 and c.counts["ignored"] == 1  # a rating of production traffic: the ledger


def test_dynamic_sampling_drops_a_group_rewarded_alike_before_it_takes_a_place_in_a_batch():
    def groups(collector, t0):
        for n, truth in enumerate(("7", "8")):  # "flat": every answer right; "spread": two of three right
            for k, answer in enumerate(("7", "7", "7") if truth == "7" else ("8", "8", "9")):
                collector.add(rec(f"{truth}{k}", answer, gid=["flat", "spread"][n], truth=truth), 0, t0 + 3 * n + k,
                              now=0.0)

    dynamic = GroupCollector(3, timeout_s=100.0, rewards=GroupRewards("math", ("rule",)), dynamic_sampling=True)
    groups(dynamic, 0)
    assert dynamic.ready_count(now=1.0) == 1 and dynamic.counts["groups_no_signal"] == 1 and "flat" in dynamic.trained
    assert [r["group_id"] for r in dynamic.take(1)[0]] == ["spread"] * 3
    assert dynamic.resume_offsets() == {0: 6}  # the dropped group's records are used up, not read again
    kept = GroupCollector(3, timeout_s=100.0, rewards=GroupRewards("math", ("rule",)))
    groups(kept, 0)
    assert kept.ready_count(now=1.0) == 2 and kept.counts["groups_no_signal"] == 0


# --- the replay pool ----------------------------------------------------------------------------------------------


def test_the_traffic_pool_replays_rated_first_and_never_an_opted_out_text():
    pool = TrafficPool(window=3)
    pool.add(rec("t1", "1", source="traffic", query="Alpha?"))
    pool.add(rec("t2", "1", source="traffic", query="Beta?"))
    pool.add(rated("t3", "1", 1.0, query="Gamma?"))
    pool.add(rec("t4", "1", source="traffic", query="alpha"))  # the same text again: deduplicated
    pool.add(rec("t5", "1", source="training", query="Delta?"))  # not production traffic
    assert len(pool) == 3
    assert pool.take().query == "Gamma?"  # rated first
    assert pool.take().query == "Alpha?"  # the least replayed; the most recent first (as first seen)
    pool.add(rec("t6", "1", source="traffic", query="Beta?", train_ok=False))  # someone opted out of this text
    pool.add(rec("t7", "1", source="traffic", query="Beta?"))  # later allowed by someone else: still out
    assert [pool.take().query for _ in range(4)] == ["Gamma?", "Alpha?", "Gamma?", "Alpha?"] and pool.refused == 1


# --- Feedback requests and the memory service's join --------------------------------------------------------------


def test_feedback_requests_are_checked():
    app = Caller("app", frozenset({"feedback"}))
    reward = feedback_reward(gateway_pb2.FeedbackRequest(trajectory_id="t1", thumbs_up=True, comment="right"), app)
    assert (reward.value, reward.source, reward.author, reward.detail) == (1.0, "human", "app", "right")
    assert feedback_reward(gateway_pb2.FeedbackRequest(trajectory_id="t1", score=0.25, labeller="al"), app).value == 0.25
    bad = [dict(trajectory_id="t1"), dict(trajectory_id="t1", score=1.01), dict(trajectory_id="t1", score=math.inf),
           dict(trajectory_id="t1", score=1, comment="c" * 2001), dict(trajectory_id="t1", score=1, labeller="a\n"),
           dict(trajectory_id="", score=1), dict(trajectory_id="t" * 65, score=1), dict(trajectory_id="t\x00", score=1)]
    for fields in bad:
        with pytest.raises(InvalidInput):
            feedback_reward(gateway_pb2.FeedbackRequest(**fields), app)


def test_the_rater_is_the_key_and_a_labeller_only_a_note_unless_the_key_may_delegate():
    request = gateway_pb2.FeedbackRequest(trajectory_id="t1", thumbs_up=False, labeller="alice", comment="wrong")
    forged = feedback_reward(request, Caller("mallory", frozenset({"feedback"})))
    assert forged.author == "mallory" and forged.detail == "[labeller alice] wrong"  # a forged name changes nothing
    delegated = feedback_reward(request, Caller("app", frozenset({"feedback", "delegate"})))
    assert delegated.author == "app/alice" and delegated.detail == "wrong"  # a backend speaking for its users


def feedback(tid: str, value: float, author: str, stage: str) -> events_pb2.Envelope:
    reward = trajectory_pb2.Reward(value=value, source="human", author=author)
    return new_envelope(tid, 0, events_pb2.Feedback(trajectory_id=tid, reward=reward, author=author), stage=stage)


def test_memory_joins_feedback_once_per_labeller():
    from agentflow.services.memory import MemoryService

    memory = MemoryService()
    memory.handle(new_envelope("t1", 0, events_pb2.Query(query="What is 1 + 1?", source="traffic", train_ok=True)))
    memory.states["t1"].phase = "done"

    def emitted(envelope):
        return [e for topic, e in memory.handle(envelope) if topic == topics.TRAJECTORIES]

    assert len(emitted(feedback("t1", 1.0, "alice", "f1"))) == 1
    assert emitted(feedback("t1", 1.0, "alice", "f1")) == []  # the same event again
    assert emitted(feedback("t1", 1.0, "alice", "f2")) == []  # the same rating again
    out = emitted(feedback("t1", 0.0, "alice", "f3"))  # a changed mind replaces
    out += emitted(feedback("t1", 1.0, "bob", "f4"))
    assert len(out) == 2 and out[0].event_id != out[1].event_id
    rewards = out[-1].trajectory.rewards
    assert [(r.author, r.value) for r in rewards] == [("alice", 0.0), ("bob", 1.0)]
    assert out[-1].trajectory.train_ok
    assert emitted(feedback("t1", math.nan, "carol", "f5")) == []  # not a number: dropped
    assert emitted(feedback("nope", 1.0, "alice", "f6")) == []  # unknown trajectory
