"""Shadow branches (issue 35): turn-level groups anchored at real states of finished trajectories.

A finished trajectory's memory holds every step it took, so the state after its first k turns can be rebuilt
(``Memory.after``) and G continuations sampled from it: a group whose members share everything up to turn k, so
their reward spread is about what was done from there on. Such groups are training rollouts like any other
(``source="training"``): nobody is shown their answers.

Which trajectories may be branched (``branch_points``): finished ones the trainer may learn from (training rollouts,
or production traffic whose user allowed it: ``train_ok``), with at least two turns and an uncompacted memory; the
turn k is drawn uniformly from 1 to turns - 1 (k = 0 is the whole query, k = turns is the end).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

from agentflow.domain.memory import Memory

FINISHED = ("answered", "max_steps")  # the statuses of a trajectory that ran its course (not cut by time or errors)


@dataclass(frozen=True)
class BranchPoint:
    """A state to branch from: the query, its ground truth, the state after ``turn`` turns, and where it came from."""

    query: str
    ground_truth: str
    state: Memory
    trajectory_id: str
    turn: int

    @property
    def group_id(self) -> str:
        return f"branch/{self.trajectory_id}/{self.turn}"


def may_branch(record: dict) -> bool:
    """A finished record whose data may be trained on and whose states can be rebuilt."""
    memory = record.get("memory") or {}
    allowed = record.get("source") == "training" or (record.get("source") == "traffic" and record.get("train_ok"))
    return (bool(allowed) and record.get("status") in FINISHED and len(record.get("turns") or []) >= 2
            and not memory.get("compacted_steps") and not memory.get("summary")
            and len(memory.get("steps") or []) == len(record["turns"]))


def branch_points(records: Sequence[dict], count: int, rng: random.Random) -> list[BranchPoint]:
    """Up to ``count`` branch points from distinct eligible records, each at a turn drawn from 1 to turns - 1."""
    eligible = [r for r in records if may_branch(r)]
    points = []
    for record in rng.sample(eligible, min(count, len(eligible))):
        turn = rng.randint(1, len(record["turns"]) - 1)
        state = Memory.from_dict(record["memory"]).after(turn)
        points.append(BranchPoint(record["query"], record.get("ground_truth", ""), state, record["trajectory_id"],
                                  turn))
    return points
