"""Publication to first rollout (``trainer.metrics.VersionLag``) and the batch's turns by staleness."""

from agentflow.trainer.metrics import VersionLag


def _record(version: str, started: float, source: str = "training") -> dict:
    return {"trajectory_id": f"t-{version}-{started}", "source": source, "started_at_unix": started,
            "turns": [{"step": 0, "planner": {"model_version": version}}]}


def test_the_first_training_rollout_of_a_version_gives_its_lag():
    lag = VersionLag()
    lag.publish("v000002", 100.0)
    lag.publish("v000003", 110.0)
    lag.observe(_record("v000002", 104.5, source="traffic"))  # users' traffic is not a rollout
    lag.observe(_record("v000002", 107.0))
    lag.observe(_record("v000002", 130.0))  # not the first any more
    lag.observe(_record("v000001", 130.0))  # published before this trainer started: unknown
    lag.observe(_record("v000003", 109.0))  # started before the publication reached it: 0, not negative
    assert lag.take() == [7.0, 0.0] and lag.take() == []


def test_versions_never_sampled_are_forgotten():
    lag = VersionLag()
    for n in range(VersionLag.KEEP + 10):
        lag.publish(f"v{n:06d}", float(n))
    assert len(lag.published) == VersionLag.KEEP and "v000000" not in lag.published
