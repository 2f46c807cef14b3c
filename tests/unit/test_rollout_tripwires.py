"""The canary tripwires (agentflow/rollout/tripwires.py): the non-answer detector and answer shapes on a table, the
features of a record, each statistic and the firing rule on hand-computed counts, the reasons, the decision they
force (agentflow/rollout/policy.py), and equal arms looked at after every trajectory (noise does not fire them)."""

import numpy as np
import pytest

from agentflow.proto.v1 import events_pb2 as pb
from agentflow.rollout import tripwires as tw
from agentflow.rollout.policy import HOLD, ROLLBACK, Arms, Policy, decide, decide_codes
from agentflow.rollout.tripwires import CANARY, STABLE, Features, TripwireBounds, Tripwires
from agentflow.versions import TRIPPED, quarantined_version


@pytest.mark.parametrize("answer, expected", [
    ("Could you clarify what you mean?", "clarify"),
    ("could you please specify which town you are asking about", "clarify"),  # no question mark needed
    ("Sure! Could you specify which year you mean?", "clarify"),  # in the second sentence of the opening
    ("Please provide more details about the town.", "clarify"),
    ("Do you mean Kerrowick on the north coast or the one inland?", "clarify"),
    ("I\u2019m not sure what you\u2019re asking. The town has 12 bridges.", "clarify"),  # curly apostrophes
    ("I need more information to answer this.", "clarify"),
    ("What is the population of Kerrowick?", "clarify"),  # a bare question instead of an answer
    ("I'm sorry, but I can't help with that.", "refuse"),
    ("As an AI language model, I cannot browse the internet.", "refuse"),
    ("We are unable to provide that information.", "refuse"),
    ("I must decline to answer.", "refuse"),
    ("I don't have access to real-time data.", "refuse"),
    ("4082001", ""),
    ("unknown", ""),  # the generator's "no usable result": a wrong answer, not a non-answer
    ("I don't know.", ""),  # an abstention, not a refusal
    ("", ""),
    ("The population of Dunby is 35127. Would you like more details?", ""),  # an answer ending with an offer
    ("Is Paris the capital of France? Yes, Paris is its capital.", ""),  # a question, then the answer
    ("I can't believe how simple this is: 4.", ""),  # "can't" without a refusal verb
    ("The function cannot return a value here, so use 42.", ""),  # "cannot" without I / we
    ("Kerrowick has 214 bridges. It was founded in 1643. Could you clarify what you mean?", ""),  # past the opening
])
def test_non_answer_detector(answer, expected):
    assert tw.non_answer(answer) == expected


@pytest.mark.parametrize("answer, shape", [
    ("", "empty"), ("   ", "empty"), ("Could you clarify what you mean?", "non-answer"), ("42", "1 word"),
    ("12 bridges", "2-3 words"), ("it has 12 bridges", "4-7 words"), (" ".join(["w"] * 7), "4-7 words"),
    (" ".join(["w"] * 8), "8-15 words"), (" ".join(["w"] * 31), "16-31 words"), (" ".join(["w"] * 32), "32-63 words"),
    (" ".join(["w"] * 64), "64+ words"), (" ".join(["w"] * 5000), "64+ words"),
])
def test_answer_shapes(answer, shape):
    assert tw.SHAPES[tw.shape(answer)] == shape


def turn(tool="python", parse_error="", tool_error=""):
    return {"decision": {"tool": tool, "sub_goal": "", "context": ""}, "parse_error": parse_error,
            "tool_error": tool_error, "planner": {"model_version": "v1"}}


def test_features_of_a_record():
    record = {
        "answer": "I'm sorry, but I can't help with that.",
        "turns": [turn(parse_error="unknown tool 'calculator'; choose one of python, search", tool=""),
                  turn(tool_error="timeout: 5 s"), turn("search"), turn(tool="")],
        "rewards": [{"value": 1.0, "source": "rule"}, {"value": 0.0, "source": "judge"},
                    {"value": 0.0, "source": "judge_error"}],
    }
    assert tw.features(record) == Features(decisions=4, invalid=2, calls=2, tool_errors=1, non_answer=True, words=8,
                                           shape=1, disagree=True)
    assert tw.features({"answer": " ".join(["w"] * 3000)}).words == tw.WORDS_CAP
    assert tw.features({"status": "error"}) == Features(0, 0, 0, 0, False, 0, 0, None)


