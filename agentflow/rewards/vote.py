"""Rewards for answers that have no ground truth: the majority vote of a group, and the feedback ledger.

* **Vote** (test-time RL): the G answers of one group are compared in the form their kind allows (``answer_key``:
  the final number for ``math``, the chosen option for ``mcq``, the normalised answer text for ``search``); when the
  most common one is given by at least ``min_agreement`` of the group and is not tied, it becomes the group's
  pseudo-label and every member gets 1.0 when its answer matches it, else 0.0 (source ``vote``). A tie, or an
  agreement below the threshold, gives no reward at all.
* **Ledger**: what people said about production answers. A rating (a ``human`` reward on a ``traffic`` record that
  may be trained on) is filed under the normalised query, the answer's key and its **rater** (the reward's author:
  the gateway's authenticated key, never a name the caller chose): one rater has one vote per answer, their latest,
  however many trajectories they rate. A replay of that query whose answer has the same key gets the smoothed mean
  of the raters' votes, (sum + 1) / (n + 2), as its ``human`` reward (author ``feedback-ledger``): one rating is weak
  evidence, and ratings are noisy. For kinds with one right answer (``math``, ``mcq``), once people confirmed an
  answer (its votes sum to at least ``CONFIRMED`` more than their complement: two more thumbs up than down, from at
  least ``min_raters`` raters in favour), any other answer to that query, or none, gets 0.0. Otherwise an answer
  nobody rated to a query people did rate gets the smoothed mean of no ratings, 0.5 (the uniform prior): below an
  answer rated up, above one rated down, so a group learns from the answers people judged even when the rest of it
  is new to them. No answer at all (none given, or the trajectory failed) gets 0.0. A query nobody rated gets nothing.
"""

from __future__ import annotations

import json
from collections import Counter, OrderedDict
from dataclasses import dataclass

from agentflow.domain.trajectory import reward_value
from agentflow.errors import InvalidInput
from agentflow.rewards.choice import chosen_letter, options_of
from agentflow.rewards.numeric import final_number
from agentflow.rewards.text import extract_answer, normalise_answer

VOTE_KINDS = ("math", "mcq", "search")  # kinds whose answers can be compared with each other
ONE_ANSWER_KINDS = ("math", "mcq")  # kinds where an answer confirmed right makes every other one wrong
LEDGER_AUTHOR = "feedback-ledger"
CONFIRMED = 2.0  # an answer is confirmed when sum(ratings) - sum(1 - ratings) reaches this


def answer_key(kind: str, answer: str, record: dict | None = None) -> str | None:
    """The comparable form of ``answer`` for ``kind`` (None: it has none, e.g. no number in a math answer)."""
    if kind == "math":
        number = final_number(answer)
        return None if number is None else str(number.value)
    if kind == "mcq":
        return chosen_letter(answer, options_of(record or {}))
    if kind == "search":
        return normalise_answer(extract_answer(answer)) or None
    raise InvalidInput(f"answers of kind {kind!r} cannot be compared; a vote needs one of {', '.join(VOTE_KINDS)}")


def _key_of(kind: str, record: dict) -> str | None:
    return answer_key(kind, record.get("answer", ""), record) if record.get("status") == "answered" else None


@dataclass(frozen=True)
class Vote:
    label: str | None  # the pseudo-label; None when there is none (a tie, too little agreement, no answers)
    agreement: float  # share of the group that gave the most common answer
    why: str


def majority(records: list[dict], kind: str, min_agreement: float) -> Vote:
    """The group's pseudo-label (see the module docstring); members without a comparable answer count against it."""
    counts = Counter(key for key in (_key_of(kind, r) for r in records) if key is not None)
    if not counts:
        return Vote(None, 0.0, "no comparable answer in the group")
    (top, n), *rest = counts.most_common()
    agreement = n / len(records)
    if rest and rest[0][1] == n:
        return Vote(None, agreement, f"tie: {n} of {len(records)} each for {top!r} and {rest[0][0]!r}")
    if agreement < min_agreement:
        return Vote(None, agreement, f"{n} of {len(records)} agree, below the {min_agreement:g} needed")
    return Vote(top, agreement, f"{n} of {len(records)} answered {top!r}")


def vote_rewards(records: list[dict], kind: str, min_agreement: float) -> list[dict] | None:
    """One ``vote`` reward per record, in order, or None when the group has no pseudo-label."""
    vote = majority(records, kind, min_agreement)
    if vote.label is None:
        return None
    return [{"value": 1.0 if _key_of(kind, r) == vote.label else 0.0, "source": "vote", "author": "group-vote",
             "detail": f"group vote: {vote.why}"} for r in records]


