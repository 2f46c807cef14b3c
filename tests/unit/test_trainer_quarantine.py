"""The trainer's quarantine: training groups served by a version the rollout controller rolled back on a tripwire
stay on the topic and are never trained on (counted in groups_quarantined); the decision that says so comes from a
real controller (no broker)."""

from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from agentflow.bus import codec
from agentflow.bus.clients import Received
from agentflow.proto.v1 import events_pb2 as pb
from agentflow.rollout.backends import BackendStatus, ServedVersion
from agentflow.rollout.controller import RolloutController
from agentflow.rollout.metrics import RolloutMetrics
from agentflow.rollout.settings import RolloutSettings
from agentflow.trainer.service import GroupCollector, TrainerService
from agentflow.versions import Served


def training(tid: str, group: str, version: str) -> dict:
    return {"trajectory_id": tid, "group_id": group, "source": "training", "answer": "42",
            "analysis_call": {"model_version": version}, "turns": [{"planner": {"model_version": version}}],
            "rewards": [{"value": float(tid[-1]) % 2, "source": "rule"}]}


def collect(collector: GroupCollector, group: str, version: str, first_offset: int, now: float = 0.0) -> None:
    for i in range(3):
        collector.add(training(f"{group}-{i}", group, version), 0, first_offset + i, now)


def test_groups_of_a_quarantined_version_are_dropped_collecting_or_ready():
    c = GroupCollector(3, timeout_s=100.0)
    collect(c, "g7", "v7", 0)
    collect(c, "g8", "v8", 3)
    assert c.ready_count(0.0) == 2  # complete and ready, not taken yet
    c.add(training("h7-0", "h7", "v7"), 0, 6, 0.0)  # a group of v7 still collecting
    c.quarantine("v7")
    assert c.ready_count(1.0) == 1
    assert [[r["trajectory_id"] for r in g] for g in c.take(5)] == [["g8-0", "g8-1", "g8-2"]]
    assert c.counts["groups_quarantined"] == 2 and {"g7", "h7"} <= c.trained
    c.add(training("h7-1", "h7", "v7"), 0, 7, 2.0)  # the rest of a quarantined group: already handled
    assert c.counts["already_trained"] == 1 and c.ready_count(2.0) == 0
    assert c.resume_offsets() == {0: 8}  # nothing quarantined holds a restart back
    assert c.checkpoint_state()["trained_groups"][-1] == "g8"


class OneServer:
    kind, target = "local", "memory"

    def __init__(self):
        self.weights = {"v0": 100}

    def status(self):
        return BackendStatus(tuple(ServedVersion(n, f"file:///ckpt/{n}", w) for n, w in self.weights.items()))

    def load_canary(self, canary, stable, percent):
        self.weights.update({stable.name: 100 - percent, canary.name: percent})

    def rollback(self, canary, stable):
        self.weights = {stable.name: 100}


def served(version: str, tid: str, answer: str) -> dict:
    return {"trajectory_id": tid, "status": "answered", "started_at_unix": 1_000_001.0, "answer": answer,
            "analysis_call": {"model_version": version}, "turns": [{"planner": {"model_version": version}}],
            "rewards": [{"value": 1.0, "source": "rule"}], "totals": {"turns": 1, "latency_s": 1.0}}


def test_the_trainer_quarantines_what_the_controller_rolled_back_on_a_tripwire():
    decisions = []
    controller = RolloutController(RolloutSettings(min_samples=200, tripwire_min_samples=20), OneServer(),
                                   sink=decisions.append, metrics=RolloutMetrics(CollectorRegistry()),
                                   clock=lambda: 1_000_000.0)
    controller.on_version(pb.PlannerVersion(version="v1", checkpoint_uri="file:///ckpt/v1"))
    for i in range(20):
        controller.on_trajectory(served("v1", f"c{i}", "Could you clarify what you mean?"))
        controller.on_trajectory(served("v0", f"s{i}", "4082001"))
    assert [d.rollout_decision.action for d in decisions] == ["canary", "rollback"]

    service = object.__new__(TrainerService)  # only on_decision, its collector and what it keeps from pruning
    service.collector, service.served = GroupCollector(3, timeout_s=100.0), Served()
    service.trainer = SimpleNamespace(in_service=frozenset())
    for offset, envelope in enumerate(decisions):
        service.on_decision(Received("rollout.decisions", 0, offset, b"k", codec.encode(envelope)))
    service.on_decision(Received("rollout.decisions", 0, 9, b"k", b"not an envelope"))  # skipped
    assert service.collector.quarantined == {"v1"}  # the canary decision quarantines nothing, the rollback v1
    assert service.trainer.in_service == {0, 1}  # the stable version, and the rolled-back one while it drains
    collect(service.collector, "g1", "v1", 0)
    collect(service.collector, "g0", "v0", 3)
    assert service.collector.ready_count(0.0) == 1 and service.collector.counts["groups_quarantined"] == 1