@pytest.mark.parametrize("rewards, disagree", [
    ([{"value": 1.0, "source": "rule"}], None),
    ([{"value": 1.0, "source": "judge"}], None),
    ([{"value": 0.0, "source": "rule"}, {"value": 0.3, "source": "judge"}], False),  # both below 0.5
    ([{"value": 0.0, "source": "rule"}, {"value": 1.0, "source": "judge"}], True),
    ([{"value": 0.0, "source": "rule"}, {"value": 1.0, "source": "judge"}, {"value": 1.0, "source": "rule"}], False),
])
def test_judge_rule_disagreement_reads_the_latest_of_each(rewards, disagree):
    assert tw.judge_rule_disagreement({"rewards": rewards}) is disagree


def f(decisions=2, invalid=0, calls=2, tool_errors=0, non_answer=False, words=1, shape=2, disagree=None):
    return Features(decisions, invalid, calls, tool_errors, non_answer, words, shape, disagree)


def hand_counted() -> Tripwires:
    """Canary: 4 trajectories, stable: 5 (numbers in test_statistics_by_hand)."""
    t = Tripwires()
    for features in (f(2, 0, 2, 1, disagree=True), f(3, 1, 2, 1, disagree=False),
                     f(1, 0, 1, 0, non_answer=True, words=6, shape=1), f(1, 1, 0, 0, words=0, shape=0)):
        t.add(CANARY, features)
    for i in range(5):
        t.add(STABLE, f(tool_errors=int(i == 0), disagree=False if i < 2 else None))
    return t


def test_statistics_by_hand():
    stats = {name: tuple(float(v) for v in values) for name, values in hand_counted().statistics().items()}
    assert stats["tool_error_rate"] == pytest.approx((2 / 5, 1 / 10, 0.3))  # failed calls / calls
    assert stats["invalid_call_rate"] == pytest.approx((2 / 7, 0.0, 2 / 7))  # invalid / planner decisions
    assert stats["refusal_rate"] == pytest.approx((1 / 4, 0.0, 0.25))
    # mean words of the answers, non-answers aside (canary 2 words in 3 answers); (c+1)/(s+1)
    assert stats["answer_length"] == pytest.approx((2 / 3, 5 / 5, (2 / 3 + 1) / (1 + 1)))
    assert stats["judge_rule_disagreement"] == pytest.approx((1 / 2, 0 / 2, 0.5))  # of the records with both
    # shapes of the answers: canary empty 1/3, 1 word 2/3; stable 1 word 5/5 -> TV = (1/3 + 1/3) / 2
    assert stats["answer_divergence"] == pytest.approx((1 / 3, 0.0, 1 / 3))  # (the top shape's shares, TV)


def fired(t, **bounds) -> list[str]:
    return [trip.tripwire for trip in tw.check(t, TripwireBounds(**bounds))]


def test_a_tripwire_fires_beyond_its_bound_once_both_arms_have_the_minimum():
    t = hand_counted()
    # pairs (2 per arm) gate the disagreement, answers (3 and 5) length and shape, records (4 and 5) the others; the
    # length ratio 0.83 is inside [0.5, 2]
    assert fired(t, min_samples=2) == ["tool_error_rate", "invalid_call_rate", "refusal_rate",
                                       "judge_rule_disagreement", "answer_divergence"]
    assert fired(t, min_samples=3) == ["tool_error_rate", "invalid_call_rate", "refusal_rate", "answer_divergence"]
    assert fired(t, min_samples=4) == ["tool_error_rate", "invalid_call_rate", "refusal_rate"]
    assert fired(t, min_samples=5) == []  # the canary has 4
    assert fired(t, min_samples=0) == []  # off
    assert fired(t, min_samples=2, tool_error_rate=0.3, invalid_call_rate=0.3, refusal_rate=0.25,
                 judge_rule_disagreement=0.5, answer_divergence=1 / 3) == []  # at the bound is within it
    assert fired(t, min_samples=2, answer_length=1.1) == ["tool_error_rate", "invalid_call_rate", "refusal_rate",
                                                          "answer_length", "judge_rule_disagreement",
                                                          "answer_divergence"]


def test_answer_length_fires_both_ways():
    short = Tripwires()
    for _ in range(3):
        short.add(CANARY, f(words=0, shape=0))
        short.add(STABLE, f(words=3, shape=3))
    assert float(short.statistics()["answer_length"][2]) == pytest.approx(0.25)  # (0 + 1) / (3 + 1)
    assert "answer_length" in fired(short, min_samples=3)
    long = Tripwires()
    for _ in range(3):
        long.add(CANARY, f(words=7, shape=4))
        long.add(STABLE, f(words=3, shape=3))
    assert float(long.statistics()["answer_length"][2]) == pytest.approx(2.0)  # at the bound: within
    assert "answer_length" not in fired(long, min_samples=3)


