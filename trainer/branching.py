"""Shadow branches (issue 35): turn-level groups anchored at real states of finished trajectories.

A finished trajectory's memory holds every step it took, so the state after its first k turns can be rebuilt
(``Memory.after``) and G continuations sampled from it: a group whose members share everything up to turn k, so
their reward spread is about what was done from there on. Such groups are training rollouts like any other
(``source="training"``): nobody is shown their answers.

Which trajectories may be branched (``branch_points``, ``trajectory.may_branch``): finished ones the trainer may
learn from (training rollouts, or production traffic whose user allowed it: ``train_ok``), with at least two turns
and an uncompacted memory; the turn k is drawn uniformly from 1 to turns - 1 (k = 0 is the whole query, k = turns is
the end). In process, ``Agent.solve(start=point.state)`` continues one; through the ring, a training rollout whose
``SolveRequest.branch`` names the point (``agentflow drive --branch-share``), and the memory service rebuilds the
state from the finished trajectory it keeps.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from agentflow.domain.memory import Memory
from agentflow.domain.trajectory import may_branch


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


class BranchPool:
    """The finished rollouts a driver may branch (``agentflow drive --branch-share``): the most recent ``size`` that
    ``may_branch`` accepts, each branched at most once, at a turn drawn as ``branch_points`` does. Thread-safe."""

    def __init__(self, size: int = 256, seed: int = 0):
        self._records: deque[dict] = deque(maxlen=size)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def add(self, record: dict) -> None:
        if may_branch(record):
            with self._lock:
                self._records.append(record)

    def take(self) -> BranchPoint | None:
        """A branch point from a random kept rollout (which leaves the pool), or None when none is kept."""
        with self._lock:
            if not self._records:
                return None
            self._records.rotate(-self._rng.randrange(len(self._records)))
            record = self._records.popleft()
            return branch_points([record], 1, self._rng)[0]
