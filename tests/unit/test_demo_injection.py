"""When the demo publishes its degraded version (the pure rule of agentflow/demo/injection.py), how a held-out
evaluation counts answers that failed, and what a new run clears."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from agentflow.demo.injection import (ASKS_BACK, INJECTED, Decision, Hold, Snapshot, Step, decide, goal_reached,
                                      injections, observe, stable_far_ahead, success_to_inject)
from agentflow.demo.run import DEMO_MARKER, clear_previous_run
from agentflow.demo.settings import UNTRAINED, DemoSettings
from agentflow.demo.traffic import rating
from agentflow.demo.view import new_state
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


def _state(stable: str = "v000080", promoted: int = 1, heldout_before: float = 0.15) -> dict:
    state = new_state()
    state["summary"].update(heldout_before=heldout_before, promoted=promoted)
    state["versions"]["stable"] = stable
    return state


def _answers(state: dict, version: str, answered: int, correct: int) -> None:
    state["traffic"]["by_version"][version] = {"answered": answered, "correct": correct}


def test_unlabeled_injection_waits_for_a_production_lead_the_ratings_can_show():
    """Wrong ratings (20 %) shrink a gap by 1 - 2 x 0.2: the lead must be 0.3 / 0.6 = 0.5 on production answers."""
    settings, state = DemoSettings(unlabeled=True, rating_noise=0.2), _state()
    state["heldout"].append({"version": "v000080", "kind": "stable", "success": 0.9, "t_s": 1.0})
    _answers(state, UNTRAINED, 1000, 300)  # 0.30
    _answers(state, "v000080", 400, 300)  # 0.75: held-out 0.9 does not count, the production lead is 0.45
    assert not stable_far_ahead(settings, observe(state))
    _answers(state, "v000080", 400, 324)  # 0.81
    assert stable_far_ahead(settings, observe(state))
    _answers(state, "v000080", 399, 399)  # too few answers to tell
    assert not stable_far_ahead(settings, observe(state))
    _answers(state, "v000080", 400, 324)
    state["summary"]["promoted"] = 0  # the stable version is still the untrained one
    assert not stable_far_ahead(settings, observe(state))


def test_labelled_injection_follows_held_out_success():
    settings, state = DemoSettings(), _state(stable="v000040")
    state["heldout"].append({"version": "v000040", "kind": "stable", "success": 0.5, "t_s": 1.0})
    assert not stable_far_ahead(settings, observe(state))  # 0.3 above the untrained planner, below the 0.8 target
    state["heldout"].append({"version": "v000040", "kind": "stable", "success": 0.8, "t_s": 2.0})
    assert stable_far_ahead(settings, observe(state))


def test_the_snapshot_reads_the_verdicts_and_the_latest_evaluation_of_the_state():
    state = _state(stable="v000040")
    state["heldout"] += [{"version": "v000040", "kind": "stable", "success": 0.5, "t_s": 1.0},
                         {"version": "v000050", "kind": "latest", "success": 0.6, "t_s": 2.0},
                         {"version": "v000040", "kind": "stable", "success": 0.7, "t_s": 3.0},
                         {"version": "v000060", "kind": "stable", "success": 0.9, "t_s": 4.0}]
    state["decisions"] += [{"version": "v000030", "action": "rollback"}, {"version": INJECTED, "action": "injected"},
                           {"version": INJECTED, "action": "rollback"}, {"version": "v000035", "action": "reject"}]
    seen = observe(state, trainer_alive=False)
    assert seen == Snapshot(stable="v000040", promoted=True, heldout_before=0.15, stable_heldout=0.7,
                            latest="v000050", latest_success=0.6, rolled_back=("v000030",), trainer_alive=False,
                            injected_verdicts={INJECTED: frozenset({"injected", "rollback"}), ASKS_BACK: frozenset()})
    assert observe(new_state(), trainer_alive=True).latest == ""


LABELLED = DemoSettings(inject_bad_version=True, target=0.7)  # needs max(0.7, 0.15 + 0.3) = 0.7 held-out success
UNLABELED = DemoSettings(inject_bad_version=True, target=0.7, unlabeled=True, rating_noise=0.2)  # 0.29 + 0.5 = 0.79
AHEAD = Snapshot(stable="v000040", promoted=True, heldout_before=0.15, stable_heldout=0.75)  # labelled: 0.75 >= 0.7
HELD = Hold(held_at="v000040", last_held="v000040")
ONE, BOTH = Hold(published=(INJECTED,)), Hold(published=(INJECTED, ASKS_BACK))
READY = frozenset({INJECTED, ASKS_BACK})  # both model folders built


def judged(verdicts: dict, **seen) -> Snapshot:
    return Snapshot(injected_verdicts={k: frozenset(v) for k, v in verdicts.items()}, **seen)
PAUSED = "the trainer is paused until a version is promoted"


@pytest.mark.parametrize("settings, hold, seen, steps, after, message", [
    pytest.param(DemoSettings(), Hold(), AHEAD, (), Hold(), "", id="without --inject-bad-version nothing happens"),
    pytest.param(LABELLED, Hold(), AHEAD, (Step.PAUSE, Step.PUBLISH), Hold(published=(INJECTED,)),
                 "degraded version 'injected-bad'", id="far ahead: pause and publish"),
    pytest.param(LABELLED, HELD, AHEAD, (Step.PUBLISH,), Hold((INJECTED,), "v000040", "v000040"), "degraded version",
                 id="far ahead while held: publish, already paused"),
    pytest.param(LABELLED, Hold(), Snapshot(latest="v000030", latest_success=0.7), (Step.PAUSE,), Hold(
        held_at="v000030", last_held="v000030"), f"v000030 reached 0.70: {PAUSED}", id="newest reaches the need"),
    pytest.param(LABELLED, Hold(), Snapshot(latest="v000030", latest_success=0.69), (), Hold(), "",
                 id="newest below the need"),
    pytest.param(LABELLED, Hold(last_held="v000030"), Snapshot(latest="v000030", latest_success=0.9), (),
                 Hold(last_held="v000030"), "", id="the version held before is not held again"),
    pytest.param(LABELLED, Hold(), Snapshot(stable="v000040", latest="v000040", latest_success=0.9), (), Hold(), "",
                 id="the stable version itself is not held"),
    pytest.param(UNLABELED, Hold(), Snapshot(latest="v000030", latest_success=0.95), (), Hold(), "",
                 id="unlabelled: no hold before the untrained planner's production success is known"),
    pytest.param(UNLABELED, Hold(), Snapshot(latest="v000030", latest_success=0.79, untrained_production=0.29),
                 (Step.PAUSE,), Hold(held_at="v000030", last_held="v000030"), f"v000030 reached 0.79: {PAUSED}",
                 id="unlabelled: the newest reaches the untrained planner's plus 0.3 / 0.6"),
    pytest.param(LABELLED, HELD, Snapshot(rolled_back=("v000041",)), (Step.RESUME,), Hold(last_held="v000040"),
                 "v000040 or a newer version was rolled back: the trainer goes on", id="a newer version rolled back"),
    pytest.param(LABELLED, HELD, Snapshot(rolled_back=("v000039",)), (), HELD, "", id="an older rollback: held"),
    pytest.param(LABELLED, HELD, Snapshot(stable="v000041", promoted=True, stable_heldout=0.6), (Step.RESUME,),
                 Hold(last_held="v000040"), "v000040 or a newer version was promoted (v000041) but not far enough "
                 "ahead to inject: the trainer goes on", id="promoted and measured, not far enough ahead"),
    pytest.param(LABELLED, HELD, Snapshot(stable="v000041", promoted=True), (), HELD, "",
                 id="promoted, not measured yet: held"),
    pytest.param(LABELLED, ONE, AHEAD, (), ONE, "", id="injected, not judged"),
    pytest.param(LABELLED, ONE, judged({INJECTED: {"injected", "rollback"}}, prepared=READY), (Step.PUBLISH,), BOTH,
                 "degraded version 'injected-asks-back'", id="the first judged: the next one, still paused"),
    pytest.param(LABELLED, ONE, judged({INJECTED: {"rollback"}}), (), ONE, "",
                 id="the first judged, the next one not built yet: wait"),
    pytest.param(LABELLED, BOTH, judged({INJECTED: {"rollback"}}), (), BOTH, "", id="the second not judged"),
    pytest.param(LABELLED, BOTH, judged({INJECTED: {"rollback"}, ASKS_BACK: {"rollback"}}), (Step.RESUME,), BOTH,
                 "", id="both judged: the trainer goes on"),
    pytest.param(replace(LABELLED, profile="smol"), ONE, judged({INJECTED: {"reject"}}), (Step.RESUME,), ONE, "",
                 id="smol: only the untrained one, judged: the trainer goes on"),
    pytest.param(LABELLED, BOTH, judged({INJECTED: {"rollback"}, ASKS_BACK: {"promote"}}, trainer_alive=False), (),
                 BOTH, "", id="judged, the trainer gone"),
])
def test_the_injection_rule(settings, hold, seen, steps, after, message):
    decision = decide(settings, hold, seen)
    assert (decision.steps, decision.hold) == (steps, after)
    assert message in decision.message and bool(decision.message) == bool(message)


@pytest.mark.parametrize("settings, seen, reached", [
    (DemoSettings(target=0.7), AHEAD, True),
    (DemoSettings(target=0.8), AHEAD, False),
    (DemoSettings(target=0.7), Snapshot(stable_heldout=0.9), False),  # the untrained planner, not promoted
    (LABELLED, AHEAD, False),  # the degraded version not yet rolled back
    (LABELLED, replace(AHEAD, injected_verdicts={INJECTED: frozenset({"reject"})}), False),  # one of two
    (LABELLED, replace(AHEAD, injected_verdicts={INJECTED: frozenset({"reject"}), ASKS_BACK: frozenset({"rollback"})}),
     True),
    (replace(LABELLED, profile="smol"), replace(AHEAD, injected_verdicts={INJECTED: frozenset({"reject"})}), True),
    (LABELLED, replace(AHEAD, injected_verdicts={INJECTED: frozenset({"reject"}), ASKS_BACK: frozenset({"promote"})}),
     False),
    (DemoSettings(target=0.7, unlabeled=True), Snapshot(promoted=True, stable_heldout=0.6, latest_success=0.7), True),
    (DemoSettings(target=0.7, unlabeled=True), Snapshot(promoted=True, latest_success=0.7), False),  # not measured
    (DemoSettings(target=0.7, unlabeled=True), Snapshot(promoted=False, latest_success=0.9), False),
    (DemoSettings(target=0.7, unlabeled=True), Snapshot(promoted=True, stable_heldout=0.9), False),
])
def test_the_goal(settings, seen, reached):
    assert goal_reached(settings, seen) is reached


def test_the_injection_needs_the_target_and_a_lead_over_the_untrained_planner():
    assert success_to_inject(DemoSettings(target=0.5), Snapshot(heldout_before=0.3)) == pytest.approx(0.6)
    assert success_to_inject(DemoSettings(target=0.7), Snapshot(heldout_before=0.3)) == 0.7
    unlabeled = DemoSettings(target=0.5, unlabeled=True, rating_noise=0.2)
    assert success_to_inject(unlabeled, Snapshot(heldout_before=0.9)) is None
    assert success_to_inject(unlabeled, Snapshot(untrained_production=0.2)) == pytest.approx(0.7)


class Run:
    """The state of a run and the rule's hold, ticked as the demo's watch loop does; the steps taken, in order."""

    def __init__(self, settings: DemoSettings):
        self.settings, self.state, self.hold, self.steps = settings, _state(stable=UNTRAINED, promoted=0), Hold(), []

    def tick(self) -> Decision:
        decision = decide(self.settings, self.hold, observe(self.state, prepared=READY))
        self.hold = decision.hold
        self.steps += decision.steps
        if Step.PUBLISH in decision.steps:
            self.state["decisions"].append({"version": self.hold.published[-1], "action": "injected"})
        return decision


def test_a_hold_at_the_target_ends_when_the_promoted_version_cannot_be_injected_beside():
    """The trainer is paused when a version newer than the stable one reaches the success the injection needs; once
    that version (or a newer one) is promoted and measured but not far enough ahead on production, the trainer goes
    on instead of waiting for ever, and the next hold needs a version newer than the new stable one."""
    run = Run(DemoSettings(unlabeled=True, rating_noise=0.2, inject_bad_version=True, target=0.7))
    state = run.state
    state["heldout"].append({"version": "v000089", "kind": "latest", "success": 0.78, "t_s": 0.5})
    _answers(state, UNTRAINED, 1000, 290)  # 0.29: a version needs 0.29 + 0.3 / 0.6 = 0.79
    run.tick()
    assert run.steps == [] and run.hold.held_at is None
    state["heldout"].append({"version": "v000090", "kind": "latest", "success": 0.8, "t_s": 1.0})
    run.tick()
    assert run.steps == [Step.PAUSE] and run.hold.held_at == "v000090"
    state["summary"]["promoted"] = 1
    state["versions"]["stable"] = "v000092"
    state["decisions"].append({"version": "v000092", "action": "promote"})
    _answers(state, "v000092", 399, 310)
    run.tick()  # promoted, but its production lead is not measured yet: still held
    assert run.steps == [Step.PAUSE] and not run.hold.published
    _answers(state, "v000092", 4839, 3706)  # 0.766: a lead of 0.48, below 0.3 / 0.6
    run.tick()
    assert run.steps == [Step.PAUSE, Step.RESUME] and run.hold.held_at is None
    state["heldout"].append({"version": "v000092", "kind": "latest", "success": 0.8, "t_s": 2.0})
    run.tick()  # the stable version itself: no new hold
    assert run.hold.held_at is None and len(run.steps) == 2
    state["heldout"].append({"version": "v000110", "kind": "latest", "success": 0.85, "t_s": 2.5})
    run.tick()
    assert run.hold.held_at == "v000110" and run.steps[-1] == Step.PAUSE
    state["decisions"].append({"version": "v000110", "action": "rollback"})
    run.tick()  # it lost its canary: the trainer goes on, and v000110 is not held again
    run.tick()
    assert run.hold.held_at is None and run.steps[-2:] == [Step.PAUSE, Step.RESUME]
    state["heldout"].append({"version": "v000120", "kind": "latest", "success": 0.9, "t_s": 3.0})
    run.tick()
    assert run.hold.held_at == "v000120" and run.steps[-1] == Step.PAUSE
    state["versions"]["stable"] = "v000121"
    state["decisions"].append({"version": "v000121", "action": "promote"})
    _answers(state, "v000121", 400, 360)  # 0.90: a lead of 0.61
    decision = run.tick()
    assert run.hold.published == (INJECTED,) and decision.steps == (Step.PUBLISH,)  # still paused until judged
    run.tick()
    assert run.steps[-1] == Step.PUBLISH
    state["decisions"].append({"version": INJECTED, "action": "rollback"})
    run.tick()  # the next one, the trainer still paused
    assert run.hold.published == (INJECTED, ASKS_BACK) and run.steps[-2:] == [Step.PUBLISH, Step.PUBLISH]
    assert not goal_reached(run.settings, observe(state))
    state["decisions"].append({"version": ASKS_BACK, "action": "rollback"})
    run.tick()
    assert run.steps[-1] == Step.RESUME and not goal_reached(run.settings, observe(state))  # v000121 not measured
    state["heldout"].append({"version": "v000121", "kind": "stable", "success": 0.88, "t_s": 4.0})
    assert goal_reached(run.settings, observe(state))  # and the newest has 0.9


def test_which_degraded_versions_a_run_publishes():
    assert injections(DemoSettings()) == ()
    assert injections(LABELLED) == (INJECTED, ASKS_BACK)
    assert injections(replace(LABELLED, profile="smol")) == (INJECTED,)  # its planner writes whole decisions


def test_a_run_clears_only_the_artefacts_of_a_previous_demo_and_refuses_a_folder_no_demo_wrote(tmp_path):
    (tmp_path / "models" / "v000073").mkdir(parents=True)  # another run's checkpoint (a LoRA one stopped a trainer)
    (tmp_path / "trainer-metrics.jsonl").write_text("{}\n")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(InvalidInput, match="holds models, trainer-metrics.jsonl that no demo wrote"):
        clear_previous_run(tmp_path, print)
    assert (tmp_path / "models" / "v000073").is_dir()  # refused: nothing removed

    (tmp_path / DEMO_MARKER).write_text("")
    removed = []
    clear_previous_run(tmp_path, removed.append)
    assert removed == [f"removed the previous run's models, trainer-metrics.jsonl in {tmp_path}"]
    assert not (tmp_path / "models").exists() and not (tmp_path / "trainer-metrics.jsonl").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / DEMO_MARKER).is_file()


def test_hostile_raters_rate_every_answer_the_wrong_way_and_each_user_is_one_rater():
    settings = DemoSettings(unlabeled=True, rated_share=1.0, rating_noise=0.0, hostile_raters=0.25)
    users = random.Random(0)
    ratings = [rating(users, settings, correct=True) for _ in range(2000)]
    hostile = [value for value, user in ratings if int(user.removeprefix("user-")) < 50]  # 50 of the 200 users
    honest = [value for value, user in ratings if int(user.removeprefix("user-")) >= 50]
    assert set(hostile) == {0.0} and set(honest) == {1.0}
    assert len(hostile) / len(ratings) == pytest.approx(0.25, abs=0.04) and len({u for _, u in ratings}) > 150
    assert settings.wrong_ratings == 0.25
    with pytest.raises(InvalidInput, match="hostile-raters"):
        DemoSettings(unlabeled=True, rating_noise=0.2, hostile_raters=0.4)  # 0.52 of the ratings wrong
