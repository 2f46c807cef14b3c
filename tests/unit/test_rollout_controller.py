"""The rollout controller's decisions, with an in-memory backend and synthetic trajectory records (no broker)."""

from __future__ import annotations

import itertools
import json
import logging

import pytest
from prometheus_client import CollectorRegistry

from agentflow.bus import codec
from agentflow.domain.convert import from_dict
from agentflow.proto.v1 import events_pb2 as pb
from agentflow.proto.v1 import trajectory_pb2
from agentflow.rollout.backends import BackendError, BackendStatus, ServedVersion, Version, VersionRejected
from agentflow.rollout.controller import RolloutController
from agentflow.rollout.metrics import RolloutMetrics
from agentflow.rollout import tripwires as tw
from agentflow.rollout.records import observe
from agentflow.rollout.settings import RolloutSettings
from agentflow.versions import quarantined_version

STABLE = Version("v0", "file:///ckpt/v0")
_ids = itertools.count()


class MemoryBackend:
    """Keeps weights in a dict; ``fail[op]`` is a list of errors raised (once each) by the next calls of ``op``."""

    kind, target = "local", "memory"

    def __init__(self):
        self.weights = {STABLE.name: 100}
        self.uris = {STABLE.name: STABLE.uri}
        self.calls: list[tuple] = []
        self.fail: dict[str, list[Exception]] = {}
        self.failure = ""

    def _maybe_fail(self, op):
        if self.fail.get(op):
            raise self.fail[op].pop(0)

    def status(self):
        self._maybe_fail("status")
        return BackendStatus(tuple(ServedVersion(n, self.uris[n], w) for n, w in self.weights.items()),
                             canary_failure=self.failure)

    def load_canary(self, canary, stable, percent):
        self.calls.append(("load", canary.name, percent))
        self._maybe_fail("load")
        self.uris[canary.name] = canary.uri
        self.weights.update({stable.name: 100 - percent, canary.name: percent})

    def set_percent(self, canary, stable, percent):
        self.calls.append(("percent", canary.name, percent))
        self._maybe_fail("percent")
        self.weights.update({stable.name: 100 - percent, canary.name: percent})

    def promote(self, canary, stable):
        self.calls.append(("promote", canary.name))
        self._maybe_fail("promote")
        self.weights = {canary.name: 100}

    def rollback(self, canary, stable):
        self.calls.append(("rollback", canary.name))
        self._maybe_fail("rollback")
        self.weights = {stable.name: 100}


