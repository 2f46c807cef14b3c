"""The gateway: the user API. ``AgentFlow.Solve`` waits for the whole trajectory; ``AgentFlow.SolveStream`` streams
each plan, execution, verdict and the answer as they happen.

A query becomes a ``Query`` event on ``queries``; a listener follows the ring's topics (a ``Follower``, outside any
consumer group, so every gateway replica sees every event) and hands each event to the call waiting for that
trajectory.
A query the gateway accepted is kept until its trajectory record is seen (bounded: ``max_unanswered``, and
dropped past its deadline plus ``answer_grace_s``) and published again, with the same event id, when the listener
finds the topics re-created (a broker that restarted empty has lost it) or when its send failed for good
(docs/event-bus.md, "Broker restarts"); the memory service answers a repeated query with what that trajectory is
owed.
Requests are checked before anything is published: the caller (``x-api-key`` metadata, ``keys.KeyRing``: a named key
with scopes; only ``train`` may send ``source=training``, a ``group_id`` or a ``ground_truth``), empty or oversized
query, bad options (``flow.loop.check_query``: the same check the memory service applies to what it reads from
``queries``; every field bounded, every numeric option range-checked, NaN and infinity refused).

``AgentFlow.Feedback`` rates a finished trajectory: the gateway knows the ids of the records it has seen on
``trajectories`` (the listener reads that topic from its start, so a restarted gateway knows them again; bounded by
``max_known_trajectories``) and who asked for each (``Trajectory.owner``): a key rates only its own trajectories,
unless it has the ``review`` scope. The rater is the key (``NAME``, or ``NAME/LABELLER`` for a key with the
``delegate`` scope), never a name the caller chose. The gateway bounds the ratings that change a trajectory
(``max_ratings_per_trajectory``: each makes the memory service emit the record again; the same rating again is free)
and the ratings of one rater a minute (``max_ratings_per_rater_per_minute``), and publishes a ``Feedback`` event that
the memory service joins onto the record as a ``human`` reward of that rater (docs/rewards.md).

The parts: ``service`` (the servicer, ``Gateway``, and its ``GatewayConfig``), ``inflight`` (the accepted queries
and the calls waiting for them), ``feedback`` (ratings: the reward, who may rate what, the caps), ``keys`` (the API
keys).
"""

from agentflow.services.gateway.feedback import (MAX_COMMENT_CHARS, MAX_LABELLER_CHARS, UnknownTrajectory,
                                                 feedback_reward)
from agentflow.services.gateway.inflight import ClientGone, TimedOut
from agentflow.services.gateway.service import FOLLOWED, GRPC_SERVICE, Gateway, GatewayConfig, Malformed

__all__ = [
    "FOLLOWED", "GRPC_SERVICE", "MAX_COMMENT_CHARS", "MAX_LABELLER_CHARS", "ClientGone", "Gateway", "GatewayConfig",
    "Malformed", "TimedOut", "UnknownTrajectory", "feedback_reward",
]
