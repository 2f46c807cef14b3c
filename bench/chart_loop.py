"""Does a shipped profile close the loop as installed? Runs the chart's rendered workloads as local processes
(agentflow/chart_run.py), sends production traffic without ground truth through the gateway, simulated users rating a
share of the answers (some wrongly), and reads the trainer's, the driver's and the rollout controller's own metrics.
Prints one JSON object: trainer steps by outcome and groups dropped by reason, the controller's decisions, driver
rollouts sent and failed by error, production queries answered and failed, ratings sent (held-out success is the
demo's measure, not this one's).

    .venv/bin/python bench/chart_loop.py --minutes 30 [--profile cpu-train|gpu] [--rated-share 0.5] [--out DIR]

Stops early once the trainer stepped --min-steps times and a trained version was promoted. Everything it started stops
with it (Ctrl-C, SIGTERM, an error).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: shipped profiles that run a trainer, as installed (values files under charts/agentflow/), and the overlay each
#: runs with on CPUs (charts/agentflow/ci/: model size, resources, replicas, storage, endpoints; tests/deploy/
#: test_chart_overlays.py)
PROFILES = {"cpu-train": ["values-dev-cpu.yaml", "values-cpu-train.yaml"],
            "gpu": ["values-gpu.yaml", "ci/gpu-on-cpu.yaml"]}


def by_label(samples: dict, name: str, label: str) -> dict[str, float]:
    return {dict(labels).get(label, ""): value for (sample, labels), value in samples.items() if sample == name}


class Loop:
    """A rendered profile running with production traffic; ``observe()`` reads where the loop stands."""

    def __init__(self, profile: str, out: Path, *, rated_share: float = 0.5, rating_noise: float = 0.2,
                 traffic_qps: float = 3.0, seed: int = 0, progress=print):
        from agentflow.chart import CHART
        from agentflow.chart_run import RenderedRun

        from agentflow.services.gateway.keys import new_key

        self.out, self.progress = out, progress
        # the operator's Secrets: the gateway's keys, the driver's (solve, train), and the users' (who rate as
        # themselves: delegate); profiles without gateway keys ignore them
        driver_key, driver_entry = new_key("driver", ["solve", "train"])
        self.users_key, users_entry = new_key("users", ["solve", "feedback", "delegate"])
        secrets_given = {"agentflow-gateway-api-keys": {"api-keys": f"{driver_entry},{users_entry}"},
                         "agentflow-driver-api-key": {"api-key": driver_key}}
        self.run = RenderedRun([CHART / f for f in PROFILES[profile]], {}, out, progress, secrets_given)
        self.traffic_settings = dict(rated_share=rated_share, rating_noise=rating_noise, traffic_qps=traffic_qps,
                                     seed=seed)
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.shared = None

    def start(self) -> Loop:
        from agentflow.demo.settings import DemoSettings
        from agentflow.demo.shared import Shared, initial_state
        from agentflow.demo.traffic import Traffic
        from agentflow.envs.synthetic import EnvConfig, SyntheticEnv
        from agentflow.trainer.drive import Item
        from agentflow.trainer.gateway_client import Gateway

        self.run.start()
        settings = DemoSettings(unlabeled=True, out=str(self.out), **self.traffic_settings)
        env = SyntheticEnv(EnvConfig(seed=settings.seed))
        production = [Item(t.query, t.answer, t.id) for t in env.train[:90]]
        self.shared = Shared(initial_state(settings, self.out))
        keyed = "AGENTFLOW_GATEWAY_API_KEYS" in self.run.env(self.name("gateway"))
        gateway = Gateway(self.run.address(self.name("gateway"), 50051), api_key=self.users_key if keyed else "")
        traffic = Traffic(settings, self.shared, gateway, production, set(), self.stop_event)
        self.thread = threading.Thread(target=traffic.run, name="traffic", daemon=True)
        self.thread.start()
        return self

    def name(self, component: str) -> str:
        return next(n for n, w in self.run.workloads.items() if w.component == component)

    def observe(self) -> dict:
        from agentflow.status import scrape

        self.run.check()
        trainer = scrape(self.run.address(self.name("trainer"), 9090))
        driver = scrape(self.run.address(self.name("driver"), 9090))
        rollout = scrape(self.run.address(self.name("rollout"), 9090))
        with self.shared as state:
            traffic = {k: state["traffic"][k] for k in ("sent", "answered", "failed")}
            feedback = dict(state["feedback"])
        return {"trainer_steps": by_label(trainer, "agentflow_trainer_steps_total", "outcome"),
                "trainer_dropped": by_label(trainer, "agentflow_trainer_dropped_total", "reason"),
                "decisions": by_label(rollout, "agentflow_rollout_decisions_total", "action"),
                "driver_sent": sum(by_label(driver, "agentflow_drive_rollouts_sent_total", "").values()),
                "driver_failed": by_label(driver, "agentflow_drive_rollouts_failed_total", "error"),
                "production": traffic, "feedback": feedback}

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(90)
        self.run.stop()

    def __enter__(self) -> Loop:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def closed(seen: dict, min_steps: int) -> bool:
    """The loop closed: the trainer stepped min_steps times and the controller promoted a version."""
    return seen["trainer_steps"].get("trained", 0) >= min_steps and seen["decisions"].get("promote", 0) >= 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=list(PROFILES), default="cpu-train")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--min-steps", type=int, default=20)
    parser.add_argument("--rated-share", type=float, default=0.5)
    parser.add_argument("--rating-noise", type=float, default=0.2)
    parser.add_argument("--traffic-qps", type=float, default=3.0)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop everything through the finally below
    out = Path(args.out or tempfile.mkdtemp(prefix="chart-loop-"))
    t0 = time.monotonic()
    with Loop(args.profile, out, rated_share=args.rated_share, rating_noise=args.rating_noise,
              traffic_qps=args.traffic_qps, progress=lambda line: print(line, file=sys.stderr)) as loop:
        seen = loop.observe()
        while time.monotonic() - t0 < args.minutes * 60 and not closed(seen, args.min_steps):
            time.sleep(15)
            seen = loop.observe()
            print(json.dumps({"t_s": round(time.monotonic() - t0), **seen}), file=sys.stderr)
    print(json.dumps({"profile": args.profile, "wall_s": round(time.monotonic() - t0, 1),
                      "closed": closed(seen, args.min_steps), **seen, "out": str(out)}))


if __name__ == "__main__":
    main()
