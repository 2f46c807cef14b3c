"""When the demo publishes its degraded version, and how a held-out evaluation counts answers that failed."""

from __future__ import annotations

from agentflow.demo.run import UNTRAINED, Demo, DemoSettings
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
