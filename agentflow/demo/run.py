"""`agentflow demo`: the whole loop on one machine — serving, online retraining and canaries — while you watch.

Processes (the same ones `agentflow up` starts, plus the training loop and the rollout controller):

    tansu · serve-llm (local: --follow-versions load, every trained version is loaded; separate, lora: the rollout
      fleet, holding the newest versions; pinned calls go here)
    · the six services (profile tiny-deterministic on the synthetic environment, or llm with SmolLM2; the planner
      follows the controller's routing table, so each trajectory stays on one version)
    · agentflow train · agentflow drive (rollouts pinned to the latest version) · agentflow rollout
    · with ``--serving separate``: two more serve-llm processes, one full-weight version each (backend separate)
    · with ``--serving lora``: one more serve-llm, the base model with the versions as LoRA adapters (backend lora)

``--serving``: ``local`` (one server holds every version, the table names it by model name), ``separate`` (each
version on its own server process, the shape of KServe's pair mode) or ``lora`` (the trainer exports LoRA adapters,
loaded into one server through vLLM's runtime LoRA routes, the shape of vLLM with adapters). Pinned calls (the
training rollouts on ``latest``, the evaluations) go to the first server in every mode: with ``separate`` and
``lora`` it is the rollout fleet (``agentflow.rollout.fleet``), which the controller loads with the newest versions
as they are published and which production traffic never reaches. The report gives the publication-to-first-rollout
lag and the trained turns by staleness.

``--unlabeled``: production traffic without ground truth (queries of the environment's train split; a fixed share
of query texts opts out of training). Simulated users rate a share of the answers through ``Feedback``, a stated
share of those ratings wrong; the trainer's groups are replays of that traffic (``drive --from-traffic``) rewarded
by the feedback ledger and the group vote, and the controller compares versions on the feedback reward. Held-out
success is still measured against ground truth (docs/demo.md).

This process sends "production" queries (the environment's held-out tasks, with ground truth so that the memory
service scores them and the controller can compare versions), evaluates held-out success of the stable and the
newest version, follows the trainer's metrics and the controller's decisions, draws the dashboard
(``agentflow.demo.view``) and at the end writes the report (``agentflow.demo.report``). It stops at ``--duration``,
or earlier once the stable version's held-out success reaches ``--target`` after at least one promotion
(``--unlabeled``: the newest trained version's, once a promoted version is measured) and, with ``--inject-bad-version``,
after that version was rolled back.
Ctrl-C stops everything and still writes the report.

The parts: ``Demo`` here runs the others; ``cli`` (the flags and the command), ``settings`` (``DemoSettings``, the
profiles), ``processes`` (starting and stopping every process), ``traffic`` (production queries, simulated users),
``evaluations`` (held-out success), ``followers`` (the controller's decisions, the trainer's metrics, the training
queries), ``injection`` (when the degraded version is published: a pure rule), ``shared`` (the state every thread
writes, under one lock), ``view`` (the dashboard) and ``report`` (the report).
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import threading
import time
from functools import partial
from pathlib import Path

from agentflow.demo.evaluations import Evaluations
from agentflow.demo.followers import follow_decisions, follow_trainer, follow_training_queries
from agentflow.demo.injection import ASKS_BACK, INJECTED, Hold, Step, decide, goal_reached, injections, observe
from agentflow.demo.processes import Processes
from agentflow.demo.settings import DEFAULT_OUT, MAX_STEPS, TRAFFIC_QUERIES, UNTRAINED, DemoSettings
from agentflow.demo.shared import Shared, initial_state, shares
from agentflow.demo.traffic import Traffic
from agentflow.errors import InvalidInput

# what a run writes in --out; the next run removes them first
RUN_ARTEFACTS = ("models", "base", "logs", "traces", "trainer-metrics.jsonl", "report.html", "report.json",
                 "reward_curves.png", "reward_curves.svg")
DEMO_MARKER = ".agentflow-demo"


class Demo:
    def __init__(self, settings: DemoSettings):
        from agentflow.envs.synthetic import EnvConfig, SyntheticEnv
        from agentflow.trainer.drive import Item

        self.settings = settings
        self.out = Path(settings.out).resolve()
        self.env = SyntheticEnv(EnvConfig(seed=settings.seed))
        self.heldout = [Item(t.query, t.answer, t.id) for t in self.env.heldout]
        # the production queries: held-out tasks with their answers, or (--unlabeled) train-split tasks whose answers
        # only the simulated users know; a fixed share of those query texts opts out of training
        self.production = ([Item(t.query, t.answer, t.id) for t in self.env.train[:TRAFFIC_QUERIES]]
                           if settings.unlabeled else self.heldout)
        rng = random.Random(settings.seed + 1)
        self.private = ({i.query for i in self.production if rng.random() < settings.opt_out_share}
                        if settings.unlabeled else set())
        self.shared = Shared(initial_state(settings, self.out))
        self.stop_event = threading.Event()
        self.processes = Processes(settings, self.out, self._progress)
        self.evaluations = Evaluations(settings, self.shared, self.heldout, self.stop_event, self._progress)
        self.hold = Hold()  # the injection rule's state (agentflow/demo/injection.py)
        self.gateway = None

    @property
    def state(self) -> dict:
        """The state dict (agentflow/demo/view.py's contract); read or write it under ``with self.shared``."""
        return self.shared.state

    # --- the run ---------------------------------------------------------------------------------------------------
    def run(self) -> dict:
        clear_previous_run(self.out, self._progress)
        threads = []
        try:
            self._start()
            self.shared.set(phase="training")
            for name, target in self._workers().items():
                thread = threading.Thread(target=target, daemon=True, name=name)
                thread.start()
                threads.append(thread)
            self._watch()
        except KeyboardInterrupt:
            self.shared.set(phase="interrupted")
        finally:
            self.stop_event.set()
            for thread in threads:  # the production queries in flight finish; an evaluation under way is dropped
                thread.join(timeout=30 if thread.name == "traffic" else 2)
            self.processes.stop()
            if self.state["phase"] != "interrupted":
                self.shared.set(phase="done")
            self._finish_summary()
        from agentflow.demo.report import write_report

        return write_report(self.state, self.out)

    def _start(self) -> None:
        """The ring, the trainer and the controller; the untrained planner's held-out success; then the driver."""
        from agentflow.trainer.gateway_client import Gateway

        self.processes.start_ring()
        self.gateway = Gateway(self.processes.cluster.endpoint("gateway"))
        self.evaluations.before_training(self.gateway)
        self.processes.start_driver()

    def _workers(self) -> dict:
        """The threads beside the watch loop, by name."""
        bootstrap, shared, stop = self.processes.cluster.bootstrap, self.shared, self.stop_event
        workers = {"traffic": Traffic(self.settings, shared, self.gateway, self.production, self.private, stop).run,
                   "evaluations": self.evaluations.run,
                   "decisions": partial(follow_decisions, bootstrap, shared, stop, self._progress),
                   "trainer": partial(follow_trainer, self.out / "trainer-metrics.jsonl", shared, stop)}
        if self.settings.unlabeled:
            workers["training-queries"] = partial(follow_training_queries, bootstrap, shared, self.private, stop)
        return workers

    def _watch(self) -> None:
        """Until the duration, the goal or Ctrl-C (SIGINT, SIGTERM): refresh the dashboard, inject the bad version,
        check the processes.

        From here on the signals only set ``stop_event`` (``on_stop_signal``, as in the services), and the loop raises
        KeyboardInterrupt itself at a safe point: raised by the default handler between any two bytecodes, it could
        land right after the state's lock was taken and before the ``with`` block that releases it, and the stop then
        waited for that lock forever (seen in CI: a Ctrl-C that stopped nothing). A second signal changes nothing.
        """
        from rich.live import Live

        from agentflow.demo.view import render_dashboard
        from agentflow.services.runtime import on_stop_signal

        on_stop_signal(self.stop_event.set)
        deadline = self.shared.started + self.settings.duration_s
        live = Live(render_dashboard(self.state), refresh_per_second=2, screen=False) if self.settings.dashboard \
            else None
        with (live or _Null()):
            while time.monotonic() < deadline and not self._goal_reached():
                if self.stop_event.wait(0.5):
                    raise KeyboardInterrupt
                self.shared.set(elapsed_s=self.shared.t_s())
                self._maybe_inject()
                self.processes.check()
                if live:
                    with self.shared as state:
                        live.update(render_dashboard(state))
        self.shared.set(phase="finishing")

    def _goal_reached(self) -> bool:
        with self.shared as state:
            return goal_reached(self.settings, observe(state))

    # --- the injected bad version (agentflow/demo/injection.py) ----------------------------------------------------
    def _maybe_inject(self) -> None:
        """One tick of the injection rule: pause or resume the trainer, publish the degraded version."""
        trainer_alive, prepared = self.processes.trainer_alive(), self._prepared()
        with self.shared as state:
            seen = observe(state, trainer_alive=trainer_alive, prepared=prepared)
        decision = decide(self.settings, self.hold, seen)
        self.hold = decision.hold
        for step in decision.steps:
            if step is Step.PUBLISH:
                self._publish_bad_version(self.hold.published[-1])
            else:
                self.processes.signal_trainer(signal.SIGSTOP if step is Step.PAUSE else signal.SIGCONT)
        if decision.message:
            self._progress(decision.message)

    def _publish_bad_version(self, name: str) -> None:
        from agentflow.bus import topics
        from agentflow.bus.clients import Publisher
        from agentflow.bus.codec import new_envelope
        from agentflow.bus.config import BusConfig
        from agentflow.proto.v1 import events_pb2

        folder, reason, evidence = (self._asks_back_version() if name == ASKS_BACK else
                                    (self._checkpoint(UNTRAINED), "the untrained planner as a new version", {}))
        event = events_pb2.PlannerVersion(version=name, checkpoint_uri=str(folder))
        with Publisher(BusConfig(bootstrap_servers=self.processes.cluster.bootstrap)) as publisher:
            publisher.publish(topics.PLANNER_VERSIONS, new_envelope("planner", 0, event))
            publisher.flush(10)
        with self.shared as state:
            state["decisions"].append({"t_s": self.shared.t_s(), "version": name, "action": "injected",
                                       "percent": 0, "reason": f"--inject-bad-version: {reason}",
                                       "evidence": {"checkpoint_uri": str(folder), **evidence}})
        if name == INJECTED and ASKS_BACK in injections(self.settings):
            self._build_asks_back()

    def _checkpoint(self, version: str) -> Path:
        from agentflow.trainer.checkpoint import ModelStore

        return ModelStore(self.out / "models").get(int(version.removeprefix("v"))).path

    def _build_asks_back(self) -> None:
        """Start building the asks-back version from the stable planner (agentflow/demo/asks_back.py), in a process
        of its own, while the first degraded version is canaried; saved beside the versions in the model store (not
        one of them: the trainer numbers those)."""
        with self.shared as state:
            stable = state["versions"]["stable"]
        self.processes.start_job("asks-back", ["agentflow.demo.asks_back", "--stable", str(self._checkpoint(stable)),
                                               "--out", str(self.out / "models" / ASKS_BACK),
                                               "--seed", str(self.settings.seed), "--max-steps", str(MAX_STEPS)])

    def _prepared(self) -> frozenset[str]:
        """The degraded versions ready to publish: the untrained planner, and the asks-back one once built. Raises
        RuntimeError if its build failed."""
        build = self.processes.jobs.get("asks-back")
        if build is None or build.poll() is None:
            return frozenset({INJECTED})
        if build.returncode != 0:
            raise RuntimeError(f"building {ASKS_BACK} exited with {build.returncode}; see {self.out / 'logs'}")
        return frozenset({INJECTED, ASKS_BACK})

    def _asks_back_version(self) -> tuple[Path, str, dict]:
        from agentflow.versions import CHECKPOINT_METADATA

        folder = self.out / "models" / ASKS_BACK
        built = json.loads((folder / CHECKPOINT_METADATA).read_text())
        return folder, f"the stable planner {built['parent']} made to ask the user back about towns", built["metrics"]

    # --- the end --------------------------------------------------------------------------------------------------
    def _finish_summary(self) -> None:
        first_tools = self.evaluations.first_tools
        with self.shared as s:
            stable = s["versions"]["stable"]
            mine = [h for h in s["heldout"] if h.get("kind") == "stable" and h["version"] == stable]
            s["summary"].update(heldout_after=mine[-1]["success"] if mine else None,
                                failed_production_queries=s["traffic"]["failed"], wall_s=self.shared.t_s())
            s["tool_use"] = {"before": shares(first_tools["before"]), "after": shares(first_tools["after"])}
            s["elapsed_s"] = s["summary"]["wall_s"]

    def _progress(self, message: str) -> None:
        if not self.settings.dashboard:
            print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def clear_previous_run(out: Path, progress) -> None:
    """Every run starts from the untrained planner: the trainer would resume from a previous run's checkpoints
    in ``--out`` (and fail on ones another ``--serving`` wrote), and its logs would run on into this run's. Only
    a folder a demo wrote (it holds ``DEMO_MARKER``, or it is the default one) is cleared; in any other, those
    names are refused."""
    previous = [out / name for name in RUN_ARTEFACTS if (out / name).exists()]
    ours = (out / DEMO_MARKER).is_file() or out == Path(DEFAULT_OUT).resolve()
    if previous and not ours:
        raise InvalidInput(f"--out {out} holds {', '.join(p.name for p in previous)} that no demo wrote: "
                           "give a new or empty folder")
    for path in previous:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    if previous:
        progress(f"removed the previous run's {', '.join(p.name for p in previous)} in {out}")
    out.mkdir(parents=True, exist_ok=True)
    (out / DEMO_MARKER).write_text("written by agentflow demo: the next run clears this folder's "
                                   f"{', '.join(RUN_ARTEFACTS)}\n")
