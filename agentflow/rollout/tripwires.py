"""Tripwires: guard rails on what a canary's served traffic looks like, beside the sequential test on reward, errors
and latency (``policy.py``). Pure: record features in, per-arm counts, statistics and the tripped ones out.

A reward can look fine while the version has gone wrong in a way the reward source does not see: a judge that
rates "Could you clarify what you mean?" as harmless, feedback too sparse to notice, a rule reward on the few
records with ground truth. Each tripwire compares one statistic of the canary's traffic with the stable version's
on the same traffic (routing is by trajectory id, so both arms see the same mix):

| tripwire | per arm | fires when (both arms have ``min_samples``) | default |
|---|---|---|---|
| tool_error_rate | tool calls that ended in a tool error / tool calls | canary - stable > bound | 0.15 |
| invalid_call_rate | planner decisions that did not parse or named no known tool / decisions | canary - stable > bound | 0.10 |
| refusal_rate | answers that ask a clarifying question or refuse (``non_answer``) / answers | canary - stable > bound | 0.10 |
| answer_length | mean words per answer, non-answers aside (capped: ``WORDS_CAP``) | (c+1)/(s+1) > bound or < 1/bound | 2.0 |
| judge_rule_disagreement | records where judge and rule rewards disagree / records with both | canary - stable > bound | 0.15 |
| answer_divergence | the distribution of answers, non-answers aside, over ``SHAPES`` | total variation > bound | 0.25 |

(docs/rollout.md, "Tripwires", says why each default.) ``min_samples`` counts the arm's trajectories; for
judge_rule_disagreement, its trajectories with both rewards; for answer_length and answer_divergence, its answers.

**Non-answers are refusal_rate's alone.** Length and shape are read on the answers that are not non-answers: a
question back is not a longer answer, and a canary that asks back *less* than the stable version (a planner that
learned to look the fact up instead of asking) is no regression, which two-sided length and shape statistics over
all answers would call one (seen on the bundled environment, whose generalist asks back about towns it does not
know: a canary that stopped asking was rolled back on answer_length at 1.0 words against 3.0).

The statistics are point estimates: the minimum count and bounds several standard errors wide at that count keep
noise from firing them (docs/rollout.md has the numbers; ``tests/unit/test_rollout_tripwires.py`` checks equal arms
looked at after every trajectory).

**Divergence: total variation over answer shapes, not KL over tokens.** Records carry the planner's token ids and
log-probs, but not the answer's log-probs under both versions, so a token-level KL between the versions cannot be
computed from records. What can be compared is the distribution of a discrete feature of the answers. The feature is
the answer's *shape*: empty, a non-answer (asks back or refuses), or its length in words on a log2 scale (1, 2-3,
4-7, ... 64+) — content-free, so it means the same on any traffic, and coarse, so a hundred answers estimate it.
Not the tool choice: changing which tool the planner picks for which question is exactly what training is for (the
bundled environment's trained versions route very differently from the untrained one), so a tool-choice divergence
would block the versions that improved. The statistic is the total variation distance, TV = 1/2 sum |p_c - p_s|:
bounded in [0, 1], symmetric, defined when one arm has a shape the other never shows (KL is infinite there unless
smoothed by an arbitrary pseudo-count, and its small-sample bias grows with the number of cells), and
it reads directly: the share of the canary's answers that would have to change shape to look like the stable's.

``Tripwires`` holds the counts as numpy arrays of shape ``(2 arms, n, *shape)``, so ``tripped`` works elementwise
on many simulated rollouts at once (the tests) as on the controller's one; ``check`` is the scalar explainer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from agentflow.domain.trajectory import Record

CANARY, STABLE = 0, 1  # the arm axis (policy.Arms uses the same)
TRIPWIRES = ("tool_error_rate", "invalid_call_rate", "refusal_rate", "answer_length", "judge_rule_disagreement",
             "answer_divergence")
#: The per-arm counts, in this order along axis 1 of ``Tripwires.counts``.
COUNTS = ("records", "decisions", "invalid", "calls", "tool_errors", "non_answers", "words", "pairs",
          "disagreements")
(RECORDS, DECISIONS, INVALID, CALLS, TOOL_ERRORS, NON_ANSWERS, WORDS, PAIRS, DISAGREEMENTS) = range(len(COUNTS))
ON_ANSWERS = ("answer_length", "answer_divergence")  # the tripwires read on answers, non-answers aside
#: Answer shapes (``shape``): the divergence's cells.
SHAPES = ("empty", "non-answer", "1 word", "2-3 words", "4-7 words", "8-15 words", "16-31 words", "32-63 words",
          "64+ words")
WORDS_CAP = 1000  # words counted per answer: one runaway generation moves a mean of 100 answers by at most 10 words
_EPS = 1e-9  # a statistic equal to its bound up to rounding (0.4 - 0.1 > 0.3 in floats) is within it


# --- the non-answer detector ---------------------------------------------------------------------------------------

_YOU_ASK = r"(?:could|can|would|will) you (?:please )?"
_CLARIFY = re.compile("|".join((
    _YOU_ASK + r"(?:clarify|specify|rephrase|elaborate|be more specific|explain what you|"
               r"tell me (?:what|which|more)|provide (?:more|additional|some|further)|"
               r"give (?:me )?(?:more|additional|some|further)|share more)",
    r"\bplease (?:clarify|specify|rephrase|elaborate|be more specific|tell me more|"
    r"provide (?:more|additional|some|further))",
    r"\bwhat (?:exactly )?do you mean\b",
    r"\b(?:did|do) you mean\b",
    r"\bwhat are you (?:asking|referring to|looking for)\b",
    r"\bnot sure what you(?:'re| are) (?:asking|referring to|looking for)\b",
    r"\b(?:i|we) (?:need|would need|require) (?:a bit )?more (?:information|context|details)\b",
    r"\b(?:your|the) question is (?:unclear|ambiguous|too vague)\b",
    r"\bwhich (?:one|of (?:these|them|those|the \w+)) (?:do|did|are|were) you\b",
)))
_CANNOT = r"(?:can't|cannot|can not|won't|will not|am unable to|'m unable to|are unable to|'re unable to|" \
          r"am not able to|'m not able to|are not able to|'re not able to)"
_REFUSE = re.compile("|".join((
    r"\b(?:i|we) " + _CANNOT + r" (?:help|assist|answer|provide|comply|respond|do that|fulfil|fulfill|share|"
                               r"discuss|support|give)",
    r"\bas an ai\b",
    r"\b(?:i|we) (?:must|have to|need to) (?:decline|refuse)\b",
    r"\bi(?:'m| am) not (?:allowed|permitted) to\b",
    r"\b(?:i|we) (?:don't|do not) have (?:access|the ability|enough (?:information|context|details))\b",
)))
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
OPENING_SENTENCES = 2  # a non-answer says so first; an answer that ends by offering more is still an answer


def non_answer(answer: str) -> str:
    """"clarify" when the answer asks a clarifying question instead of answering, "refuse" when it refuses, ""
    otherwise (an answer, also a wrong, empty or "unknown" one).

    Only the opening (its first ``OPENING_SENTENCES`` sentences) is read: a clarifying request or a refusal comes
    first, while a full answer may end with "Would you like more details?". Clarify: the opening asks the user for
    more (``_CLARIFY``: could you clarify / specify / provide more ..., what do you mean, did you mean, I need more
    information, ...), or the whole answer is one question. Refuse: I / we cannot / won't / am unable to help,
    answer, provide ...; as an AI; I must decline; I don't have access / enough information. An abstention such as
    "unknown" or "I don't know" is not a non-answer here (the generator's "unknown" means no tool result was usable;
    it is a wrong answer, which the reward sees)."""
    text = " ".join(answer.replace("\u2019", "'").replace("\u2018", "'").lower().split())
    if not text:
        return ""
    sentences = _SENTENCE_END.split(text)
    opening = " ".join(sentences[:OPENING_SENTENCES])
    if _REFUSE.search(opening):
        return "refuse"
    if _CLARIFY.search(opening) or (len(sentences) == 1 and text.rstrip("\"')]*_ ").endswith("?")):
        return "clarify"
    return ""


def words(answer: str) -> int:
    return len(answer.split())


def shape(answer: str) -> int:
    """The answer's cell in ``SHAPES``: empty, non-answer, or its length in words on a log2 scale."""
    n = words(answer)
    if n == 0:
        return 0
    if non_answer(answer):
        return 1
    return 2 + min(n.bit_length() - 1, len(SHAPES) - 3)