def test_reasons_name_the_tripwire_and_the_numbers():
    trips = {t.tripwire: t.reason for t in tw.check(hand_counted(), TripwireBounds(min_samples=2,
                                                                                    answer_length=1.1))}
    assert trips["refusal_rate"] == ("tripwire refusal_rate: 0.250 of answers ask back or refuse on the canary vs "
                                     "0.000 on stable (+0.250 > +0.1 over 4 canary and 5 stable trajectories)")
    assert trips["tool_error_rate"] == ("tripwire tool_error_rate: 0.400 of tool calls failed on the canary vs 0.100 "
                                        "on stable (+0.300 > +0.15 over 4 canary and 5 stable trajectories)")
    assert trips["invalid_call_rate"] == (
        "tripwire invalid_call_rate: 0.286 of planner decisions unreadable or without a known tool on the canary vs "
        "0.000 on stable (+0.286 > +0.1 over 4 canary and 5 stable trajectories)")
    assert trips["judge_rule_disagreement"] == (
        "tripwire judge_rule_disagreement: 0.500 of judge and rule rewards disagree on the canary vs 0.000 on stable "
        "(+0.500 > +0.15 over 2 canary and 2 stable trajectories with both)")
    assert trips["answer_length"] == ("tripwire answer_length: 0.7 words per canary answer vs 1.0 (ratio (c+1)/(s+1) "
                                      "0.83 outside [0.91, 1.1] over 3 canary and 5 stable answers (non-answers "
                                      "aside))")
    assert trips["answer_divergence"] == (
        "tripwire answer_divergence: total variation 0.333 > 0.25 between the arms' answer shapes over 3 canary and "
        "5 stable answers (non-answers aside) (most over-represented on the canary: empty 33% vs 0%)")


def good_arms(n: int) -> Arms:
    """A canary as good as the stable version and faster: the test promotes it after 223 trajectories per arm."""
    arms = Arms(0.05)
    for _ in range(n):
        arms.add(CANARY, 1.0, 0.0, 0.02)
        arms.add(STABLE, 1.0, 0.0, 0.2)
    return arms


def test_a_tripwire_rolls_back_what_the_test_would_promote_and_names_itself():
    policy = Policy(min_samples=30, reward_margin=0.1, tripwires=TripwireBounds(min_samples=30))
    arms = good_arms(240)
    trips = Tripwires()
    for _ in range(30):
        trips.add(CANARY, f(non_answer=True, words=6, shape=1))
        trips.add(STABLE, f())
    assert decide(arms, policy, step_samples=240, step_elapsed_s=1.0).action == "promote"  # reward etc. look fine
    d = decide(arms, policy, step_samples=240, step_elapsed_s=1.0, trips=trips)
    assert d.action == "rollback" and not d.timed_out
    # a canary without answers has no length or shape to compare: refusal_rate alone names it
    assert d.reason == ("tripwire refusal_rate: 1.000 of answers ask back or refuse on the canary vs 0.000 on stable "
                        "(+1.000 > +0.1 over 30 canary and 30 stable trajectories)")
    assert {c.metric: c.verdict for c in d.comparisons} == {
        "reward": "non_inferior", "error_rate": "non_inferior", "latency": "better", "tripwire:refusal_rate": TRIPPED}
    refusal = next(c for c in d.comparisons if c.metric == "tripwire:refusal_rate")
    assert (refusal.lower, refusal.upper, refusal.margin) == (1.0, 1.0, 0.1)
    # before its minimum a tripwire decides nothing, and it also wins over a timeout
    assert decide(arms, policy, step_samples=240, step_elapsed_s=1.0, trips=Tripwires()).action == "promote"
    late = decide(good_arms(1), policy, step_samples=1, step_elapsed_s=1e9, trips=trips)
    assert late.action == "rollback" and not late.timed_out and late.reason.startswith("tripwire refusal_rate")


def test_vectorised_codes_match_the_scalar_decision():
    policy = Policy(min_samples=30, tripwires=TripwireBounds(min_samples=2))
    arms = Arms(0.05, (3,))  # no samples: the test holds everywhere
    counts, shapes = np.zeros((2, len(tw.COUNTS), 3)), np.zeros((2, len(tw.SHAPES), 3))
    counts[:, tw.RECORDS] = 2
    counts[CANARY, tw.NON_ANSWERS] = (2, 0, 0)  # rollout 0: every canary answer asks back
    counts[:, tw.WORDS] = 2
    shapes[:, 2] = 2
    trips = Tripwires((3,))
    trips.add_many(counts, shapes)
    code, timed_out = decide_codes(arms, policy, np.zeros(3), np.zeros(3), trips)
    assert code.tolist() == [ROLLBACK, HOLD, HOLD] and not timed_out.any()
    assert tw.tripped(trips, policy.tripwires)[:, 0].tolist() == [False, False, True, False, False, False]


