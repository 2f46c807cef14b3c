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
(``agentflow.demo.view``) and at the end writes the report. It stops at ``--duration``, or earlier once the stable
version's held-out success reaches ``--target`` after at least one promotion (``--unlabeled``: the newest trained
version's, after at least one promotion) and, with ``--inject-bad-version``, after that version was rolled back.
Ctrl-C stops everything and still writes the report.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from agentflow import cli_args
from agentflow.errors import InvalidInput

INJECTED = "injected-bad"  # the name of the degraded version --inject-bad-version publishes
INJECT_GAP = 0.3  # held-out success above the untrained planner's at which it is published (twice the reward margin)
# what a run writes in --out; the next run removes them first
RUN_ARTEFACTS = ("models", "base", "logs", "traces", "trainer-metrics.jsonl", "report.html", "report.json",
                 "reward_curves.png", "reward_curves.svg")
DEMO_MARKER = ".agentflow-demo"
DEFAULT_OUT = ".agentflow/demo"
UNTRAINED = "v000000"  # the version the trainer starts from, and the one --inject-bad-version republishes
USERS = 200  # --unlabeled: the simulated users who rate (each one rater at the gateway)
MIN_PRODUCTION_ANSWERS = 400  # --unlabeled: answers of a version before its production success counts (±0.02)
SERVING = ("local", "separate", "lora")
FLEET_SLOTS = 3  # separate, lora: versions the rollout fleet holds (the trainer's max staleness + 1, see PROFILES)
LORA_TRAINER = ["--lora-rank", "16", "--lora-alpha", "32", "--export", "adapter"]  # --serving lora


@dataclass(frozen=True)
class DemoSettings:
    profile: str = "tiny"  # tiny (random tiny planner, rule-based frozen modules) | smol (SmolLM2 everywhere)
    duration_s: float = 840.0
    target: float = 0.8
    inject_bad_version: bool = False
    out: str = DEFAULT_OUT
    seed: int = 0
    traffic_qps: float = 5.0
    eval_every_s: float = 45.0
    dashboard: bool = True
    serving: str = "local"  # local | separate | lora (the module docstring)
    unlabeled: bool = False  # production traffic without ground truth (the module docstring)
    rated_share: float = 0.3  # --unlabeled: share of answers a simulated user rates
    rating_noise: float = 0.2  # --unlabeled: share of those ratings that are wrong
    opt_out_share: float = 0.1  # --unlabeled: share of query texts whose users opt out of training
    hostile_raters: float = 0.0  # --unlabeled: share of the simulated users who rate every answer the wrong way
    canary_percent: int | None = None  # a canary's first step: 25 % of the traffic, 50 % with --unlabeled

    @property
    def canary_steps(self) -> list[int]:
        """The canary's traffic shares, from its first step through 50 % to promotion at 100 %."""
        first = self.canary_percent or (50 if self.unlabeled else 25)
        return sorted({first, 50, 100} - set(range(first)))

    @property
    def wrong_ratings(self) -> float:
        """The share of all ratings that are wrong: honest users' noise, and every hostile user's rating."""
        return self.rating_noise * (1 - self.hostile_raters) + self.hostile_raters

    def __post_init__(self):
        if self.profile not in ("tiny", "smol"):
            raise InvalidInput(f"--profile must be tiny or smol, got {self.profile!r}")
        if self.serving not in SERVING:
            raise InvalidInput(f"--serving must be one of {', '.join(SERVING)}, got {self.serving!r}")
        if self.duration_s < 60 or not 0 < self.target <= 1 or self.traffic_qps <= 0:
            raise InvalidInput("--duration must be >= 60 s, --target in (0, 1] and --traffic-qps > 0")
        if not (0 <= self.rated_share <= 1 and 0 <= self.rating_noise < 0.5 and 0 <= self.opt_out_share < 1):
            raise InvalidInput("--rated-share must be in [0, 1], --rating-noise in [0, 0.5), --opt-out-share in [0, 1)")
        if not (0 <= self.hostile_raters < 1 and self.wrong_ratings < 0.5):
            raise InvalidInput(f"--hostile-raters with --rating-noise make {self.wrong_ratings:.2f} of the ratings "
                               "wrong; it must stay below 0.5 (the ratings would teach the opposite)")