# --- one record ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Features:
    """What the tripwires read from one trajectory record."""

    decisions: int  # the planner's turns
    invalid: int  # of those: a parse error (unreadable, or a tool the planner does not have) or no tool named
    calls: int  # tool calls made (turns with a tool and no parse error)
    tool_errors: int  # of those: ended in a tool error (the executor's unreadable command included)
    non_answer: bool
    words: int  # capped at WORDS_CAP
    shape: int
    #: Whether the latest judge and the latest rule reward disagree (one >= 0.5, the other below); None when the
    #: record lacks either.
    disagree: bool | None


def judge_rule_disagreement(record: dict) -> bool | None:
    view = Record(record)
    rule, judge = view.rewards("rule"), view.rewards("judge")
    if not rule or not judge:
        return None
    return (rule[-1] >= 0.5) != (judge[-1] >= 0.5)


def features(record: dict) -> Features:
    view = Record(record)
    answer = record.get("answer") or ""
    invalid = calls = tool_errors = 0
    for turn, tool in zip(view.turns, view.tools()):
        if turn.get("parse_error") or not tool:
            invalid += 1
        else:
            calls += 1
            tool_errors += bool(turn.get("tool_error"))
    return Features(decisions=len(view.turns), invalid=invalid, calls=calls, tool_errors=tool_errors,
                    non_answer=bool(non_answer(answer)), words=min(words(answer), WORDS_CAP), shape=shape(answer),
                    disagree=judge_rule_disagreement(record))


