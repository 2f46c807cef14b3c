"""When `agentflow demo --inject-bad-version` publishes its degraded versions, and when the demo's goal is reached:
pure functions of a ``Snapshot`` of the run (``observe``) and the rule's own ``Hold``.

Once the newest evaluated version, newer than the stable one and than any held before, reaches the success the
injection needs (``success_to_inject``; held-out success, which for a trained version is close to its production
success), the trainer is paused: the controller then canaries and promotes that version, not a newer equal one that
would time out first. Once the stable version is far enough ahead (``stable_far_ahead``), the degraded versions
(``injections``) are published one at a time, each once the one before is judged and its model folder is built
(``Snapshot.prepared``), and the trainer resumes once the last is judged:

* ``injected-bad``, the untrained planner: worse on reward, rolled back by the reward test;
* ``injected-asks-back`` (the tiny profile), the stable planner made to ask the user back on a third of the
  queries (agentflow/demo/asks_back.py): rolled back by the ``refusal_rate`` tripwire.

The hold ends without an injection when the held version, or a newer one, is rolled back, or is promoted and
measured yet not far enough ahead: the trainer goes on, towards a better version (a hold that waited for a lead it
could not get stopped learning for good: a run held at v000092 for 15 minutes with a production lead of 0.48
against the 0.5 needed).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from agentflow.demo.settings import UNTRAINED, DemoSettings

INJECTED = "injected-bad"  # the untrained planner, published again by --inject-bad-version
ASKS_BACK = "injected-asks-back"  # the stable planner made to ask back (agentflow/demo/asks_back.py)
JUDGED = frozenset({"rollback", "reject", "promote"})  # the controller's last word on a version
REFUSED = frozenset({"rollback", "reject"})
INJECT_GAP = 0.3  # held-out success above the untrained planner's at which it is published (twice the reward margin)
MIN_PRODUCTION_ANSWERS = 400  # --unlabeled: answers of a version before its production success counts (±0.02)


@dataclass(frozen=True)
class Snapshot:
    """What the rules read of the run."""

    stable: str = UNTRAINED  # the version the controller serves as stable
    promoted: bool = False  # at least one version was promoted
    heldout_before: float = 0.0  # the untrained planner's held-out success
    stable_heldout: float | None = None  # the stable version's latest held-out success
    latest: str = ""  # the newest evaluated trained version ("" before the first evaluation)
    latest_success: float = 0.0  # its held-out success
    untrained_production: float | None = None  # production success (``production_success``) of UNTRAINED
    stable_production: float | None = None  # and of the stable version
    injected_verdicts: dict[str, frozenset[str]] = field(default_factory=dict)  # the controller's actions on each
    rolled_back: tuple[str, ...] = ()  # trained versions whose canary was rolled back
    trainer_alive: bool = True
    prepared: frozenset[str] = frozenset({INJECTED})  # the degraded versions whose model folder is ready


@dataclass(frozen=True)
class Hold:
    """The injection rule's own state."""

    published: tuple[str, ...] = ()  # the degraded versions published so far, in order
    held_at: str | None = None  # the good version the trainer is paused for
    last_held: str = ""  # the last version it was paused for: a hold needs a newer one


class Step(enum.Enum):
    PAUSE = "pause"  # SIGSTOP the trainer
    PUBLISH = "publish"  # publish the next degraded version (``Hold.published[-1]``)
    RESUME = "resume"  # SIGCONT the trainer


@dataclass(frozen=True)
class Decision:
    hold: Hold
    steps: tuple[Step, ...] = ()
    message: str = ""  # a progress line ("" for none)


def injections(settings: DemoSettings) -> tuple[str, ...]:
    """The degraded versions the run publishes, in order: none without --inject-bad-version; the asks-back one only
    with the tiny profile, whose planner chooses tools (the smol planner writes whole decisions)."""
    if not settings.inject_bad_version:
        return ()
    return (INJECTED, ASKS_BACK) if settings.profile == "tiny" else (INJECTED,)


def decide(settings: DemoSettings, hold: Hold, seen: Snapshot) -> Decision:
    """What to do on one tick of the run (the module docstring)."""
    planned = injections(settings)
    if not planned:
        return Decision(hold)
    if hold.published:
        if not seen.injected_verdicts.get(hold.published[-1], frozenset()) & JUDGED:
            return Decision(hold)
        if len(hold.published) < len(planned):
            following = planned[len(hold.published)]
            return _publish(hold, following, (Step.PUBLISH,)) if following in seen.prepared else Decision(hold)
        return Decision(hold, (Step.RESUME,)) if seen.trainer_alive else Decision(hold)
    if stable_far_ahead(settings, seen):
        return _publish(hold, planned[0], (Step.PAUSE, Step.PUBLISH) if hold.held_at is None else (Step.PUBLISH,))
    if hold.held_at is None:
        return _maybe_hold(settings, hold, seen)
    lost = any(version >= hold.held_at for version in seen.rolled_back)  # the held version, or a newer one
    if lost or (seen.stable >= hold.held_at and stable_measure(settings, seen) is not None):
        outcome = "rolled back" if lost else f"promoted ({seen.stable}) but not far enough ahead to inject"
        return Decision(replace(hold, held_at=None), (Step.RESUME,),
                        f"{hold.held_at} or a newer version was {outcome}: the trainer goes on")
    return Decision(hold)


