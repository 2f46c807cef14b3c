"""What one trajectory record tells the rollout controller: which planner version served it, its reward, its error
rate and its latency (pure; the record is the dict of ``agentflow.flow.convert.record_from_proto``)."""

from __future__ import annotations

from dataclasses import dataclass

#: Attribution outcomes (also the label values of the trajectories metric).
ATTRIBUTED, UNVERSIONED, MIXED = "attributed", "unversioned", "mixed"


@dataclass(frozen=True)
class Observation:
    trajectory_id: str
    #: The planner version that served every planner call of the trajectory ("" unless ``attribution`` is
    #: ATTRIBUTED).
    version: str
    attribution: str
    #: The reward of the configured source, clipped to [0, 1]; None when the record has none.
    reward: float | None
    #: Share of the turns that ended in a tool error or a planner parse error; 1.0 for status "error".
    error_rate: float
    latency_s: float
    started_at_unix: float


def planner_versions(record: dict) -> set[str]:
    """The serving versions recorded on the planner's calls (analysis and every turn's plan), empty ones left out."""
    calls = [record.get("analysis_call") or {}] + [(turn.get("planner") or {}) for turn in record.get("turns") or []]
    return {call.get("model_version") or "" for call in calls} - {""}


def reward_of(record: dict, source: str = "rule") -> float | None:
    """The last reward of ``source`` ("any": the last reward of any source), clipped to [0, 1]."""
    values = [r.get("value") for r in record.get("rewards") or []
              if source == "any" or r.get("source") == source]
    values = [v for v in values if isinstance(v, (int, float))]
    return min(1.0, max(0.0, float(values[-1]))) if values else None


def error_rate_of(record: dict) -> float:
    if record.get("status") == "error":
        return 1.0
    turns = record.get("turns") or []
    if not turns:
        return 0.0
    failed = sum(1 for turn in turns if turn.get("tool_error") or turn.get("parse_error"))
    return failed / len(turns)


def observe(record: dict, reward_source: str = "rule") -> Observation:
    versions = planner_versions(record)
    if len(versions) == 1:
        version, attribution = next(iter(versions)), ATTRIBUTED
    else:
        version, attribution = "", MIXED if versions else UNVERSIONED
    latency = (record.get("totals") or {}).get("latency_s") or 0.0
    return Observation(
        trajectory_id=record.get("trajectory_id", ""), version=version, attribution=attribution,
        reward=reward_of(record, reward_source), error_rate=error_rate_of(record),
        latency_s=max(0.0, float(latency)), started_at_unix=float(record.get("started_at_unix") or 0.0))
