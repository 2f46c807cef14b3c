"""The trainer's rewards for one group (docs/rewards.md): the sources it trains on, and the rewards it adds itself.

A record's reward is ``Record.reward(sources)``: the most trusted of the configured sources present on it. Rewards
that arrive on the ring (a person's feedback, a judge) are already on the records; ``GroupRewards.apply`` adds the
ones the trainer can compute from the group itself:

* ``rule``: the rule of ``kind`` against the record's ground truth (a record that has one);
* ``human`` from the feedback ledger (``agentflow.rewards.vote.FeedbackLedger``), for a group without ground truth: a
  replayed production query that people rated on a production trajectory (a group with ground truth keeps its rule
  reward: the ledger's prior for unrated answers would flatten it);
* ``vote``: the group's majority answer as a pseudo-label, for a group without ground truth that the ledger knows
  nothing of: one group's rewards are on one scale (a 1.0 for agreeing beside the ledger's 0.33 and 0.67 would make
  the majority, not what people said, the advantage).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentflow.domain.trajectory import REWARD_PRECEDENCE, Record
from agentflow.errors import InvalidInput
from agentflow.rewards.records import score_records
from agentflow.rewards.vote import VOTE_KINDS, FeedbackLedger, vote_rewards


def parse_sources(text: str) -> tuple[str, ...]:
    """A comma-separated list of reward sources (``feedback`` is the same as ``human``)."""
    names = tuple(dict.fromkeys({"feedback": "human"}.get(s.strip(), s.strip()) for s in text.split(",") if s.strip()))
    if not names or set(names) - set(REWARD_PRECEDENCE):
        raise InvalidInput(f"reward sources must be a comma-separated list of {', '.join(REWARD_PRECEDENCE)} "
                           f"(feedback = human), got {text!r}")
    return names


@dataclass
class GroupRewards:
    kind: str = "math"
    sources: tuple[str, ...] = REWARD_PRECEDENCE
    min_agreement: float = 0.5
    ledger: FeedbackLedger | None = None
    min_raters: int = 2  # the ledger's: raters who must agree before it confirms an answer
    precedence: tuple[str, ...] = REWARD_PRECEDENCE  # RATINGS_FIRST: a deployment's ratings outrank the rule

    def __post_init__(self):
        if not 0 < self.min_agreement <= 1:
            raise InvalidInput(f"the vote's min_agreement must be in (0, 1], got {self.min_agreement}")
        if self.ledger is None and "human" in self.sources and self.kind in VOTE_KINDS:
            self.ledger = FeedbackLedger(self.kind, min_raters=self.min_raters)

    def observe(self, record: dict) -> bool:
        """A record that is not a training rollout: its rating (if any) goes into the ledger; True when filed."""
        return self.ledger is not None and self.ledger.add(record)

    def apply(self, records: list[dict]) -> list[dict]:
        """Add the rule, ledger and vote rewards the group's records are owed (each once); returns the records."""
        if "rule" in self.sources:
            score_records(records, self.kind)
        unlabeled = not any(r.get("ground_truth") for r in records)
        if unlabeled and self.ledger is not None:
            for record in records:
                if not Record(record).rewards("human") and (found := self.ledger.reward(record)):
                    record.setdefault("rewards", []).append(found)
        if "vote" in self.sources and self.kind in VOTE_KINDS and unlabeled \
                and not any(Record(r).rewards("vote") or Record(r).rewards("human") for r in records):
            for record, reward in zip(records, vote_rewards(records, self.kind, self.min_agreement) or []):
                record.setdefault("rewards", []).append(reward)
        return records

    def reward(self, record: dict) -> float | None:
        return Record(record).reward(self.sources, self.precedence)
