"""The state every thread of `agentflow demo` writes: one dict, the contract of agentflow/demo/view.py (the dashboard
and the report), behind one lock."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from agentflow.demo.settings import UNTRAINED, DemoSettings


class Shared:
    """The run's state dict and its lock: ``with shared as state:`` reads or writes it."""

    def __init__(self, state: dict):
        self.state = state
        self.lock = threading.Lock()
        self.started = time.monotonic()

    def __enter__(self) -> dict:
        self.lock.acquire()
        return self.state

    def __exit__(self, *exc) -> None:
        self.lock.release()

    def set(self, **values) -> None:
        with self as state:
            state.update(values)

    def t_s(self) -> float:
        """Seconds since the run started, as the state's ``t_s`` fields give them."""
        return round(time.monotonic() - self.started, 1)


def initial_state(settings: DemoSettings, out: Path) -> dict:
    from agentflow.demo.view import new_state

    otlp = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    state = new_state(duration_s=settings.duration_s, profile=settings.profile,
                      inject_bad_version=settings.inject_bad_version, unlabeled=settings.unlabeled,
                      feedback={"sent": 0, "failed": 0, "wrong": 0, "replayed": 0, "opted_out_replayed": 0,
                                "rated_share": settings.rated_share, "rating_noise": settings.rating_noise,
                                "hostile_raters": settings.hostile_raters},
                      trace_file="" if otlp else str(out / "traces"), otlp_endpoint=otlp, out_dir=str(out))
    state["versions"]["stable"] = UNTRAINED
    return state


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))], 3)


def shares(counts: dict) -> dict:
    total = sum(counts.values()) or 1
    return {k: round(v / total, 3) for k, v in counts.items()}
