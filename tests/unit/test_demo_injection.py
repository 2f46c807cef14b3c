"""When the demo publishes its degraded version, how a held-out evaluation counts answers that failed, and what a new
run clears."""

from __future__ import annotations

import random

import pytest

from agentflow.demo.run import DEMO_MARKER, UNTRAINED, Demo, DemoSettings
from agentflow.errors import InvalidInput
from agentflow.proto.v1 import gateway_pb2, trajectory_pb2
from agentflow.trainer.drive import Item, evaluate


class ScriptedGateway:
    """Answers "4" to every query. A query containing "gone" ends as the ring ends one pinned to a version no longer
    served: every planner call refused (``parse_error``), the loop out of steps; "error" ends in status error."""

    def solve(self, query, **_):
        if "error" in query:
            return gateway_pb2.SolveResponse(status="error", error="gateway: deadline exceeded")
        if "gone" in query:
            refused = trajectory_pb2.Turn(parse_error="engine_unavailable: HTTP 404: version 'v7' is not loaded")
            return gateway_pb2.SolveResponse(status="max_steps", answer="unknown",
                                             trajectory=trajectory_pb2.Trajectory(turns=[refused, refused]))
        planned = trajectory_pb2.Turn(planner=trajectory_pb2.LLMCall(model_version="v7"))
        return gateway_pb2.SolveResponse(status="answered", answer="4",
                                         trajectory=trajectory_pb2.Trajectory(turns=[planned]))


def test_a_trajectory_no_planner_call_answered_is_a_failure_not_a_wrong_answer():
    items = [Item("2+2?", "4", "a"), Item("gone 2+2?", "4", "b"), Item("3+1?", "5", "c"), Item("error", "4", "d")]
    result = evaluate(ScriptedGateway(), items, concurrency=1)
    assert result["failed"] == 2 and result["n"] == 4, result
    assert result["success"] == 0.25


def _demo(tmp_path, **settings) -> Demo:
    demo = Demo(DemoSettings(out=str(tmp_path), unlabeled=True, rating_noise=0.2, **settings))
    demo.state["summary"].update(heldout_before=0.15, promoted=1)
    demo.state["versions"]["stable"] = "v000080"
    return demo


def _answers(demo: Demo, version: str, answered: int, correct: int) -> None:
    demo.state["traffic"]["by_version"][version] = {"answered": answered, "correct": correct}


def test_unlabeled_injection_waits_for_a_production_lead_the_ratings_can_show(tmp_path):
    """Wrong ratings (20 %) shrink a gap by 1 - 2 x 0.2: the lead must be 0.3 / 0.6 = 0.5 on production answers."""
    demo = _demo(tmp_path)
    demo.state["heldout"].append({"version": "v000080", "kind": "stable", "success": 0.9, "t_s": 1.0})
    _answers(demo, UNTRAINED, 1000, 300)  # 0.30
    _answers(demo, "v000080", 400, 300)  # 0.75: held-out 0.9 does not count, the production lead is 0.45
    assert not demo._stable_far_ahead()
    _answers(demo, "v000080", 400, 324)  # 0.81
    assert demo._stable_far_ahead()
    _answers(demo, "v000080", 399, 399)  # too few answers to tell
    assert not demo._stable_far_ahead()
    _answers(demo, "v000080", 400, 324)
    demo.state["summary"]["promoted"] = 0  # the stable version is still the untrained one
    assert not demo._stable_far_ahead()


def test_labelled_injection_follows_held_out_success(tmp_path):
    demo = Demo(DemoSettings(out=str(tmp_path)))
    demo.state["summary"].update(heldout_before=0.15, promoted=1)
    demo.state["versions"]["stable"] = "v000040"
    demo.state["heldout"].append({"version": "v000040", "kind": "stable", "success": 0.5, "t_s": 1.0})
    assert not demo._stable_far_ahead()  # 0.3 above the untrained planner, below the 0.8 target: a 120 s timeout
    demo.state["heldout"].append({"version": "v000040", "kind": "stable", "success": 0.8, "t_s": 2.0})
    assert demo._stable_far_ahead()


class FakeTrainer:
    def __init__(self):
        self.signals: list[int] = []

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)

    def poll(self):
        return None