# the training and rollout settings of each profile (docs/demo.md says why)
PROFILES = {
    "tiny": {"trainer": ["--grpo-group-size", "8", "--grpo-batch-trajectories", "48", "--grpo-lr", "1e-3",
                         "--grpo-beta", "0.02", "--grpo-updates-per-batch", "2", "--grpo-max-staleness", "2",
                         "--format-warmup-steps", "30"],
             "drive": ["--group-size", "8", "--concurrency", "12"]},
    "smol": {"trainer": ["--grpo-group-size", "4", "--grpo-batch-trajectories", "8", "--grpo-lr", "1e-5",
                         "--grpo-beta", "0.02", "--grpo-max-staleness", "2"],
             "drive": ["--group-size", "4", "--concurrency", "4"]},
}
#: --unlabeled: what rewards the trainer and the controller use (docs/demo.md)
UNLABELED = {"trainer": ["--reward-sources", "human,vote", "--reward-wait-s", "20"],
             # a third of the answers is rated: a larger canary share and longer steps collect the evidence
             # an undecided canary yields to the newest version after 90 s: half the traffic, and so the ratings
             # the ledger learns from, stay on recent versions
             "rollout": ["--reward-source", "feedback", "--timeout-s", "600", "--supersede-s", "90"]}
TRAFFIC_QUERIES = 90  # --unlabeled: production traffic repeats this many distinct train-split queries
# --unlabeled: answers are sampled at a chat product's temperature, so users rate a spread of them (at 1.0 the
# untrained and a trained planner answered production alike too often for the canary test to tell them apart)
TRAFFIC_TEMPERATURE = 0.7
REWARD_MARGIN = 0.15  # the controller's, on rule rewards: a canary this much worse is rolled back
ROLLOUT = ["--min-samples", "20",
           "--reward-margin", str(REWARD_MARGIN), "--error-margin", "0.25", "--latency-ratio", "10",
           "--latency-cap-s", "10",
           "--timeout-s", "120", "--timeout-action", "rollback", "--drain-s", "70"]  # a query takes 60 s at most