def _votes(record: dict) -> dict[str, float]:
    """Each rater's latest ``human`` rating on ``record`` (the ledger's own rewards are not ratings). A rating without
    an author (an older record) counts as the vote of its trajectory."""
    votes = {}
    for reward in record.get("rewards") or []:
        value = reward_value(reward)
        author = reward.get("author") or f"trajectory:{record.get('trajectory_id', '')}"
        if reward.get("source") in ("human", "feedback") and value is not None and author != LEDGER_AUTHOR:
            votes.pop(author, None)
            votes[author] = value
    return votes


class FeedbackLedger:
    """Ratings of production answers by (normalised query, answer key); the oldest queries are forgotten first."""

    def __init__(self, kind: str, max_queries: int = 50_000, max_answers: int = 16, max_ratings: int = 100,
                 min_raters: int = 2):
        answer_key(kind, "")  # an unknown kind fails here
        if min_raters < 1:
            raise InvalidInput(f"the ledger's min_raters must be at least 1, got {min_raters}")
        self.kind, self.max_queries, self.max_answers, self.max_ratings = kind, max_queries, max_answers, max_ratings
        self.min_raters = min_raters
        self._ratings: OrderedDict[str, dict[str, dict[str, float]]] = OrderedDict()  # query -> key -> rater -> vote

    def add(self, record: dict) -> bool:
        """File the ratings of a ``traffic`` record that may be trained on (each rater's latest); True when one was
        filed."""
        votes = _votes(record)
        if record.get("source") != "traffic" or not record.get("train_ok") or not votes:
            return False
        key = _key_of(self.kind, record)
        query = normalise_answer(record.get("query", ""))
        if key is None or not query:
            return False
        answers = self._ratings.setdefault(query, {})
        self._ratings.move_to_end(query)
        if key not in answers and len(answers) >= self.max_answers:
            return False
        ratings = answers.setdefault(key, {})
        for rater, value in votes.items():
            ratings.pop(rater, None)
            ratings[rater] = value  # a rater again: their latest, as the newest
        while len(ratings) > self.max_ratings:
            del ratings[next(iter(ratings))]
        while len(self._ratings) > self.max_queries:
            self._ratings.popitem(last=False)
        return True

    def reward(self, record: dict) -> dict | None:
        """The ledger's ``human`` reward for ``record``'s answer to its query, or None when it knows nothing."""
        answers = {key: list(ratings.values()) for key, ratings in
                   self._ratings.get(normalise_answer(record.get("query", "")), {}).items() if ratings}
        key = _key_of(self.kind, record)
        if key in answers:
            ratings = answers[key]
            value = (sum(ratings) + 1) / (len(ratings) + 2)
            return self._reward(value, f"people rated this answer to this query: {len(ratings)} rating(s), "
                                       f"smoothed mean {value:.2f}")
        margins = {k: 2 * sum(ratings) - len(ratings) for k, ratings in answers.items()}
        best = max(margins, key=margins.get, default=None)
        if best is None:
            return None  # a query nobody rated
        if key is None:
            return self._reward(0.0, "no answer to a query people rated")
        if self.kind in ONE_ANSWER_KINDS and margins[best] >= CONFIRMED \
                and sum(v >= 0.5 for v in answers[best]) >= self.min_raters:
            return self._reward(0.0, f"people confirmed another answer to this query ({best!r}: "
                                     f"{len(answers[best])} rating(s))")
        return self._reward(0.5, "nobody rated this answer to a query people rated: the smoothed mean of none, 0.50")

    @staticmethod
    def _reward(value: float, detail: str) -> dict:
        return {"value": value, "source": "human", "author": LEDGER_AUTHOR, "detail": detail}

    def __len__(self) -> int:
        return len(self._ratings)

    def dumps(self) -> bytes:
        """The ratings as JSON (oldest query first), for a checkpoint."""
        return json.dumps({"kind": self.kind, "queries": [[q, answers] for q, answers in self._ratings.items()]},
                          separators=(",", ":")).encode()

    def loads(self, data: bytes) -> int:
        """Start from the ratings ``dumps`` wrote (a ledger of the same kind); returns how many queries it knows."""
        state = json.loads(data)
        if state.get("kind") != self.kind:
            raise InvalidInput(f"a feedback ledger of kind {state.get('kind')!r} cannot be loaded as {self.kind!r}")
        self._ratings = OrderedDict(
            (str(query), {str(key): {str(t): float(v) for t, v in list(ratings.items())[-self.max_ratings:]}
                          for key, ratings in list(answers.items())[: self.max_answers]})
            for query, answers in state["queries"][-self.max_queries:])
        return len(self._ratings)