def test_a_hold_at_the_target_ends_when_the_promoted_version_cannot_be_injected_beside(tmp_path):
    """The trainer is paused when a version newer than the stable one reaches the success the injection needs; once
    that version (or a newer one) is promoted and measured but not far enough ahead on production, the trainer goes
    on instead of waiting for ever, and the next hold needs a version newer than the new stable one."""
    import signal

    demo = Demo(DemoSettings(out=str(tmp_path), unlabeled=True, rating_noise=0.2, inject_bad_version=True,
                             target=0.7))
    demo.processes["trainer"], demo._progress = FakeTrainer(), lambda line: None
    demo._publish_bad_version = lambda: demo.state["decisions"].append({"version": "injected-bad",
                                                                         "action": "injected"})
    demo.state["heldout"].append({"version": "v000089", "kind": "latest", "success": 0.78, "t_s": 0.5})
    _answers(demo, UNTRAINED, 1000, 290)  # 0.29: a version needs 0.29 + 0.3 / 0.6 = 0.79
    demo._maybe_inject()
    assert demo.processes["trainer"].signals == [] and demo.held_at is None
    demo.state["heldout"].append({"version": "v000090", "kind": "latest", "success": 0.8, "t_s": 1.0})
    demo._maybe_inject()
    assert demo.processes["trainer"].signals == [signal.SIGSTOP] and demo.held_at == "v000090"
    demo.state["summary"]["promoted"] = 1
    demo.state["versions"]["stable"] = "v000092"
    demo.state["decisions"].append({"version": "v000092", "action": "promote"})
    _answers(demo, "v000092", 399, 310)
    demo._maybe_inject()  # promoted, but its production lead is not measured yet: still held
    assert demo.processes["trainer"].signals == [signal.SIGSTOP] and demo.injected_at is None
    _answers(demo, "v000092", 4839, 3706)  # 0.766: a lead of 0.48, below 0.3 / 0.6
    demo._maybe_inject()
    assert demo.processes["trainer"].signals == [signal.SIGSTOP, signal.SIGCONT] and demo.held_at is None
    demo.state["heldout"].append({"version": "v000092", "kind": "latest", "success": 0.8, "t_s": 2.0})
    demo._maybe_inject()  # the stable version itself: no new hold
    assert demo.held_at is None and len(demo.processes["trainer"].signals) == 2
    demo.state["heldout"].append({"version": "v000110", "kind": "latest", "success": 0.85, "t_s": 2.5})
    demo._maybe_inject()
    assert demo.held_at == "v000110" and demo.processes["trainer"].signals[-1] == signal.SIGSTOP
    demo.state["decisions"].append({"version": "v000110", "action": "rollback"})
    demo._maybe_inject()  # it lost its canary: the trainer goes on, and v000110 is not held again
    demo._maybe_inject()
    assert demo.held_at is None and demo.processes["trainer"].signals[-2:] == [signal.SIGSTOP, signal.SIGCONT]
    demo.state["heldout"].append({"version": "v000120", "kind": "latest", "success": 0.9, "t_s": 3.0})
    demo._maybe_inject()
    assert demo.held_at == "v000120" and demo.processes["trainer"].signals[-1] == signal.SIGSTOP
    demo.state["versions"]["stable"] = "v000121"
    demo.state["decisions"].append({"version": "v000121", "action": "promote"})
    _answers(demo, "v000121", 400, 360)  # 0.90: a lead of 0.61
    demo._maybe_inject()
    assert demo.injected_at is not None and demo.state["decisions"][-1]["version"] == "injected-bad"
    assert demo.processes["trainer"].signals[-1] == signal.SIGSTOP  # still paused until the injected one is judged


def test_a_run_clears_only_the_artefacts_of_a_previous_demo_and_refuses_a_folder_no_demo_wrote(tmp_path):
    (tmp_path / "models" / "v000073").mkdir(parents=True)  # another run's checkpoint (a LoRA one stopped a trainer)
    (tmp_path / "trainer-metrics.jsonl").write_text("{}\n")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(InvalidInput, match="holds models, trainer-metrics.jsonl that no demo wrote"):
        Demo(DemoSettings(out=str(tmp_path)))._clear_previous_run()
    assert (tmp_path / "models" / "v000073").is_dir()  # refused: nothing removed

    (tmp_path / DEMO_MARKER).write_text("")
    Demo(DemoSettings(out=str(tmp_path)))._clear_previous_run()
    assert not (tmp_path / "models").exists() and not (tmp_path / "trainer-metrics.jsonl").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / DEMO_MARKER).is_file()


def test_hostile_raters_rate_every_answer_the_wrong_way_and_each_user_is_one_rater(tmp_path):
    demo = Demo(DemoSettings(out=str(tmp_path), unlabeled=True, rated_share=1.0, rating_noise=0.0,
                             hostile_raters=0.25))
    demo.users = random.Random(0)  # as the traffic thread sets it
    ratings = [demo._rating(correct=True) for _ in range(2000)]
    hostile = [value for value, user in ratings if int(user.removeprefix("user-")) < 50]  # 50 of the 200 users
    honest = [value for value, user in ratings if int(user.removeprefix("user-")) >= 50]
    assert set(hostile) == {0.0} and set(honest) == {1.0}
    assert len(hostile) / len(ratings) == pytest.approx(0.25, abs=0.04) and len({u for _, u in ratings}) > 150
    assert demo.settings.wrong_ratings == 0.25
    with pytest.raises(InvalidInput, match="hostile-raters"):
        DemoSettings(unlabeled=True, rating_noise=0.2, hostile_raters=0.4)  # 0.52 of the ratings wrong