# --- the counts, statistics and bounds ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TripwireBounds:
    """How far the canary may be from the stable version on each tripwire (``RolloutSettings``' tripwire_* fields;
    docs/rollout.md says why each default). ``min_samples`` 0 turns every tripwire off; a rate bound of 1, a
    divergence bound of 1 or a huge length ratio turns that one off."""

    min_samples: int = 100
    tool_error_rate: float = 0.15
    invalid_call_rate: float = 0.10
    refusal_rate: float = 0.10
    answer_length: float = 2.0
    judge_rule_disagreement: float = 0.15
    answer_divergence: float = 0.25

    def __post_init__(self):
        if self.min_samples < 0:
            raise ValueError(f"the tripwires' min_samples must be at least 0, got {self.min_samples}")
        for name in TRIPWIRES:
            value = getattr(self, name)
            if name == "answer_length":
                if value <= 1:
                    raise ValueError(f"the answer_length tripwire is a ratio above 1, got {value}")
            elif not 0 < value <= 1:
                raise ValueError(f"the {name} tripwire's bound must be in (0, 1], got {value}")


class Tripwires:
    """The per-arm counts of a canary comparison: ``counts`` (2 arms, len(COUNTS), *shape) and ``shapes``
    (2 arms, len(SHAPES), *shape)."""

    def __init__(self, shape: tuple[int, ...] = ()):
        self.shape = tuple(shape)
        self.counts = np.zeros((2, len(COUNTS), *self.shape))
        self.shapes = np.zeros((2, len(SHAPES), *self.shape))

    def add(self, arm: int, f: Features) -> None:
        """One trajectory for ``arm`` (scalar use)."""
        row = self.counts[arm]
        row[RECORDS] += 1
        row[DECISIONS] += f.decisions
        row[INVALID] += f.invalid
        row[CALLS] += f.calls
        row[TOOL_ERRORS] += f.tool_errors
        row[NON_ANSWERS] += f.non_answer
        if not f.non_answer:
            row[WORDS] += f.words
            self.shapes[arm, f.shape] += 1
        if f.disagree is not None:
            self.add_pair(arm, f.disagree)

    def add_pair(self, arm: int, disagree: bool) -> None:
        """A judge and a rule reward on one trajectory of ``arm`` (also when the second arrived later)."""
        self.counts[arm, PAIRS] += 1
        self.counts[arm, DISAGREEMENTS] += disagree

    def add_many(self, counts, shapes) -> None:
        """Vectorised: arrays shaped like ``counts`` and ``shapes`` (words and shapes of answers only, as ``add``)."""
        self.counts += counts
        self.shapes += shapes

    def samples(self, arm: int, tripwire: str):
        """The count ``min_samples`` gates ``tripwire`` on, for ``arm``."""
        if tripwire in ON_ANSWERS:
            return self.answers(arm)
        return self.counts[arm, PAIRS if tripwire == "judge_rule_disagreement" else RECORDS]

    def answers(self, arm: int):
        """The arm's answers that are not non-answers."""
        return self.counts[arm, RECORDS] - self.counts[arm, NON_ANSWERS]

    def statistics(self) -> dict[str, tuple]:
        """Per tripwire ``(canary, stable, compared)``, elementwise: the arms' values and what the bound applies to
        (the difference, the length ratio, or the total variation, whose arm values are the canary's most
        over-represented shape's shares)."""
        c, s = self.counts[CANARY], self.counts[STABLE]

        def rate(num, den):
            return np.where(den > 0, num / np.maximum(den, 1), 0.0)

        out = {}
        for name, num, den in (("tool_error_rate", TOOL_ERRORS, CALLS), ("invalid_call_rate", INVALID, DECISIONS),
                               ("refusal_rate", NON_ANSWERS, RECORDS),
                               ("judge_rule_disagreement", DISAGREEMENTS, PAIRS)):
            rc, rs = rate(c[num], c[den]), rate(s[num], s[den])
            out[name] = (rc, rs, rc - rs)
        wc, ws = rate(c[WORDS], self.answers(CANARY)), rate(s[WORDS], self.answers(STABLE))
        out["answer_length"] = (wc, ws, (wc + 1) / (ws + 1))
        pc, ps = self.shares()
        top = self.top_shape()
        out["answer_divergence"] = (np.take_along_axis(pc, top[None], 0)[0], np.take_along_axis(ps, top[None], 0)[0],
                                    0.5 * np.abs(pc - ps).sum(axis=0))
        return out

    def shares(self) -> tuple:
        """Per arm, the share of its answers (non-answers aside) in each of ``SHAPES`` (0 before any)."""
        return tuple(self.shapes[arm] / np.maximum(self.answers(arm), 1) for arm in (CANARY, STABLE))

    def top_shape(self):
        """The index into ``SHAPES`` of the shape most over-represented on the canary."""
        pc, ps = self.shares()
        return np.argmax(pc - ps, axis=0)