def test_a_decision_quarantines_only_when_a_tripwire_rolled_it_back():
    tripped = pb.RolloutComparison(metric="tripwire:refusal_rate", diff_lower=0.6, diff_upper=0.6, margin=0.1,
                                   verdict=TRIPPED)
    worse = pb.RolloutComparison(metric="reward", diff_lower=-0.5, diff_upper=-0.3, margin=0.05, verdict="worse")
    assert quarantined_version(pb.RolloutDecision(version="v7", action="rollback", comparisons=[worse, tripped])) \
        == "v7"
    assert quarantined_version(pb.RolloutDecision(version="v7", action="rollback", comparisons=[worse])) == ""
    assert quarantined_version(pb.RolloutDecision(version="v7", action="promote", comparisons=[tripped])) == ""


def simulate_equal_arms(rollouts: int, trajectories: int, share: float, canary_non_answer: float = 0.05, seed=0):
    """Many rollouts at once, each trajectory to the canary with probability ``share``, features drawn at base
    rates high enough to be noisy: tool errors 0.3 per call, invalid calls 0.05, non-answers 0.05, answers spread
    evenly over the seven length shapes, a judge and a rule reward on every record disagreeing on 0.2. Returns
    per rollout whether any tripwire fired at any look, and the canary count at the first."""
    rng = np.random.default_rng(seed)
    trips = Tripwires((rollouts,))
    ever = np.zeros(rollouts, dtype=bool)
    first = np.full(rollouts, -1.0)
    index = np.arange(rollouts)
    for _ in range(trajectories):
        arm = (rng.random(rollouts) >= share).astype(int)  # CANARY 0, STABLE 1
        invalid = rng.binomial(2, 0.05, rollouts)
        non_answer = rng.random(rollouts) < np.where(arm == CANARY, canary_non_answer, 0.05)
        shape = np.where(non_answer, 1, rng.integers(2, len(tw.SHAPES), rollouts))
        row = np.stack([np.ones(rollouts), np.full(rollouts, 2.0), invalid, 2 - invalid,
                        rng.binomial(2 - invalid, 0.3), non_answer, np.where(non_answer, 0, 2.0 ** (shape - 2)),
                        np.ones(rollouts), rng.random(rollouts) < 0.2])
        counts, shapes = np.zeros((2, len(tw.COUNTS), rollouts)), np.zeros((2, len(tw.SHAPES), rollouts))
        counts[arm, :, index] = row.T
        shapes[arm, shape, index] = ~non_answer  # answers only, as Tripwires.add counts them
        trips.add_many(counts, shapes)
        now = tw.tripped(trips, TripwireBounds()).any(axis=0)
        first = np.where(now & ~ever, trips.counts[CANARY, tw.RECORDS], first)
        ever |= now
    return ever, first


def test_noise_does_not_fire_the_tripwires_and_a_real_change_does_at_the_minimum():
    # equal arms at a 25 % canary, looked at after each of 1,000 trajectories (250 canary): measured 0.3 % with 1,000
    # rollouts (0.45 % with 2,000 over 1,600 trajectories; 0.2 % at a 10 % canary over 3,000)
    ever, _ = simulate_equal_arms(500, 1000, 0.25)
    assert ever.mean() <= 0.02
    ever, first = simulate_equal_arms(200, 600, 0.25, canary_non_answer=0.25, seed=1)
    assert ever.all() and np.median(first) == TripwireBounds().min_samples


def test_a_canary_that_asks_back_less_than_stable_fires_nothing():
    """The stable version asks back on a third of the queries, the canary on none (it learned to look the facts up):
    no regression. Read over all answers, its questions back would make the stable answers 5.3 words long against
    the canary's 1 (ratio 0.32) and a third of them another shape."""
    t = Tripwires()
    for i in range(60):
        t.add(CANARY, f())
        t.add(STABLE, f(non_answer=True, words=14, shape=1) if i % 3 == 0 else f())
    assert fired(t, min_samples=40) == []
    assert "refusal_rate" in fired(reversed_arms(t), min_samples=40)  # the other way round it is one


def reversed_arms(t: Tripwires) -> Tripwires:
    swapped = Tripwires()
    swapped.add_many(t.counts[::-1], t.shapes[::-1])
    return swapped
