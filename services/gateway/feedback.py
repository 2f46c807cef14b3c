"""Ratings of finished trajectories (``AgentFlow.Feedback``): the ``human`` reward a rating asks for, who may rate
which trajectory, and the caps on ratings (per trajectory, per rater a minute)."""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from agentflow.bus.codec import new_envelope
from agentflow.errors import AgentFlowError, InvalidInput, Reason
from agentflow.proto.v1 import events_pb2, gateway_pb2, trajectory_pb2
from agentflow.services.gateway.keys import Caller, PermissionDenied

MAX_COMMENT_CHARS = 2000
MAX_LABELLER_CHARS = 128


class UnknownTrajectory(AgentFlowError):
    reason = Reason.NOT_FOUND


def feedback_reward(request: gateway_pb2.FeedbackRequest, caller: Caller) -> trajectory_pb2.Reward:
    """The ``human`` reward ``caller``'s rating asks for, authored by the rater (the key's name, or ``NAME/LABELLER``
    for a key that may ``delegate``: a labeller is otherwise only a note in the detail); InvalidInput names what is
    wrong with it."""
    tid = request.trajectory_id
    if not tid or len(tid) > 64 or not tid.isascii() or not tid.isprintable():
        raise InvalidInput("trajectory_id must be the id Solve returned (1-64 printable ASCII characters)")
    kind = request.WhichOneof("rating")
    if kind is None:
        raise InvalidInput("a rating is required: score in [0, 1] or thumbs_up")
    value = float(request.thumbs_up) if kind == "thumbs_up" else request.score
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise InvalidInput(f"score must be a number in [0, 1], got {value!r}")
    if len(request.comment) > MAX_COMMENT_CHARS:
        raise InvalidInput(f"comment is {len(request.comment)} characters; at most {MAX_COMMENT_CHARS}")
    labeller = request.labeller
    if len(labeller) > MAX_LABELLER_CHARS or not labeller.isprintable():
        raise InvalidInput(f"labeller must be at most {MAX_LABELLER_CHARS} printable characters")
    if labeller and "delegate" in caller.scopes:
        return trajectory_pb2.Reward(value=value, source="human", detail=request.comment,
                                     author=f"{caller.name}/{labeller}")
    detail = f"[labeller {labeller}] {request.comment}".strip() if labeller else request.comment
    return trajectory_pb2.Reward(value=value, source="human", detail=detail, author=caller.name)


def rating_digest(reward: trajectory_pb2.Reward) -> str:
    """What tells one rating from another: the same rating again has the same digest (and event id)."""
    return hashlib.sha256(reward.SerializeToString(deterministic=True)).hexdigest()[:16]


def feedback_envelope(tid: str, reward: trajectory_pb2.Reward, digest: str) -> events_pb2.Envelope:
    """The ``Feedback`` event the memory service joins onto the record of ``tid``."""
    return new_envelope(tid, 0, events_pb2.Feedback(trajectory_id=tid, reward=reward, author=reward.author),
                        stage=f"feedback-{digest}")


@dataclass
class _Finished:
    """What the gateway keeps of a finished trajectory for Feedback: who asked, and the ratings it accepted."""

    owner: str
    ratings: dict[str, str] = field(default_factory=dict)  # rater -> digest of their current rating
    changes: int = 0  # ratings accepted that changed the record


class Ratings:
    """The finished trajectories the gateway has seen (the newest ``max_known_trajectories``), who asked for each,
    and the ratings accepted: at most ``max_per_trajectory`` that change one trajectory, ``max_per_rater_per_minute``
    of one rater."""

    def __init__(self, *, max_known_trajectories: int, max_per_trajectory: int, max_per_rater_per_minute: int):
        self.max_known_trajectories = max_known_trajectories
        self.max_per_trajectory, self.max_per_rater_per_minute = max_per_trajectory, max_per_rater_per_minute
        self._lock = threading.Lock()
        self._finished: OrderedDict[str, _Finished] = OrderedDict()
        self._rated_at: dict[str, list[float]] = {}  # rater -> times of their ratings in the last minute

    def remember(self, tid: str, owner: str) -> None:
        """A trajectory record of ``tid`` was seen, asked for by ``owner``."""
        with self._lock:
            self._finished.setdefault(tid, _Finished(owner))
            self._finished.move_to_end(tid)
            while len(self._finished) > self.max_known_trajectories:
                self._finished.popitem(last=False)

    def accept(self, tid: str, caller: Caller, rater: str, digest: str) -> None:
        """A known trajectory that ``caller`` may rate, with room for one more rating that changes it (the rater's
        current rating again always has room: a caller retrying an unconfirmed call must get through)."""
        with self._lock:
            finished = self._finished.get(tid)
            if finished is None:
                raise UnknownTrajectory(f"no finished trajectory {tid[:64]!r} (give the trajectory_id that Solve "
                                        "returned, once it has answered)")
            if finished.owner != caller.name and "review" not in caller.scopes:
                raise PermissionDenied(f"the key {caller.name!r} may rate only the trajectories it asked for "
                                       "(rating others needs the scope 'review')")
            if finished.ratings.get(rater) == digest:
                return
            if finished.changes >= self.max_per_trajectory:
                raise AgentFlowError(f"trajectory {tid[:64]!r} was rated {finished.changes} times, the most this "
                                     "gateway accepts for one", reason=Reason.RESOURCE_EXHAUSTED)
            self._rate_limit(rater)
            finished.ratings[rater] = digest
            finished.changes += 1

    def _rate_limit(self, rater: str) -> None:
        """At most ``max_per_rater_per_minute`` ratings of one rater in any minute (under the lock)."""
        now = time.monotonic()
        recent = [t for t in self._rated_at.get(rater, ()) if t > now - 60.0]
        if len(recent) >= self.max_per_rater_per_minute:
            raise AgentFlowError(f"rater {rater[:80]!r} sent {len(recent)} ratings in the last minute, the most this "
                                 "gateway accepts; try again later", reason=Reason.RESOURCE_EXHAUSTED)
        self._rated_at[rater] = recent + [now]
        if len(self._rated_at) > self.max_known_trajectories:  # bounded: forget raters idle for a minute
            self._rated_at = {r: ts for r, ts in self._rated_at.items() if ts[-1] > now - 60.0}