def tripped(trips: Tripwires, bounds: TripwireBounds):
    """Boolean array (len(TRIPWIRES), *shape): which tripwires fire, elementwise."""
    stats = trips.statistics()
    m = bounds.min_samples
    out = []
    for name in TRIPWIRES:
        armed = (m > 0) & (trips.samples(CANARY, name) >= m) & (trips.samples(STABLE, name) >= m)
        value, bound = stats[name][2], getattr(bounds, name)
        if name == "answer_length":
            beyond = (value > bound + _EPS) | (value < 1 / bound - _EPS)
        else:
            beyond = value > bound + _EPS
        out.append(armed & beyond)
    return np.stack(out)


@dataclass(frozen=True)
class Trip:
    """One tripwire that fired: the arms' values, the compared statistic and its bound, the counts."""

    tripwire: str
    canary: float
    stable: float
    value: float
    bound: float
    canary_samples: int
    stable_samples: int
    top_shape: str = ""  # answer_divergence: the canary's most over-represented shape

    @property
    def reason(self) -> str:
        unit = "answers (non-answers aside)" if self.tripwire in ON_ANSWERS else "trajectories"
        counts = f"{self.canary_samples} canary and {self.stable_samples} stable {unit}"
        if self.tripwire == "answer_length":
            return (f"tripwire answer_length: {self.canary:.1f} words per canary answer vs {self.stable:.1f} "
                    f"(ratio (c+1)/(s+1) {self.value:.2f} outside [{1 / self.bound:.2g}, {self.bound:g}] "
                    f"over {counts})")
        if self.tripwire == "answer_divergence":
            return (f"tripwire answer_divergence: total variation {self.value:.3f} > {self.bound:g} between the "
                    f"arms' answer shapes over {counts} (most over-represented on the canary: {self.top_shape} "
                    f"{self.canary:.0%} vs {self.stable:.0%})")
        what = {"tool_error_rate": "of tool calls failed",
                "invalid_call_rate": "of planner decisions unreadable or without a known tool",
                "refusal_rate": "of answers ask back or refuse",
                "judge_rule_disagreement": "of judge and rule rewards disagree"}
        if self.tripwire == "judge_rule_disagreement":
            counts += " with both"
        return (f"tripwire {self.tripwire}: {self.canary:.3f} {what[self.tripwire]} on the canary vs "
                f"{self.stable:.3f} on stable ({self.value:+.3f} > +{self.bound:g} over {counts})")


def check(trips: Tripwires, bounds: TripwireBounds) -> tuple[Trip, ...]:
    """The tripwires that fire (scalar ``trips``), in ``TRIPWIRES`` order, with their numbers."""
    fired = tripped(trips, bounds)
    stats = trips.statistics()
    out = []
    for i, name in enumerate(TRIPWIRES):
        if not bool(fired[i]):
            continue
        canary, stable, value = (float(v) for v in stats[name])
        top = SHAPES[int(trips.top_shape())] if name == "answer_divergence" else ""
        out.append(Trip(name, canary, stable, value, getattr(bounds, name), int(trips.samples(CANARY, name)),
                        int(trips.samples(STABLE, name)), top))
    return tuple(out)
