"""The processes of `agentflow demo`: `agentflow up`'s ring (services/cluster.py: the broker, the LLM server, the six
services), with ``--serving separate`` or ``lora`` more LLM servers, and the trainer, the rollout controller and the
driver, each tied to this process and stopped as a group (agentflow/children.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agentflow.children import signal_group, spawn_tied, stop_group
from agentflow.demo.settings import FLEET_SLOTS, MAX_STEPS, UNTRAINED, DemoSettings, behaviour

#: the only flags the demo gives the trainer, the drivers and the controller: where they run, whom they call and the
#: run's identity. How they behave comes from the profile the chart renders (``behaviour``; tests/unit/
#: test_demo_profile.py holds the demo to these)
PLACEMENT_FLAGS = frozenset({"--bootstrap", "--model-store", "--base-model", "--profile", "--seed", "--metrics-file",
                             "--gateway", "--dataset", "--backend", "--llm-admin-url", "--fleet-url", "--fleet-kind",
                             "--fleet-slots"})


class Processes:
    """Starts the ring, the trainer and the rollout controller (``start_ring``), then the driver (``start_driver``);
    ``stop()`` stops them all."""

    def __init__(self, settings: DemoSettings, out: Path, progress):
        self.settings, self.out, self.progress = settings, out, progress
        self.behaviour = behaviour(settings)  # component -> its AGENTFLOW_* settings, as the chart renders them
        self.store = out / "models"  # the trainer's versions: the only folder the LLM servers load them from
        self.base: Path | None = None  # the untrained planner's model folder
        self.cluster = None
        self.children: dict[str, subprocess.Popen] = {}  # trainer, rollout, drive
        self.jobs: dict[str, subprocess.Popen] = {}  # one-shot processes (the asks-back version's build)

    def start_ring(self) -> None:
        from agentflow.llm.models import build_tiny, smollm2_dir
        from agentflow.services.cluster import start_cluster

        settings, serving = self.settings, self.settings.serving
        self.base = build_tiny(self.out / "base", seed=settings.seed) if settings.profile == "tiny" else smollm2_dir()
        env = ring_env(settings, self.out)
        # local: this server holds every version as it is published; separate, lora: it is the rollout fleet, which
        # the rollout controller keeps loaded with the newest versions, and production runs on the version servers
        follow = ("--follow-versions", "load") if serving == "local" else ()
        self.cluster = start_cluster(log_dir=self.out / "logs", model=str(self.base), env=env, progress=self.progress,
                                     llm_args=(*follow, "--version", UNTRAINED, "--max-batch", "16",
                                               "--model-store", str(self.store)))
        self._spawn("trainer", ["train", "--bootstrap", self.cluster.bootstrap, "--model-store", str(self.store),
                                "--base-model", str(self.base), "--profile", env["AGENTFLOW_PROFILE"],
                                "--seed", str(settings.seed),
                                "--metrics-file", str(self.out / "trainer-metrics.jsonl")],
                    self.behaviour["trainer"])
        self._spawn("rollout", ["rollout", "--bootstrap", self.cluster.bootstrap, *self._backend()],
                    # the token in the env, not argv: ps shows argv
                    {**self.behaviour["rollout"], "AGENTFLOW_ROLLOUT_ADMIN_TOKEN": self.cluster.admin_token})

    def start_driver(self) -> None:
        """Training rollouts pinned to the latest version: on the environment's tasks, or (--unlabeled) replays of
        production traffic."""
        settings = self.settings
        driver = "driver" if settings.unlabeled else "driver-dataset"
        dataset = [] if settings.unlabeled else ["--dataset", f"synthetic:{settings.seed}"]
        self._spawn("drive", ["drive", "--gateway", self.cluster.endpoint("gateway"), *dataset, "--seed",
                              str(settings.seed), "--bootstrap", self.cluster.bootstrap], self.behaviour[driver])

    def _backend(self) -> list[str]:
        """The rollout controller's backend: the one LLM server (local), or the version servers it starts here with
        the first server as the rollout fleet, where pinned calls go (separate, lora)."""
        admin_url = self.cluster.llm_url.removesuffix("/v1")
        serving = self.settings.serving
        if serving == "local":
            return ["--backend", "local", "--llm-admin-url", admin_url]
        urls = ",".join(self._version_server(name) for name in (("a", "b") if serving == "separate" else ("lora",)))
        self.progress(f"version servers on {urls}; rollout fleet on {admin_url}")
        return ["--backend", serving, "--llm-admin-url", urls, "--fleet-url", admin_url,
                "--fleet-kind", "local", "--fleet-slots", str(FLEET_SLOTS)]

    def _version_server(self, name: str) -> str:
        """One more serve-llm on the base model (``separate``: one version at a time; ``lora``: the base under its
        version name, as vLLM serves it, and each version an adapter); its admin URL."""
        tokens = {"AGENTFLOW_LLM_ADMIN_TOKEN": self.cluster.admin_token,
                  "AGENTFLOW_LLM_API_TOKEN": self.cluster.api_token}
        lora = ["--served-name", UNTRAINED] if name == "lora" else []
        server = self.cluster.spawn(f"llm-{name}", ["serve-llm", "--model", str(self.base), "--version", UNTRAINED,
                                                    *lora, "--max-batch", "16", "--model-store", str(self.store)],
                                    180, tokens)
        return server.info["url"].removesuffix("/v1")

    def _spawn(self, name: str, argv: list[str], env: dict | None = None) -> None:
        self.children[name] = self._tied(name, ["agentflow.cli", *argv], env)
        self.progress(f"{name} started")

    def start_job(self, name: str, module_argv: list[str]) -> subprocess.Popen:
        """A one-shot ``python -m`` process (``logs/<name>.log``), stopped with the rest if it still runs."""
        self.jobs[name] = self._tied(name, module_argv)
        return self.jobs[name]

    def _tied(self, name: str, module_argv: list[str], env: dict | None = None) -> subprocess.Popen:
        log = (self.out / "logs" / f"{name}.log").open("ab")
        return spawn_tied([sys.executable, "-m", *module_argv], stdout=log, stderr=log,
                          env={**os.environ, **self.cluster.env, **(env or {})})

    def check(self) -> None:
        """Raises RuntimeError if one of the trainer, the controller and the driver exited."""
        for name, process in self.children.items():
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}; see {self.out / 'logs'}")

    def signal_trainer(self, sig: int) -> None:
        self.children["trainer"].send_signal(sig)

    def trainer_alive(self) -> bool:
        trainer = self.children.get("trainer")
        return trainer is not None and trainer.poll() is None

    def stop(self, grace_s: float = 30.0) -> None:
        """The driver, the controller, the trainer (woken if paused) and any job first, all at once, each group killed
        after ``grace_s``; then the ring."""
        processes = [*self.children.values(), *self.jobs.values()]
        for process in processes:
            if process.poll() is None:
                signal_group(process, signal.SIGCONT)
                signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in processes:
            stop_group(process, max(0.1, deadline - time.monotonic()))
        if self.cluster is not None:
            self.cluster.stop()


def ring_env(settings: DemoSettings, out: Path) -> dict:
    """The environment of every process the demo starts."""
    from agentflow.services.gateway.keys import SCOPES

    env = {"AGENTFLOW_PROFILE": "tiny-deterministic" if settings.profile == "tiny" else "llm",
           "AGENTFLOW_ENVIRONMENT": f"synthetic:{settings.seed}", "AGENTFLOW_LOOP_MAX_STEPS": str(MAX_STEPS),
           "OMP_NUM_THREADS": "1",
           # ten processes on two cores: idle consumers polling the broker every 10 ms took most of a core;
           # at 100 ms a hop waits ~20 ms more, against seconds per trajectory (docs/demo.md)
           "AGENTFLOW_KAFKA_FETCH_MAX_WAIT_MS": os.environ.get("AGENTFLOW_KAFKA_FETCH_MAX_WAIT_MS", "100"),
           # the planner follows the rollout controller's routing table (servers on this machine only)
           "AGENTFLOW_PLANNER_ROUTING": "planner", "AGENTFLOW_PLANNER_ROUTING_ENDPOINTS": "http://127.0.0.1:*",
           # the controller starts after the ring (it needs its broker and LLM server), so the planner does not wait
           # for a first table: until then its calls go to the first LLM server, which serves v0, the stable version
           "AGENTFLOW_PLANNER_ROUTING_WAIT_S": "0",
           # a gateway on loopback beside an unauthenticated broker: keys would guard nothing the broker does not
           # expose; the driver sends rollouts and the simulated users rate as themselves (delegate)
           "AGENTFLOW_GATEWAY_ANONYMOUS_SCOPES": ",".join(SCOPES)}
    if settings.unlabeled:
        env["AGENTFLOW_GATEWAY_TRAIN_ON_TRAFFIC"] = "true"  # the deployment's policy; private queries opt out
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        env["AGENTFLOW_TRACES_DIR"] = str(out / "traces")
    return env
