"""What one trajectory record tells the rollout controller: which planner version served it, its reward, its error
rate and its latency (pure; the record is the dict of ``agentflow.domain.convert.record_from_proto``, read through
``agentflow.domain.trajectory.Record``)."""

from __future__ import annotations

from dataclasses import dataclass

from agentflow.domain.trajectory import Record

#: Attribution outcomes (also the label values of the trajectories metric).
ATTRIBUTED, UNVERSIONED, MIXED = "attributed", "unversioned", "mixed"


@dataclass(frozen=True)
class Observation:
    trajectory_id: str
    #: The planner version that served every planner call of the trajectory ("" unless ``attribution`` is
    #: ATTRIBUTED).
    version: str
    attribution: str
    #: ``Record.reward`` of the configured source(s), in [0, 1]; None when the record has none.
    reward: float | None
    #: Share of the turns that ended in a tool error or a planner parse error; 1.0 for status "error".
    error_rate: float
    latency_s: float
    started_at_unix: float


def reward_sources(reward_source: str) -> tuple[str, ...] | None:
    """The ``reward_source`` setting as ``Record.reward``'s sources: one source, or "any" (every source, by the
    record's reward precedence)."""
    return None if reward_source == "any" else (reward_source,)


def observe(record: dict, reward_source: str = "rule") -> Observation:
    view = Record(record)
    versions = view.planner_versions()
    if len(versions) == 1:
        version, attribution = next(iter(versions)), ATTRIBUTED
    else:
        version, attribution = "", MIXED if versions else UNVERSIONED
    return Observation(
        trajectory_id=record.get("trajectory_id", ""), version=version, attribution=attribution,
        reward=view.reward(reward_sources(reward_source)), error_rate=view.error_rate(), latency_s=view.latency_s(),
        started_at_unix=float(record.get("started_at_unix") or 0.0))