class Clock:
    def __init__(self, now=1_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


def record(version: str | list[str], *, reward: float | None = 1.0, errors: int = 0, turns: int = 2,
           latency_s: float = 10.0, started_at: float = 1_000_001.0, status: str = "answered", tid: str = "") -> dict:
    versions = version if isinstance(version, list) else [version] * turns
    return {
        "trajectory_id": tid or f"t{next(_ids)}", "status": status, "started_at_unix": started_at,
        "analysis_call": {"model_version": versions[0]},
        "turns": [{"step": i, "planner": {"model_version": v}, "tool_error": "timeout: 5 s" if i < errors else "",
                   "parse_error": ""} for i, v in enumerate(versions)],
        "rewards": [] if reward is None else [{"value": reward, "source": "rule", "detail": ""}],
        "totals": {"turns": len(versions), "latency_s": latency_s},
    }


def version_event(name="v1", uri="file:///ckpt/v1") -> pb.PlannerVersion:
    return pb.PlannerVersion(version=name, checkpoint_uri=uri, parent_version="v0", created_at_unix_ms=1)


@pytest.fixture
def setup():
    def make(**overrides):
        settings = RolloutSettings(**{"min_samples": 20, "alpha": 0.05, "reward_margin": 0.1, **overrides})
        backend, clock, events = MemoryBackend(), Clock(), []
        metrics = RolloutMetrics(CollectorRegistry())
        controller = RolloutController(settings, backend, sink=events.append, clock=clock, metrics=metrics)
        return controller, backend, clock, events, metrics

    return make


def actions(events):
    return [(e.rollout_decision.action, e.rollout_decision.percent) for e in events]


def feed(controller, canary: dict, stable: dict, n: int, *, until=None, events=None):
    """Alternate canary and stable records built with these keyword arguments; stop early at ``until`` events."""
    for _ in range(n):
        controller.on_trajectory(record("v1", **canary))
        controller.on_trajectory(record("v0", **stable))
        if until is not None and len(events) >= until:
            return


def test_a_good_version_is_promoted_in_steps(setup):
    controller, backend, clock, events, metrics = setup()
    controller.on_version(version_event())
    assert actions(events) == [("canary", 10)]
    assert backend.calls == [("load", "v1", 10)]
    feed(controller, {}, {}, 2000, until=3, events=events)
    assert actions(events) == [("canary", 10), ("step", 50), ("promote", 100)]
    assert backend.calls == [("load", "v1", 10), ("percent", "v1", 50), ("promote", "v1")]
    assert controller.stable == Version("v1", "file:///ckpt/v1") and controller.rollout is None

    envelope = events[-1]
    assert envelope.trajectory_id == "rollout:v1" and envelope.step == 2
    assert envelope.event_id == "rollout:v1:2:rollout_decision"
    d = envelope.rollout_decision
    assert (d.stable_version, d.stable_uri, d.checkpoint_uri, d.backend, d.target) == (
        "v0", STABLE.uri, "file:///ckpt/v1", "local", "memory")
    assert d.canary.version == "v1" and d.canary.samples >= 20 and d.canary.reward_mean == 1.0
    assert d.stable.latency_mean_s == pytest.approx(10.0)
    assert {c.metric: c.verdict for c in d.comparisons} == {
        "reward": "non_inferior", "error_rate": "non_inferior", "latency": "better"}
    reward = next(c for c in d.comparisons if c.metric == "reward")
    assert reward.diff_lower > -0.1 and reward.margin == 0.1
    assert metrics.decisions.labels("promote")._value.get() == 1
    assert metrics.canary_percent._value.get() == 0


def test_a_worse_version_is_rolled_back(setup, caplog):
    controller, backend, clock, events, _ = setup()
    controller.on_version(version_event())
    with caplog.at_level(logging.INFO, logger="agentflow.rollout"):
        feed(controller, {"reward": 0.0}, {"reward": 1.0}, 500, until=2, events=events)
    assert actions(events) == [("canary", 10), ("rollback", 0)]
    assert backend.weights == {"v0": 100} and controller.stable == STABLE
    d = events[-1].rollout_decision
    assert "reward lower by more than 0.1" in d.reason
    assert {c.metric: c.verdict for c in d.comparisons}["reward"] == "worse"
    assert 20 <= d.canary.samples <= 30  # decided once the minimum was there and the evidence sufficed
    line = json.loads(next(r.getMessage() for r in caplog.records if "rollback" in r.getMessage()))
    assert line["event"] == "rollout_decision" and line["action"] == "rollback"
    assert line["evidence"]["reward"]["verdict"] == "worse"


def test_more_tool_errors_or_much_slower_roll_back(setup):
    controller, backend, clock, events, _ = setup()
    controller.on_version(version_event())
    feed(controller, {"errors": 2}, {}, 500, until=2, events=events)
    assert actions(events)[-1] == ("rollback", 0) and "more tool errors" in events[-1].rollout_decision.reason

    controller, backend, clock, events, _ = setup()
    controller.on_version(version_event())
    feed(controller, {"latency_s": 60.0}, {"latency_s": 10.0}, 500, until=2, events=events)
    assert actions(events)[-1] == ("rollback", 0) and "slower than 1.5x" in events[-1].rollout_decision.reason


def test_nothing_is_decided_before_the_minimum_sample(setup):
    controller, backend, clock, events, _ = setup(min_samples=50)
    controller.on_version(version_event())
    feed(controller, {"reward": 0.0}, {"reward": 1.0}, 49)
    assert actions(events) == [("canary", 10)]
    feed(controller, {"reward": 0.0}, {"reward": 1.0}, 1)
    assert actions(events)[-1] == ("rollback", 0)


def test_without_rewards_a_step_times_out_to_the_default_action(setup):
    controller, backend, clock, events, _ = setup(timeout_s=3600)
    controller.on_version(version_event())
    feed(controller, {"reward": None}, {"reward": None}, 300)
    assert actions(events) == [("canary", 10)]  # errors and latency alone never promote
    clock.now += 3601
    controller.tick()
    assert actions(events) == [("canary", 10), ("rollback", 0)]
    assert "no decision after 3601 s" in events[-1].rollout_decision.reason

    controller, backend, clock, events, _ = setup(timeout_s=3600, timeout_action="promote")
    controller.on_version(version_event())
    clock.now += 3601
    controller.tick()
    assert actions(events) == [("canary", 10), ("step", 50)]


def test_an_undecided_canary_yields_to_a_newer_waiting_version_after_supersede_s(setup):
    for supersede_s, superseded in ((0, False), (120, True)):
        controller, backend, clock, events, _ = setup(supersede_s=supersede_s)
        controller.on_version(version_event())
        feed(controller, {}, {}, 5)  # too few to decide
        clock.now += 300
        controller.tick()
        assert actions(events) == [("canary", 10)]  # nothing newer waits: it keeps its canary
        controller.on_version(version_event("v2", "file:///ckpt/v2"))
        controller.tick()
        if not superseded:  # supersede_s 0: v1 runs to timeout_s
            assert actions(events) == [("canary", 10), ("queue", 0)] and controller.rollout.canary.name == "v1"
            continue
        assert actions(events) == [("canary", 10), ("queue", 0), ("rollback", 0), ("canary", 10)]
        assert events[2].rollout_decision.reason.startswith("superseded by v2: undecided after 300 s")
        assert controller.rollout.canary.name == "v2" and backend.weights == {"v0": 90, "v2": 10}


def test_a_canary_is_superseded_only_once_it_has_supersede_min_rewarded_rewards(setup):
    """On a slow machine the seconds pass before the evidence comes: the canary keeps its slot until it has it."""
    controller, backend, clock, events, _ = setup(supersede_s=120, supersede_min_rewarded=8)
    controller.on_version(version_event())
    feed(controller, {}, {}, 5)  # too few to decide, and to yield
    clock.now += 300
    controller.on_version(version_event("v2", "file:///ckpt/v2"))
    controller.tick()
    assert actions(events) == [("canary", 10), ("queue", 0)] and controller.rollout.canary.name == "v1"
    feed(controller, {}, {}, 3)  # 8 rewarded: still below min_samples (20), so undecided, but it had its chance
    controller.tick()
    assert actions(events) == [("canary", 10), ("queue", 0), ("rollback", 0), ("canary", 10)]
    assert "300 s and 8 rewarded trajectories" in events[2].rollout_decision.reason
    assert controller.rollout.canary.name == "v2"


def test_a_checkpoint_that_fails_to_load_is_rejected_and_stable_keeps_serving(setup):
    controller, backend, clock, events, metrics = setup()
    backend.fail["load"] = [VersionRejected("could not load v1 from file:///ckpt/v1: no config.json")]
    controller.on_version(version_event())
    assert actions(events) == [("reject", 0)]
    assert "no config.json" in events[0].rollout_decision.reason
    assert backend.weights == {"v0": 100} and controller.rollout is None
    assert metrics.backend_errors.labels("load")._value.get() == 1
    controller.on_version(version_event())  # redelivered: already decided
    assert len(events) == 1


def test_bad_version_events_are_rejected_without_touching_the_backend(setup):
    controller, backend, clock, events, _ = setup()
    controller.on_version(pb.PlannerVersion(version="v1"))
    controller.on_version(pb.PlannerVersion(checkpoint_uri="file:///x"))
    controller.on_version(pb.PlannerVersion(version="v2\r\nSet-Cookie: x", checkpoint_uri="file:///x"))
    assert actions(events) == [("reject", 0), ("reject", 0), ("reject", 0)]
    assert "needs a version name and a checkpoint_uri" in events[0].rollout_decision.reason
    assert events[1].trajectory_id == "rollout:(unnamed)"
    assert "a version name must be" in events[2].rollout_decision.reason
    assert backend.calls == [] and controller.latest != "v2\r\nSet-Cookie: x"  # never "latest" in a table


def test_a_backend_outage_delays_the_canary_without_losing_it(setup):
    controller, backend, clock, events, _ = setup()
    backend.fail["load"] = [BackendError("connection refused"), BackendError("connection refused")]
    controller.on_version(version_event())
    assert actions(events) == [("queue", 0)] and controller.waiting is not None
    assert "waits for the backend: connection refused" in events[0].rollout_decision.reason
    controller.tick()  # still down: retried, not announced again
    assert actions(events) == [("queue", 0)]
    controller.tick()
    assert actions(events) == [("queue", 0), ("canary", 10)]
    assert [e.step for e in events] == [0, 1]  # one numbering per version: distinct event ids


def test_a_failed_promotion_is_retried_and_the_traffic_stays_meanwhile(setup):
    controller, backend, clock, events, _ = setup(steps="50,100", canary_percent=50)
    controller.on_version(version_event())
    backend.fail["promote"] = [BackendError("HTTP 503")]
    feed(controller, {}, {}, 1200)
    assert actions(events) == [("canary", 50)]
    assert controller.rollout.pending is not None and backend.weights == {"v0": 50, "v1": 50}
    controller.tick()
    assert actions(events) == [("canary", 50), ("promote", 100)]


def test_a_step_the_backend_refuses_becomes_a_rollback(setup):
    controller, backend, clock, events, _ = setup()
    controller.on_version(version_event())
    from agentflow.rollout.backends import UnknownVersion
    backend.fail["percent"] = [UnknownVersion("memory does not serve 'v1'")]
    feed(controller, {}, {}, 2000, until=2, events=events)
    assert actions(events) == [("canary", 10), ("rollback", 0)]
    assert "could not promote" in events[-1].rollout_decision.reason


def test_a_canary_that_cannot_serve_is_rejected(setup):
    controller, backend, clock, events, _ = setup()
    controller.on_version(version_event())
    backend.failure = "BlockedByFailedLoad: ModelLoadFailed config.json not found"
    controller.tick()
    assert actions(events) == [("canary", 10), ("reject", 0)]
    assert backend.calls[-1] == ("rollback", "v1") and "config.json" in events[-1].rollout_decision.reason


def test_versions_arriving_during_a_canary_wait_and_only_the_newest_runs_next(setup):
    controller, backend, clock, events, _ = setup()
    controller.on_version(version_event("v1"))
    controller.on_version(version_event("v2", "file:///ckpt/v2"))
    controller.on_version(version_event("v3", "file:///ckpt/v3"))
    assert [(e.rollout_decision.version, e.rollout_decision.action) for e in events] == [
        ("v1", "canary"), ("v2", "queue"), ("v2", "skip"), ("v3", "queue")]
    assert events[1].rollout_decision.reason == "waits for the canary of v1"
    feed(controller, {"reward": 0.0}, {"reward": 1.0}, 200, until=6, events=events)
    assert [(e.rollout_decision.version, e.rollout_decision.action, e.step) for e in events[4:]] == [
        ("v1", "rollback", 1), ("v3", "canary", 1)]
    assert backend.weights == {"v0": 90, "v3": 10}


def test_trajectories_are_attributed_counted_once_and_only_during_the_canary(setup):
    controller, backend, clock, events, metrics = setup()
    controller.on_trajectory(record("v0"))  # no canary: not counted
    controller.on_version(version_event())
    controller.on_trajectory(record("v1", tid="same"))
    controller.on_trajectory(record("v1", tid="same"))  # redelivered
    controller.on_trajectory(record(["v0", "v1"]))  # mixed versions
    controller.on_trajectory(record(""))  # unversioned (e.g. an embedded engine)
    controller.on_trajectory(record("v0", started_at=999_999.0))  # started before the canary
    controller.on_trajectory(record("v9"))  # some other version
    controller.on_trajectory(record("v0"))
    counts = {arm: metrics.trajectories.labels(arm)._value.get()
              for arm in ("idle", "canary", "duplicate", "mixed", "unversioned", "early", "other", "stable")}
    assert counts == {"idle": 1, "canary": 1, "duplicate": 1, "mixed": 1, "unversioned": 1, "early": 1,
                      "other": 1, "stable": 1}


def test_resume_carries_on_with_the_canary_in_progress(setup):
    controller, backend, clock, events, _ = setup()
    controller.on_version(version_event())
    feed(controller, {}, {}, 2000, until=2, events=events)
    assert actions(events) == [("canary", 10), ("step", 50)]

    restarted, _, _, new_events, _ = setup()
    restarted.backend = backend
    restarted.resume([(e.step, e.rollout_decision) for e in events])
    assert restarted.rollout.canary.name == "v1" and restarted.policy.ladder[restarted.rollout.step] == 50
    assert int(restarted.rollout.arms.samples(0)) == 0  # evidence starts afresh
    restarted.on_version(version_event())  # the redelivered version event changes nothing
    assert new_events == []
    feed(restarted, {}, {}, 2000, until=1, events=new_events)
    assert actions(new_events) == [("promote", 100)] and new_events[0].step == 2

    after, _, _, later, _ = setup()
    after.resume([(e.step, e.rollout_decision) for e in events + new_events])
    assert after.stable == Version("v1", "file:///ckpt/v1") and after.rollout is None
    after.on_version(version_event())
    assert later == []


def test_resume_finds_the_queued_version_and_ignores_later_decisions_of_others(setup):
    controller, backend, clock, events, _ = setup()
    controller.on_version(version_event("v1"))
    controller.on_version(version_event("v2", "file:///ckpt/v2"))
    controller.on_version(pb.PlannerVersion(version="bad"))  # a reject of another version, after the canary began
    assert actions(events) == [("canary", 10), ("queue", 0), ("reject", 0)]

    restarted, _, _, new_events, _ = setup()
    restarted.backend = backend
    restarted.resume([(e.step, e.rollout_decision) for e in events])
    assert restarted.rollout.canary.name == "v1" and restarted.stable == STABLE
    assert restarted.waiting.version == "v2" and restarted.waiting.checkpoint_uri == "file:///ckpt/v2"
    feed(restarted, {"reward": 0.0}, {"reward": 1.0}, 200, until=2, events=new_events)
    assert [(e.rollout_decision.version, e.rollout_decision.action, e.step) for e in new_events] == [
        ("v1", "rollback", 1), ("v2", "canary", 1)]


def test_handle_reads_envelopes(setup):
    controller, backend, clock, events, metrics = setup()
    assert controller.handle(codec.new_envelope("trainer", 1, version_event())) == []
    trajectory = from_dict(record("v1"), trajectory_pb2.Trajectory)
    controller.handle(codec.new_envelope("t-1", 0, trajectory))
    assert actions(events) == [("canary", 10)]
    assert metrics.trajectories.labels("canary")._value.get() == 1


def test_observe_reads_the_record():
    obs = observe(record("v1", reward=0.5, errors=1, turns=4, latency_s=3.5))
    assert (obs.version, obs.attribution, obs.reward, obs.error_rate, obs.latency_s) == ("v1", "attributed", 0.5,
                                                                                         0.25, 3.5)
    assert observe(record("v1", status="error")).error_rate == 1.0
    rec = record("v1")
    rec["rewards"] = [{"value": 1.0, "source": "rule"}, {"value": 0.0, "source": "human"}, {"value": 7, "source": "rule"}]
    assert observe(rec).reward == 1.0  # the last rule reward, clipped to [0, 1]
    assert observe(rec, "human").reward == 0.0 and observe(rec, "judge").reward is None
    assert observe(rec, "any").reward == 1.0  # every source, by the record's precedence: the rule first
    rec["turns"][0]["parse_error"] = "no Tool Name"
    assert observe(rec).error_rate == 0.5


def test_an_unexplained_traffic_split_is_not_guessed_at(setup):
    controller, backend, clock, events, metrics = setup()
    backend.weights = {"v0": 50, "vX": 50}
    backend.uris["vX"] = "file:///ckpt/vX"
    controller.on_version(version_event())
    assert actions(events) == [("queue", 0)] and controller.waiting is not None  # waits; the log says why
    assert metrics.backend_errors.labels("status")._value.get() == 1
    backend.weights = {"v0": 100}
    controller.tick()
    assert actions(events) == [("queue", 0), ("canary", 10)]


def test_a_reward_joined_later_counts_once(setup):
    controller, backend, clock, events, metrics = setup(reward_source="human")
    controller.on_version(version_event())
    first = record("v1", reward=None, tid="fb")
    controller.on_trajectory(first)
    arms = controller.rollout.arms
    assert (int(arms.samples(0)), int(arms.rewarded(0))) == (1, 0)
    again = record("v1", reward=None, tid="fb")
    again["rewards"] = [{"value": 1.0, "source": "human", "detail": "thumbs up"}]
    controller.on_trajectory(again)  # the memory service re-emits the record with the feedback joined
    controller.on_trajectory(again)  # and that copy redelivered
    assert (int(arms.samples(0)), int(arms.rewarded(0))) == (1, 1)
    assert metrics.trajectories.labels("late_reward")._value.get() == 1
    assert metrics.trajectories.labels("duplicate")._value.get() == 1


def test_a_canary_that_asks_back_is_rolled_back_on_a_tripwire_while_its_reward_looks_fine(setup, caplog):
    def answered(version, answer, **kw):
        r = record(version, **kw)
        r["answer"] = answer
        return r

    # the sequential test needs its 200 per arm; the tripwires (default: 100 per arm) act first
    controller, backend, clock, events, metrics = setup(min_samples=200)
    controller.on_version(version_event())
    with caplog.at_level(logging.INFO, logger="agentflow.rollout"):
        for _ in range(150):
            controller.on_trajectory(answered("v1", "Could you clarify what you mean?"))  # rated 1.0 all the same
            controller.on_trajectory(answered("v0", "4082001"))
            if len(events) > 1:
                break
    assert actions(events) == [("canary", 10), ("rollback", 0)]
    assert backend.weights == {"v0": 100} and controller.stable == STABLE
    d = events[-1].rollout_decision
    assert (d.canary.samples, d.stable.samples, d.canary.reward_mean, d.stable.reward_mean) == (100, 100, 1.0, 1.0)
    assert d.reason == ("tripwire refusal_rate: 1.000 of answers ask back or refuse on the canary vs 0.000 on stable "
                        "(+1.000 > +0.1 over 100 canary and 100 stable trajectories)")  # length, shape: no answers
    verdicts = {c.metric: c.verdict for c in d.comparisons}
    assert verdicts["reward"] == "undecided" and verdicts["tripwire:refusal_rate"] == "tripped"
    assert quarantined_version(d) == "v1"  # what the trainer reads to quarantine v1's training groups
    line = json.loads(next(r.getMessage() for r in caplog.records if "rollback" in r.getMessage()))
    assert line["reason"] == d.reason and line["evidence"]["tripwire:refusal_rate"]["verdict"] == "tripped"
    assert metrics.tripped.labels("refusal_rate")._value.get() == 1
    assert metrics.tripwire.labels("refusal_rate")._value.get() == 1.0

    # the same traffic without the tripwires: nothing wrong is seen before 200 per arm, and the canary goes on
    controller, backend, clock, events, metrics = setup(min_samples=200, tripwire_min_samples=0)
    controller.on_version(version_event())
    for _ in range(150):
        controller.on_trajectory(answered("v1", "Could you clarify what you mean?"))
        controller.on_trajectory(answered("v0", "4082001"))
    assert actions(events) == [("canary", 10)]


def test_a_judge_reward_joined_later_counts_once_for_the_disagreement_tripwire(setup):
    controller, backend, clock, events, metrics = setup()
    controller.on_version(version_event())
    first = record("v1", reward=0.0, tid="j")  # a rule reward only
    controller.on_trajectory(first)
    trips = controller.rollout.trips
    again = record("v1", reward=0.0, tid="j")
    again["rewards"].append({"value": 1.0, "source": "judge", "detail": "CORRECT (reference)"})
    controller.on_trajectory(again)  # the judge's verdict joined by the memory service
    controller.on_trajectory(again)  # redelivered
    assert (int(trips.counts[0, tw.RECORDS]), int(trips.counts[0, tw.PAIRS]), int(trips.counts[0, tw.DISAGREEMENTS])) \
        == (1, 1, 1)
    assert metrics.trajectories.labels("late_reward")._value.get() == 1
    assert metrics.trajectories.labels("duplicate")._value.get() == 1