class Demo:
    def __init__(self, settings: DemoSettings):
        from agentflow.trainer.drive import Item
        from agentflow.envs.synthetic import EnvConfig, SyntheticEnv

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
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.processes: dict[str, subprocess.Popen] = {}
        self.cluster = None
        self.latencies: list[float] = []
        self.step_latencies: list[float] = []
        self.first_tools: dict[str, dict[str, int]] = {"before": {}, "after": {}}
        self.started = time.monotonic()
        self.injected_at: float | None = None
        self.held_at: str | None = None  # the good version the trainer is paused for (--inject-bad-version)
        self.last_held = ""  # the last version it was paused for: a hold needs a newer one
        self.state = _initial_state(settings, self.out)

    def _unlabeled_rollout(self) -> list[str]:
        """The controller on feedback: wrong ratings shrink the reward gap between two versions by (1 - 2 x noise),
        and so the margin (docs/rewards.md)."""
        margin = REWARD_MARGIN * (1 - 2 * self.settings.wrong_ratings)
        return [*UNLABELED["rollout"], "--reward-margin", f"{margin:.3f}"]

    # --- the run ---------------------------------------------------------------------------------------------------
    def run(self) -> dict:
        self._clear_previous_run()
        threads = []
        try:
            self._start()
            self._set(phase="training")
            followers = (self._follow_training_queries,) if self.settings.unlabeled else ()
            for target in (self._traffic, self._evaluations, self._follow_decisions, self._follow_trainer,
                           *followers):
                thread = threading.Thread(target=target, daemon=True, name=target.__name__)
                thread.start()
                threads.append(thread)
            self._watch()
        except KeyboardInterrupt:
            self._set(phase="interrupted")
        finally:
            self.stop_event.set()
            for thread in threads:  # the production queries in flight finish; an evaluation under way is dropped
                thread.join(timeout=30 if thread.name == "_traffic" else 2)
            self._stop()
            if self.state["phase"] != "interrupted":
                self._set(phase="done")
            self._finish_summary()
        from agentflow.demo.view import write_report

        return write_report(self.state, self.out)

    def _clear_previous_run(self) -> None:
        """Every run starts from the untrained planner: the trainer would resume from a previous run's checkpoints
        in ``--out`` (and fail on ones another ``--serving`` wrote), and its logs would run on into this run's. Only
        a folder a demo wrote (it holds ``DEMO_MARKER``, or it is the default one) is cleared; in any other, those
        names are refused."""
        previous = [self.out / name for name in RUN_ARTEFACTS if (self.out / name).exists()]
        ours = (self.out / DEMO_MARKER).is_file() or self.out == Path(DEFAULT_OUT).resolve()
        if previous and not ours:
            raise InvalidInput(f"--out {self.out} holds {', '.join(p.name for p in previous)} that no demo wrote: "
                               "give a new or empty folder")
        for path in previous:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        if previous:
            self._progress(f"removed the previous run's {', '.join(p.name for p in previous)} in {self.out}")
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / DEMO_MARKER).write_text("written by agentflow demo: the next run clears this folder's "
                                            f"{', '.join(RUN_ARTEFACTS)}\n")

    def _start(self) -> None:
        from agentflow.services.cluster import start_cluster
        from agentflow.services.gateway.keys import SCOPES
        from agentflow.llm.models import build_tiny, smollm2_dir

        tiny = self.settings.profile == "tiny"
        base = build_tiny(self.out / "base", seed=self.settings.seed) if tiny else smollm2_dir()
        env = {"AGENTFLOW_PROFILE": "tiny-deterministic" if tiny else "llm",
               "AGENTFLOW_ENVIRONMENT": f"synthetic:{self.settings.seed}", "AGENTFLOW_LOOP_MAX_STEPS": "3",
               "OMP_NUM_THREADS": "1",
               # ten processes on two cores: idle consumers polling the broker every 10 ms took most of a core;
               # at 100 ms a hop waits ~20 ms more, against seconds per trajectory (docs/demo.md)
               "AGENTFLOW_KAFKA_FETCH_MAX_WAIT_MS": os.environ.get("AGENTFLOW_KAFKA_FETCH_MAX_WAIT_MS", "100"),
               # the planner follows the rollout controller's routing table (servers on this machine only)
               "AGENTFLOW_PLANNER_ROUTING": "planner", "AGENTFLOW_PLANNER_ROUTING_ENDPOINTS": "http://127.0.0.1:*",
               # a gateway on loopback beside an unauthenticated broker: keys would guard nothing the broker does not
               # expose; the driver sends rollouts and the simulated users rate as themselves (delegate)
               "AGENTFLOW_GATEWAY_ANONYMOUS_SCOPES": ",".join(SCOPES)}
        if self.settings.unlabeled:
            env["AGENTFLOW_GATEWAY_TRAIN_ON_TRAFFIC"] = "true"  # the deployment's policy; private queries opt out
        if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
            env["AGENTFLOW_TRACES_DIR"] = str(self.out / "traces")
        store = self.out / "models"  # the trainer's versions: the only folder the LLM server loads them from
        serving = self.settings.serving
        # local: this server holds every version as it is published; separate, lora: it is the rollout fleet, which
        # the rollout controller keeps loaded with the newest versions, and production runs on the version servers
        follow = ("--follow-versions", "load") if serving == "local" else ()
        self.cluster = start_cluster(log_dir=self.out / "logs", model=str(base), env=env, progress=self._progress,
                                     llm_args=(*follow, "--version", UNTRAINED, "--max-batch", "16",
                                               "--model-store", str(store)))
        bootstrap, gateway = self.cluster.bootstrap, self.cluster.endpoint("gateway")
        self.admin_url = self.cluster.llm_url.removesuffix("/v1")
        self._spawn("trainer", ["train", "--bootstrap", bootstrap, "--model-store", str(store), "--base-model",
                                str(base), "--objective", "flow_grpo", "--profile", env["AGENTFLOW_PROFILE"],
                                "--keep-last", "8", "--seed", str(self.settings.seed),
                                "--metrics-file", str(self.out / "trainer-metrics.jsonl"),
                                *PROFILES[self.settings.profile]["trainer"],
                                *(UNLABELED["trainer"] if self.settings.unlabeled else []),
                                *(LORA_TRAINER if serving == "lora" else [])])
        backend = ["--backend", "local", "--llm-admin-url", self.admin_url]
        if serving != "local":  # more servers for the routed versions; pinned calls go to the rollout fleet
            urls = ",".join(self._version_server(name, base, store) for name in
                            (("a", "b") if serving == "separate" else ("lora",)))
            backend = ["--backend", serving, "--llm-admin-url", urls, "--fleet-url", self.admin_url,
                       "--fleet-kind", "local", "--fleet-slots", str(FLEET_SLOTS)]
            self._progress(f"version servers on {urls}; rollout fleet on {self.admin_url}")
        steps = self.settings.canary_steps
        self._spawn("rollout", ["rollout", "--bootstrap", bootstrap, *backend, *ROLLOUT, "--canary-percent",
                                str(steps[0]), "--steps", ",".join(map(str, steps)),
                                *(self._unlabeled_rollout() if self.settings.unlabeled else [])],
                    env={"AGENTFLOW_ROLLOUT_ADMIN_TOKEN": self.cluster.admin_token})  # the env, not argv: ps shows argv
        self._before_training()
        rollouts = (["--from-traffic", "true", "--bootstrap", bootstrap] if self.settings.unlabeled
                    else ["--dataset", f"synthetic:{self.settings.seed}"])
        self._spawn("drive", ["drive", "--gateway", gateway, *rollouts, "--planner-version", "latest", "--max-steps",
                              "3", "--seed", str(self.settings.seed), *PROFILES[self.settings.profile]["drive"]])

    def _version_server(self, name: str, base: Path, store: Path) -> str:
        """One more serve-llm on the base model (``separate``: one version at a time; ``lora``: the base under its
        version name, as vLLM serves it, and each version an adapter); its admin URL."""
        tokens = {"AGENTFLOW_LLM_ADMIN_TOKEN": self.cluster.admin_token,
                  "AGENTFLOW_LLM_API_TOKEN": self.cluster.api_token}
        lora = ["--served-name", UNTRAINED] if name == "lora" else []
        server = self.cluster.spawn(f"llm-{name}", ["serve-llm", "--model", str(base), "--version", UNTRAINED, *lora,
                                                    "--max-batch", "16", "--model-store", str(store)], 180, tokens)
        return server.info["url"].removesuffix("/v1")

    def _spawn(self, name: str, argv: list[str], env: dict | None = None) -> None:
        from agentflow.children import spawn_tied

        log = (self.out / "logs" / f"{name}.log").open("ab")
        self.processes[name] = spawn_tied([sys.executable, "-m", "agentflow.cli", *argv], stdout=log, stderr=log,
                                          env={**os.environ, **self.cluster.env, **(env or {})})
        self._progress(f"{name} started")

    def _before_training(self) -> None:
        """Held-out success and tool use of the untrained planner."""
        from agentflow.trainer.drive import evaluate
        from agentflow.trainer.gateway_client import Gateway

        self.gateway = Gateway(self.cluster.endpoint("gateway"))
        result = evaluate(self.gateway, self.heldout, max_steps=3, planner_version=UNTRAINED)
        self.first_tools["before"] = result["tool_sequences"]
        self._add_eval(result["success"], UNTRAINED, "stable")
        with self.lock:
            self.state["summary"]["heldout_before"] = result["success"]

    def _watch(self) -> None:
        """Until the duration, the goal or Ctrl-C (SIGINT, SIGTERM): refresh the dashboard, inject the bad version,
        check the processes.

        From here on the signals only set ``stop_event`` (``on_stop_signal``, as in the services), and the loop raises
        KeyboardInterrupt itself at a safe point: raised by the default handler between any two bytecodes, it could
        land right after ``self.lock`` was taken and before the ``with`` block that releases it, and the stop then
        waited for that lock forever (seen in CI: a Ctrl-C that stopped nothing). A second signal changes nothing.
        """
        from rich.live import Live

        from agentflow.demo.view import render_dashboard
        from agentflow.services.runtime import on_stop_signal

        on_stop_signal(self.stop_event.set)
        deadline = self.started + self.settings.duration_s
        live = Live(render_dashboard(self.state), refresh_per_second=2, screen=False) if self.settings.dashboard \
            else None
        with (live or _Null()):
            while time.monotonic() < deadline and not self._goal_reached():
                if self.stop_event.wait(0.5):
                    raise KeyboardInterrupt
                self._set(elapsed_s=round(time.monotonic() - self.started, 1))
                self._maybe_inject()
                for name, process in self.processes.items():
                    if process.poll() is not None:
                        raise RuntimeError(f"{name} exited with {process.returncode}; see {self.out / 'logs'}")
                if live:
                    with self.lock:
                        live.update(render_dashboard(self.state))
        self._set(phase="finishing")

    def _stable_success(self) -> float | None:
        """The latest held-out success of the stable version, once a promoted version serves as stable."""
        with self.lock:
            s = self.state
            stable = s["versions"]["stable"]
            stable_evals = [h for h in s["heldout"] if h.get("kind") == "stable" and h["version"] == stable]
            return stable_evals[-1]["success"] if stable_evals and s["summary"]["promoted"] >= 1 else None

    def _stable_is_good(self) -> bool:
        """A promoted version serves as stable and its latest held-out success reaches the target."""
        success = self._stable_success()
        return success is not None and success >= self.settings.target

    def _latest_eval(self) -> dict:
        """The newest held-out evaluation of the newest trained version ({} before the first)."""
        with self.lock:
            return next((h for h in reversed(self.state["heldout"]) if h.get("kind") == "latest"), {})

    def _stable_far_ahead(self) -> bool:
        """The promoted stable version is far enough ahead of the untrained planner (``_success_to_inject``) for the
        degraded version (the untrained one) to be proven worse within a canary step."""
        now, needed = self._stable_measure(), self._success_to_inject()
        return now is not None and needed is not None and now >= needed

    def _stable_measure(self) -> float | None:
        """The promoted stable version's success where its lead is judged: labelled, its latest held-out success;
        ``--unlabeled``, its share of right production answers (None until it is promoted and measured)."""
        if not self.settings.unlabeled:
            return self._stable_success()
        with self.lock:
            stable, promoted = self.state["versions"]["stable"], self.state["summary"]["promoted"] >= 1
        return self._production_success(stable) if promoted else None

    def _success_to_inject(self) -> float | None:
        """The success a stable version needs before the degraded one is published beside it: the target, and the
        untrained planner's plus INJECT_GAP (0.3 alone left a 0.5 version's comparison undecided after 120 s).
        ``--unlabeled``: the untrained planner's production success plus INJECT_GAP / (1 - 2 x rating noise), since
        wrong ratings shrink a gap by that factor (as the margin); None until that is measured."""
        if not self.settings.unlabeled:
            with self.lock:
                before = self.state["summary"]["heldout_before"] or 0.0
            return max(self.settings.target, before + INJECT_GAP)
        untrained = self._production_success(UNTRAINED)
        if untrained is None:
            return None
        return max(self.settings.target, untrained + INJECT_GAP / (1 - 2 * self.settings.wrong_ratings))

    def _production_success(self, version: str) -> float | None:
        """The share of ``version``'s production answers that were right (None below MIN_PRODUCTION_ANSWERS)."""
        with self.lock:
            mine = self.state["traffic"]["by_version"].get(version, {"answered": 0})
            return mine["correct"] / mine["answered"] if mine["answered"] >= MIN_PRODUCTION_ANSWERS else None

    def _goal_reached(self) -> bool:
        with self.lock:
            injected_done = not self.settings.inject_bad_version or any(
                d["version"] == INJECTED and d["action"] in ("rollback", "reject") for d in self.state["decisions"])
            promoted = self.state["summary"]["promoted"] >= 1
        if self.settings.unlabeled:  # on feedback a later, slightly better version rarely proves itself in a step
            return injected_done and promoted and self._latest_eval().get("success", 0) >= self.settings.target
        return injected_done and self._stable_is_good()

    # --- production traffic ------------------------------------------------------------------------------------
    def _traffic(self) -> None:
        """Production queries at ``traffic_qps``, at most 32 in flight (beyond that the sender waits)."""
        import random

        rng = random.Random(self.settings.seed)
        self.users = random.Random(self.settings.seed + 2)  # the simulated users' ratings (under the lock)
        slots = threading.Semaphore(32)
        pool = ThreadPoolExecutor(32)
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            if not slots.acquire(timeout=0.5):
                continue
            item = rng.choice(self.production)
            pool.submit(self._one_query, item).add_done_callback(lambda _: slots.release())
            with self.lock:
                self.state["traffic"]["sent"] += 1
            next_at = max(next_at + 1.0 / self.settings.traffic_qps, time.monotonic() - 1.0)
            self.stop_event.wait(max(0.0, next_at - time.monotonic()))
        pool.shutdown(wait=True)  # the queries in flight finish (and count) before the ring stops

    def _one_query(self, item) -> None:
        import grpc

        from agentflow.domain.convert import record_from_proto
        from agentflow.domain.trajectory import Record
        from agentflow.rewards import score

        unlabeled = self.settings.unlabeled
        t0 = time.monotonic()
        try:
            response = self.gateway.solve(item.query, answer="" if unlabeled else item.answer, source="traffic",
                                          max_steps=3, max_time_s=60, temperature=TRAFFIC_TEMPERATURE if unlabeled
                                          else None, train_ok=False if item.query in self.private else None)
            failed = response.status == "error"
        except grpc.RpcError:
            response, failed = None, True
        latency = time.monotonic() - t0
        with self.lock:
            traffic = self.state["traffic"]
            if failed:
                traffic["failed"] += 1
                return
            traffic["answered"] += 1
            self.latencies.append(latency)
            record = record_from_proto(response.trajectory)
            turns = record.get("turns", [])
            for turn in turns:
                self.step_latencies.append(turn.get("timings", {}).get("total_s", 0.0))
            view = Record(record)
            traffic["mixed"] += len(view.planner_versions()) > 1  # routing by trajectory: never
            version = next((t["planner"].get("model_version", "") for t in turns if t.get("planner")), "")
            correct = score("math", record.get("answer", ""), {"answer": item.answer})["value"] >= 1
            mine = traffic["by_version"].setdefault(version or "?", {"answered": 0, "correct": 0})
            mine["answered"] += 1
            mine["correct"] += correct
            rating = self._rating(correct) if unlabeled else None
            example = {"query": item.query, "answer": record.get("answer", ""), "expected": item.answer,
                       "correct": correct, "trace_id": record.get("trace_id", ""),
                       "trajectory_id": record.get("trajectory_id", ""), "version": version,
                       "tools": view.tools()}
            self.state["examples"] = (self.state["examples"] + [example])[-12:]
            elapsed = max(time.monotonic() - self.started, 1e-9)
            traffic.update(qps=round(traffic["answered"] / elapsed, 2), latency_p50_s=_pct(self.latencies, 50),
                           latency_p95_s=_pct(self.latencies, 95), step_latency_p50_s=_pct(self.step_latencies, 50))
        if rating is not None:
            self._send_rating(response.trajectory_id, *rating, correct)

    def _rating(self, correct: bool) -> tuple[float, str] | None:
        """A simulated user's rating and name (under the lock): None when nobody rates. One of ``USERS`` people
        rates; an honest one is wrong with the noise, a hostile one (the first ``hostile_raters`` of them) always."""
        if self.users.random() >= self.settings.rated_share:
            return None
        user = self.users.randrange(USERS)
        wrong = user < self.settings.hostile_raters * USERS or self.users.random() < self.settings.rating_noise
        return float(correct != wrong), f"user-{user:03d}"

    def _send_rating(self, tid: str, rating: float, user: str, correct: bool) -> None:
        import grpc

        try:
            self.gateway.feedback(tid, rating, labeller=user)  # the gateway counts each user as a rater (delegate)
            ok = True
        except grpc.RpcError:
            ok = False
        with self.lock:
            feedback = self.state["feedback"]
            feedback["sent" if ok else "failed"] += 1
            feedback["wrong"] += ok and (rating >= 1) != correct

    def _follow_training_queries(self) -> None:
        """--unlabeled: count the training rollouts, and those of an opted-out query (there must be none)."""
        from agentflow.bus import topics
        from agentflow.bus.clients import Follower
        from agentflow.bus.codec import DecodeError, decode
        from agentflow.bus.config import BusConfig

        def handle(received) -> None:
            try:
                envelope = decode(received.value)
            except DecodeError:
                return
            if envelope.WhichOneof("payload") == "query" and envelope.query.source == "training":
                with self.lock:
                    self.state["feedback"]["replayed"] += 1
                    self.state["feedback"]["opted_out_replayed"] += envelope.query.query in self.private

        Follower(BusConfig(bootstrap_servers=self.cluster.bootstrap), [topics.QUERIES], handle,
                 stop=self.stop_event, name="demo-training-queries").run()

    # --- evaluations, decisions, trainer metrics -----------------------------------------------------------------
    def _evaluations(self) -> None:
        """Held-out success of the newest trained version every ``eval_every_s``, and of each new stable version."""
        from agentflow.trainer.drive import evaluate

        last_latest, last_stable = 0.0, UNTRAINED
        while not self.stop_event.wait(2.0):
            with self.lock:
                stable, latest = self.state["versions"]["stable"], self.state["versions"]["latest_trained"]
            if stable != last_stable:
                result = evaluate(self.gateway, self.heldout, max_steps=3, planner_version=stable)
                if self.stop_event.is_set():
                    return  # cut short by the stop: not a measurement
                self._add_eval(result["success"], stable, "stable")
                self.first_tools["after"] = result["tool_sequences"]
                last_stable = stable
            elif latest and time.monotonic() - last_latest >= self.settings.eval_every_s:
                result = evaluate(self.gateway, self.heldout, max_steps=3, planner_version=latest)
                if self.stop_event.is_set():
                    return
                if result["failed"] < len(self.heldout):  # an unloaded version answers 404s: not a measurement
                    self._add_eval(result["success"], latest, "latest")
                last_latest = time.monotonic()

    def _add_eval(self, success: float, version: str, kind: str) -> None:
        self._progress(f"held-out success of {version} ({kind}): {success:.2f}")
        with self.lock:
            self.state["heldout"].append({"t_s": round(time.monotonic() - self.started, 1), "success": success,
                                          "version": version, "kind": kind})

    def _follow_decisions(self) -> None:
        from agentflow.bus import topics
        from agentflow.bus.clients import TopicReader
        from agentflow.bus.config import BusConfig
        from agentflow.domain.convert import to_dict

        bus = BusConfig(bootstrap_servers=self.cluster.bootstrap)
        reader = None
        while reader is None and not self.stop_event.is_set():
            try:
                reader = TopicReader(bus, topics.ROLLOUT_DECISIONS, timeout_s=5)
            except Exception:  # noqa: BLE001 - the topic appears when the controller starts
                time.sleep(1.0)
        if reader is None:
            return
        with reader:
            while not self.stop_event.is_set():
                for received in reader.poll(0.5):
                    decision = to_dict(received.envelope().rollout_decision)
                    self._on_decision(decision)

    def _on_decision(self, d: dict) -> None:
        with self.lock:
            versions, summary = self.state["versions"], self.state["summary"]
            action, version = d.get("action", ""), d.get("version", "")
            percent = int(d.get("percent", 0) or 0)
            if action in ("canary", "step"):
                versions.update(canary=version, canary_percent=percent)
            elif action == "promote":
                versions.update(stable=version, canary=None, canary_percent=0)
                summary["promoted"] += 1
            elif action in ("rollback", "reject"):
                versions.update(canary=None, canary_percent=0)
                summary["rolled_back"] += action == "rollback"
            evidence = {k: d.get(k) for k in ("stable_version", "canary", "stable", "comparisons", "step_elapsed_s")}
            canary, stable = d.get("canary") or {}, d.get("stable") or {}
            if canary.get("samples") or stable.get("samples"):
                versions.update(canary_reward=canary.get("reward_mean"), stable_reward=stable.get("reward_mean"),
                                canary_n=int(canary.get("samples", 0)), stable_n=int(stable.get("samples", 0)))
            self.state["decisions"].append({"t_s": round(time.monotonic() - self.started, 1), "version": version,
                                            "action": action, "percent": percent, "reason": d.get("reason", ""),
                                            "evidence": evidence})
        if action in ("canary", "promote", "rollback", "reject"):
            self._progress(f"{action} {version}: {d.get('reason', '')[:160]}")

    def _follow_trainer(self) -> None:
        path, seen = self.out / "trainer-metrics.jsonl", 0
        while not self.stop_event.wait(1.0):
            if not path.exists():
                continue
            lines = path.read_text().splitlines()
            for line in lines[seen:]:
                m = json.loads(line)
                with self.lock:
                    if "reward" in m and not m.get("skipped"):
                        self.state["train_reward"].append({"t_s": round(time.monotonic() - self.started, 1),
                                                           "version": m["version"], "reward": m["reward"]})
                    self.state["versions"]["latest_trained"] = f"v{int(m['version']):06d}"
                    _count_rollouts(self.state["rollouts"], m)
            seen = len(lines)

    # --- the injected bad version ---------------------------------------------------------------------------------
    def _maybe_inject(self) -> None:
        """Once the newest evaluated version, newer than the stable one and than any held before, reaches the
        success the injection needs (``_success_to_inject``; held-out success, which for a trained version is close
        to its production success), pause the trainer: the controller then canaries and promotes that version, not a
        newer equal one that would time out first. Once the stable version is far enough ahead
        (``_stable_far_ahead``), publish a degraded checkpoint — the untrained planner — and resume the trainer once
        it is judged. The hold ends without an injection when the held version, or a newer one, is rolled back, or
        is promoted and measured yet not far enough ahead: the trainer goes on, towards a better version (a hold
        that waited for a lead it could not get stopped learning for good: a run held at v000092 for 15 minutes
        with a production lead of 0.48 against the 0.5 needed)."""
        if not self.settings.inject_bad_version:
            return
        with self.lock:
            decisions, stable = self.state["decisions"], self.state["versions"]["stable"]
            judged = any(d["version"] == INJECTED and d["action"] in ("rollback", "reject", "promote")
                         for d in decisions)
            lost = self.held_at is not None and any(  # the held version, or a newer one, lost its canary
                d["action"] == "rollback" and d["version"].startswith("v") and d["version"] >= self.held_at
                for d in decisions)
        trainer, latest, needed = self.processes["trainer"], self._latest_eval(), self._success_to_inject()
        if self.injected_at is None and self._stable_far_ahead():
            if self.held_at is None:
                trainer.send_signal(signal.SIGSTOP)
            self._publish_bad_version()
            self.injected_at = time.monotonic()
            self._progress(f"published the degraded version {INJECTED!r}; the trainer is paused until it is judged")
        elif (self.injected_at is None and self.held_at is None and needed is not None
              and latest.get("success", 0) >= needed and latest["version"] > max(stable, self.last_held)):
            trainer.send_signal(signal.SIGSTOP)
            self.held_at = self.last_held = latest["version"]
            self._progress(f"{self.held_at} reached {needed:.2f}: the trainer is paused until a version is promoted")
        elif self.injected_at is None and self.held_at is not None and (
                lost or (stable >= self.held_at and self._stable_measure() is not None)):
            trainer.send_signal(signal.SIGCONT)
            outcome = "rolled back" if lost else f"promoted ({stable}) but not far enough ahead to inject"
            self._progress(f"{self.held_at} or a newer version was {outcome}: the trainer goes on")
            self.held_at = None
        elif self.injected_at is not None and judged and trainer.poll() is None:
            trainer.send_signal(signal.SIGCONT)

    def _publish_bad_version(self) -> None:
        from agentflow.bus import topics
        from agentflow.bus.clients import Publisher
        from agentflow.bus.codec import new_envelope
        from agentflow.bus.config import BusConfig
        from agentflow.proto.v1 import events_pb2
        from agentflow.trainer.checkpoint import ModelStore

        v0 = ModelStore(self.out / "models").get(0).path
        event = events_pb2.PlannerVersion(version=INJECTED, checkpoint_uri=str(v0))
        with Publisher(BusConfig(bootstrap_servers=self.cluster.bootstrap)) as publisher:
            publisher.publish(topics.PLANNER_VERSIONS, new_envelope("planner", 0, event))
            publisher.flush(10)
        with self.lock:
            self.state["decisions"].append({"t_s": round(time.monotonic() - self.started, 1), "version": INJECTED,
                                            "action": "injected", "percent": 0,
                                            "reason": "--inject-bad-version: the untrained planner as a new version",
                                            "evidence": {"checkpoint_uri": str(v0)}})

    # --- stopping -------------------------------------------------------------------------------------------------
    def _stop(self) -> None:
        for name in ("drive", "rollout", "trainer"):
            process = self.processes.get(name)
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        if self.cluster is not None:
            self.cluster.stop()

    def _finish_summary(self) -> None:
        with self.lock:
            s = self.state
            stable = s["versions"]["stable"]
            mine = [h for h in s["heldout"] if h.get("kind") == "stable" and h["version"] == stable]
            s["summary"].update(heldout_after=mine[-1]["success"] if mine else None,
                                failed_production_queries=s["traffic"]["failed"],
                                wall_s=round(time.monotonic() - self.started, 1))
            s["tool_use"] = {"before": _shares(self.first_tools["before"]), "after": _shares(self.first_tools["after"])}
            s["elapsed_s"] = s["summary"]["wall_s"]

    def _set(self, **values) -> None:
        with self.lock:
            self.state.update(values)

    def _progress(self, message: str) -> None:
        if not self.settings.dashboard:
            print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _count_rollouts(rollouts: dict, step: dict) -> None:
    """A trainer step's publication-to-first-rollout lags and its trained turns by staleness, into the report."""
    rollouts["version_lags_s"] += step.get("version_lags_s") or []
    rollouts["version_lag_p50_s"] = _pct(rollouts["version_lags_s"], 50)
    by_staleness = rollouts["trained_turns_by_staleness"]
    for stale, turns in (step.get("batch_turns_by_staleness") or {}).items():
        by_staleness[str(stale)] = by_staleness.get(str(stale), 0) + turns


