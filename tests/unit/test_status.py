"""`agentflow status`'s summary: where the loop stands and what is idle, from records and times made up here (the
command against a real ring: tests/integration/test_chart_run.py)."""

from agentflow.status import Seen, render, summarize

MIN = 60_000  # ms
NOW = 1_000 * MIN


def progress(at_min: float, steps: int, trained: int, left_out: dict | None = None) -> Seen:
    return Seen(int(NOW - at_min * MIN), {"groups_done": steps * 6, "steps": steps, "trained_steps": trained,
                                          "version": f"v{trained:06d}", "groups_left_out": left_out or {}})


def decision(at_min: float, action: str, version: str, **extra) -> Seen:
    return Seen(int(NOW - at_min * MIN), {"action": action, "version": version, "stable_version": "v000000",
                                          "percent": 25, "reason": f"{action} {version}", **extra})


def test_a_loop_that_turns_shows_its_last_step_promotion_and_running_canary_without_alarms():
    decisions = [decision(30, "canary", "v000003"), decision(20, "promote", "v000003"),
                 decision(5, "canary", "v000009", canary={"samples": 40, "reward_samples": 20}),
                 decision(1, "queue", "v000012")]
    summary = summarize([progress(2, 10, 9), progress(0.5, 13, 12)], [Seen(NOW - MIN, {"version": "v000012"})],
                        decisions, NOW)
    assert summary["trainer"]["trained_steps"] == 12 and summary["trainer"]["updated_s_ago"] == 30
    assert summary["last_promotion"] == {"version": "v000003", "age_s": 1200}
    assert summary["canary"]["version"] == "v000009" and summary["canary"]["canary_arm"]["samples"] == 40
    assert summary["alarms"] == []
    text = render(summary)
    assert "13 steps (12 trained)" in text and "canary       v000009 at 25 %" in text and "alarms       none" in text


def test_live_metrics_give_the_running_canarys_counts():
    live = {("agentflow_rollout_samples", (("arm", "canary"),)): 300.0,
            ("agentflow_rollout_rewarded_samples", (("arm", "canary"),)): 0.0,
            ("agentflow_rollout_samples", (("arm", "stable"),)): 900.0}
    summary = summarize([progress(1, 5, 5)], [], [decision(40, "canary", "v000005")], NOW, live)
    assert summary["canary"]["canary_arm"] == {"samples": 300, "reward_samples": 0}
    assert summary["alarms"] == ["canary v000005: none of its trajectories carries the compared reward"]


def test_each_kind_of_idleness_raises_its_alarm():
    assert summarize([], [], [], NOW)["alarms"] == ["no trainer progress on trainer.progress: is a trainer running?"]
    idle = summarize([progress(90, 40, 40)], [], [], NOW)
    assert idle["alarms"] == ["the trainer has finished no group for 90 min"]
    starved = summarize([progress(1, 30, 0, {"unrewarded": 25, "dropped": 2})], [], [], NOW)
    assert starved["alarms"] == ["groups are left out and no step trained: dropped 2, unrewarded 25"]
    stuck = summarize([progress(1, 30, 30)], [], [decision(200, "canary", "v000002"), decision(100, "queue", "v9")],
                      NOW)
    assert stuck["alarms"] == ["canary v000002 undecided for 3.3 h"]
    ended = summarize([progress(1, 30, 30)], [], [decision(200, "canary", "v000002"),
                                                  decision(150, "rollback", "v000002")], NOW)
    assert ended["canary"] is None and ended["alarms"] == []


def test_records_read_back_with_their_64_bit_counts_as_numbers_and_their_text_as_text():
    from agentflow.proto.v1 import events_pb2
    from agentflow.status import _plain

    progress = events_pb2.TrainerProgress(groups_done=12, steps=3, version="000123", trained_steps=2,
                                          groups_left_out={"no_vote": 5})
    assert _plain(progress) == {"groups_done": 12, "steps": 3, "version": "000123", "trained_steps": 2,
                                "groups_left_out": {"no_vote": 5}}
