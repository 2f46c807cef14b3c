"""The rule reward on trajectory records: one scorer for the memory service (as a trajectory finishes) and the
trainer (records that reach it unscored)."""

from __future__ import annotations

from typing import Iterable

from agentflow.domain.trajectory import Record
from agentflow.errors import InvalidInput
from agentflow.rewards.registry import score


def score_record(record: dict, kind: str = "math", *, turn_cost: float = 0.0) -> dict:
    """Add the rule reward of ``kind`` (``score``) against ``record["ground_truth"]`` if it has one and no rule reward
    yet; returns the record. ``turn_cost`` > 0 shapes the reward of a correct answer by the turns it took:
    ``R = score × max(0, 1 − turn_cost × (turns − 1))`` — off by default (the paper's reward is the outcome alone)."""
    _check_turn_cost(turn_cost)
    view = Record(record)
    if record.get("ground_truth") and view.reward(["rule"]) is None:
        reward = score(kind, record.get("answer", ""), {"answer": record["ground_truth"]})
        turns = len(view.turns)
        if turn_cost and reward["value"] > 0 and turns > 1:
            factor = max(0.0, 1.0 - turn_cost * (turns - 1))
            reward = {**reward, "value": reward["value"] * factor,
                      "detail": f"{reward['detail']}; x{factor:g} for {turns} turns (turn_cost {turn_cost:g})"}
        record.setdefault("rewards", []).append(reward)
    return record


def score_records(records: Iterable[dict], kind: str = "math", *, turn_cost: float = 0.0) -> list[dict]:
    """``score_record`` on each record: one reward per trajectory, which ``build_batch`` broadcasts to every planner
    turn. Records without ground truth are left unscored (their group waits for a reward, e.g. from ``feedback``)."""
    _check_turn_cost(turn_cost)
    return [score_record(record, kind, turn_cost=turn_cost) for record in records]


def _check_turn_cost(turn_cost: float) -> None:
    if not 0 <= turn_cost < 1:
        raise InvalidInput(f"turn_cost must be in [0, 1), got {turn_cost}")