def _initial_state(settings: DemoSettings, out: Path) -> dict:
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


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))], 3)


def _shares(counts: dict) -> dict:
    total = sum(counts.values()) or 1
    return {k: round(v / total, 3) for k, v in counts.items()}


def demo(args) -> int:
    import logging

    logging.getLogger("kafka").setLevel(logging.ERROR)  # the demo's own readers: a loaded machine makes them chatty
    settings = DemoSettings(profile=args.profile, duration_s=args.duration, target=args.target,
                            inject_bad_version=args.inject_bad_version, out=str(args.out), seed=args.seed,
                            traffic_qps=args.traffic_qps, dashboard=not args.no_dashboard, serving=args.serving,
                            unlabeled=args.unlabeled, rated_share=args.rated_share, rating_noise=args.rating_noise,
                            hostile_raters=args.hostile_raters, canary_percent=args.canary_percent)
    runner = Demo(settings)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C (while starting; then see Demo._watch)
    paths = runner.run()
    summary = runner.state["summary"]
    print(json.dumps({"event": "demo_done", **summary, "report": paths.get("html"), "json": paths.get("json")}),
          flush=True)
    return 0


def add_parser(commands) -> None:
    p = commands.add_parser("demo", help="the whole loop on one machine: serving, online retraining, canaries")
    p.add_argument("--profile", default="tiny", choices=["tiny", "smol"],
                   help="tiny: a tiny random planner, rule-based frozen modules (minutes); smol: SmolLM2 everywhere")
    p.add_argument("--duration", type=cli_args.number(60), default=840.0,
                   help="stop after this many seconds at the latest")
    p.add_argument("--target", type=cli_args.number(0, 1, lo_open=True), default=0.8,
                   help="stop once a promoted version reaches this held-out success")
    p.add_argument("--inject-bad-version", action="store_true",
                   help="publish a degraded checkpoint mid-run to show an automatic rollback")
    p.add_argument("--out", default=DEFAULT_OUT, type=cli_args.out_folder, help="report, logs, traces and checkpoints")
    p.add_argument("--seed", type=cli_args.integer(), default=0)
    p.add_argument("--traffic-qps", type=cli_args.number(0, lo_open=True), default=5.0,
                   help="production queries per second")
    p.add_argument("--no-dashboard", action="store_true", help="print progress lines instead of the dashboard")
    p.add_argument("--serving", default="local", choices=SERVING,
                   help="local: one LLM server holds every version; separate: each version on its own server "
                        "process; lora: versions as LoRA adapters on one server (docs/demo.md)")
    p.add_argument("--canary-percent", type=cli_args.integer(1, 99), default=None,
                   help="a canary's first share of the traffic, then 50 %% and 100 %% (default: 25; 50 with "
                        "--unlabeled); more traffic decides sooner")
    p.add_argument("--unlabeled", action="store_true",
                   help="production traffic without ground truth: trained from user feedback and group votes")
    p.add_argument("--rated-share", type=cli_args.number(0, 1), default=0.3,
                   help="--unlabeled: share of answers users rate")
    p.add_argument("--rating-noise", type=cli_args.number(0, 0.5, hi_open=True), default=0.2,
                   help="--unlabeled: share of ratings that are wrong")
    p.add_argument("--hostile-raters", type=cli_args.number(0, 1, hi_open=True), default=0.0,
                   help="--unlabeled: share of the simulated users who rate every answer the wrong way on purpose")
    p.set_defaults(handler=demo)
