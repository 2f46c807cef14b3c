"""Held-out success in `agentflow demo`: of the untrained planner before training, then of each new stable version
and, every ``eval_every_s``, of the newest trained one."""

from __future__ import annotations

import threading
import time

from agentflow.demo.settings import MAX_STEPS, UNTRAINED, DemoSettings
from agentflow.demo.shared import Shared


class Evaluations:
    """Evaluates ``heldout`` (``Item``s) through the gateway ``before_training`` gives it; results into ``shared``,
    the first tools of the untrained and the newest stable version into ``first_tools``."""

    def __init__(self, settings: DemoSettings, shared: Shared, heldout: list, stop: threading.Event, progress):
        self.settings, self.shared, self.heldout, self.stop, self.progress = settings, shared, heldout, stop, progress
        self.gateway = None
        self.first_tools: dict[str, dict[str, int]] = {"before": {}, "after": {}}

    def before_training(self, gateway) -> None:
        """Held-out success and tool use of the untrained planner."""
        from agentflow.trainer.drive import evaluate

        self.gateway = gateway
        result = evaluate(gateway, self.heldout, max_steps=MAX_STEPS, planner_version=UNTRAINED)
        self.first_tools["before"] = result["tool_sequences"]
        self._add(result["success"], UNTRAINED, "stable")
        with self.shared as state:
            state["summary"]["heldout_before"] = result["success"]

    def run(self) -> None:
        """Held-out success of the newest trained version every ``eval_every_s``, and of each new stable version."""
        from agentflow.trainer.drive import evaluate

        last_latest, last_stable = 0.0, UNTRAINED
        while not self.stop.wait(2.0):
            with self.shared as state:
                stable, latest = state["versions"]["stable"], state["versions"]["latest_trained"]
            if stable != last_stable:
                result = evaluate(self.gateway, self.heldout, max_steps=MAX_STEPS, planner_version=stable)
                if self.stop.is_set():
                    return  # cut short by the stop: not a measurement
                self._add(result["success"], stable, "stable")
                self.first_tools["after"] = result["tool_sequences"]
                last_stable = stable
            elif latest and time.monotonic() - last_latest >= self.settings.eval_every_s:
                result = evaluate(self.gateway, self.heldout, max_steps=MAX_STEPS, planner_version=latest)
                if self.stop.is_set():
                    return
                if result["failed"] < len(self.heldout):  # an unloaded version answers 404s: not a measurement
                    self._add(result["success"], latest, "latest")
                last_latest = time.monotonic()

    def _add(self, success: float, version: str, kind: str) -> None:
        self.progress(f"held-out success of {version} ({kind}): {success:.2f}")
        with self.shared as state:
            state["heldout"].append({"t_s": self.shared.t_s(), "success": success, "version": version, "kind": kind})