def _publish(hold: Hold, name: str, steps: tuple[Step, ...]) -> Decision:
    return Decision(replace(hold, published=(*hold.published, name)), steps,
                    f"published the degraded version {name!r}; the trainer is paused until it is judged")


def _maybe_hold(settings: DemoSettings, hold: Hold, seen: Snapshot) -> Decision:
    """Pause the trainer for the newest evaluated version once it reaches the success the injection needs."""
    needed = success_to_inject(settings, seen)
    if needed is None or seen.latest_success < needed or seen.latest <= max(seen.stable, hold.last_held):
        return Decision(hold)
    return Decision(replace(hold, held_at=seen.latest, last_held=seen.latest), (Step.PAUSE,),
                    f"{seen.latest} reached {needed:.2f}: the trainer is paused until a version is promoted")


def goal_reached(settings: DemoSettings, seen: Snapshot) -> bool:
    """The run may stop: a promoted version reached the target (``--unlabeled``: a promoted version was measured and
    the newest reached it) and, with --inject-bad-version, every degraded one was rolled back (or rejected)."""
    injected_done = all(seen.injected_verdicts.get(name, frozenset()) & REFUSED for name in injections(settings))
    if settings.unlabeled:  # on feedback a later, slightly better version rarely proves itself in a step
        measured = seen.stable_heldout is not None  # so the report says what the promoted version reached
        return injected_done and seen.promoted and measured and seen.latest_success >= settings.target
    return injected_done and stable_is_good(settings, seen)


def stable_success(seen: Snapshot) -> float | None:
    """The latest held-out success of the stable version, once a promoted version serves as stable."""
    return seen.stable_heldout if seen.promoted else None


def stable_is_good(settings: DemoSettings, seen: Snapshot) -> bool:
    """A promoted version serves as stable and its latest held-out success reaches the target."""
    success = stable_success(seen)
    return success is not None and success >= settings.target


def stable_measure(settings: DemoSettings, seen: Snapshot) -> float | None:
    """The promoted stable version's success where its lead is judged: labelled, its latest held-out success;
    ``--unlabeled``, its share of right production answers (None until it is promoted and measured)."""
    if not settings.unlabeled:
        return stable_success(seen)
    return seen.stable_production if seen.promoted else None


def success_to_inject(settings: DemoSettings, seen: Snapshot) -> float | None:
    """The success a stable version needs before the degraded one is published beside it: the target, and the
    untrained planner's plus INJECT_GAP (0.3 alone left a 0.5 version's comparison undecided after 120 s).
    ``--unlabeled``: the untrained planner's production success plus INJECT_GAP / (1 - 2 x rating noise), since
    wrong ratings shrink a gap by that factor (as the margin); None until that is measured."""
    if not settings.unlabeled:
        return max(settings.target, seen.heldout_before + INJECT_GAP)
    if seen.untrained_production is None:
        return None
    return max(settings.target, seen.untrained_production + INJECT_GAP / (1 - 2 * settings.wrong_ratings))


def stable_far_ahead(settings: DemoSettings, seen: Snapshot) -> bool:
    """The promoted stable version is far enough ahead of the untrained planner (``success_to_inject``) for the
    degraded version (the untrained one) to be proven worse within a canary step."""
    now, needed = stable_measure(settings, seen), success_to_inject(settings, seen)
    return now is not None and needed is not None and now >= needed


def production_success(by_version: dict, version: str) -> float | None:
    """The share of ``version``'s production answers that were right (None below MIN_PRODUCTION_ANSWERS)."""
    mine = by_version.get(version, {"answered": 0})
    return mine["correct"] / mine["answered"] if mine["answered"] >= MIN_PRODUCTION_ANSWERS else None


def observe(state: dict, *, trainer_alive: bool = True, prepared: frozenset[str] = frozenset({INJECTED})) -> Snapshot:
    """The snapshot of a run's state dict (agentflow/demo/view.py's contract), and what the run knows beside it;
    the caller holds the state's lock."""
    stable, by_version, decisions = state["versions"]["stable"], state["traffic"]["by_version"], state["decisions"]
    stable_evals = [h["success"] for h in state["heldout"] if h.get("kind") == "stable" and h["version"] == stable]
    latest = next((h for h in reversed(state["heldout"]) if h.get("kind") == "latest"), {})
    return Snapshot(stable=stable, promoted=state["summary"]["promoted"] >= 1,
                    heldout_before=state["summary"]["heldout_before"] or 0.0,
                    stable_heldout=stable_evals[-1] if stable_evals else None,
                    latest=latest.get("version", ""), latest_success=latest.get("success", 0),
                    untrained_production=production_success(by_version, UNTRAINED),
                    stable_production=production_success(by_version, stable),
                    injected_verdicts={name: frozenset(d["action"] for d in decisions if d["version"] == name)
                                       for name in (INJECTED, ASKS_BACK)},
                    rolled_back=tuple(d["version"] for d in decisions
                                      if d["action"] == "rollback" and d["version"].startswith("v")),
                    trainer_alive=trainer_alive, prepared=prepared)
