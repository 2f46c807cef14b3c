"""Run a rendered profile as local processes: the chart's configuration executed, not only compared as YAML
(docs/deploy.md, "Running the rendered chart").

``RenderedRun`` renders the chart (``agentflow.chart.render``) with the local broker as ``kafka.bootstrapServers``,
and runs each Deployment with its own command, arguments, environment, ConfigMaps and Secrets, on a loopback address
of its own, where its Service's name resolves: every Service name in an environment value or an
argument is replaced by the address of the workload it selects (127.X.Y.N: X.Y drawn per run, so that runs side by
side do not meet), ``0.0.0.0`` by the workload's own address, and each
volume's mount path by a folder (a claim's folder shared by every workload that mounts it). Init containers run
first, to completion. A Secret the chart names but does not render (the operator's) gets a random token. It keeps
small and honest: one process per workload, no scheduling, no probes beyond waiting for each Service's ports.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from agentflow import chart
from agentflow.children import signal_group, spawn_tied, stop_group
from agentflow.errors import InvalidInput

NAMESPACE = "agentflow"
IMAGE_ENTRYPOINT = "agentflow"  # the images' ENTRYPOINT (Dockerfile, Dockerfile.cuda)
INIT_TIMEOUT_S = 300.0
#: the caller's variables a workload inherits: where programs and the broker binary are, and the CPU threads
INHERITED = ("PATH", "LANG", "LC_ALL", "OMP_NUM_THREADS", "AGENTFLOW_TANSU_BIN", "AGENTFLOW_KAFKA_FETCH_MAX_WAIT_MS")
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass
class Container:
    name: str
    argv: list[str]
    env: dict[str, str]


@dataclass
class Workload:
    name: str  # the Deployment's
    component: str
    address: str
    init: list[Container] = field(default_factory=list)
    containers: list[Container] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)  # its Services' target ports
    grace_s: float = 30.0


def plan(objects: list[dict], out: Path, subnet: str = "", secrets_given: dict | None = None) -> dict[str, Workload]:
    """Every Deployment of ``objects`` as a ``Workload`` on ``subnet``N (default: a 127.X.Y. of its own): argv and
    environment resolved and localised, its volumes as folders under ``out``. ``secrets_given``: the operator's
    Secrets, name -> {key: value}; any other the chart names but does not render gets random tokens."""
    subnet = subnet or f"127.{secrets.randbelow(190) + 64}.{secrets.randbelow(254) + 1}."
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    if unsupported := sorted({o["kind"] for o in objects} & {"Job", "PyTorchJob", "StatefulSet", "InferenceService"}):
        raise InvalidInput(f"the profile renders {', '.join(unsupported)}: the local run starts Deployments only (the "
                           "CPU overlay must leave trainer.nodes 1 and turn KServe off)")
    addresses = {d["metadata"]["name"]: f"{subnet}{i + 1}" for i, d in enumerate(deployments)}
    services = _service_addresses(objects, deployments, addresses)
    config = {o["metadata"]["name"]: dict(o.get("data") or {}) for o in objects if o["kind"] == "ConfigMap"}
    secret_data = {o["metadata"]["name"]: _secret(o) for o in objects if o["kind"] == "Secret"}
    secret_data.update({name: dict(data) for name, data in (secrets_given or {}).items()})
    workloads = {}
    for d in deployments:
        name, pod = d["metadata"]["name"], d["spec"]["template"]["spec"]
        folders = _volumes(pod.get("volumes") or [], out, name)
        localise = _localiser(services, addresses[name])
        w = Workload(name, d["metadata"]["labels"].get("app.kubernetes.io/component", name), addresses[name],
                     grace_s=min(30.0, float(pod.get("terminationGracePeriodSeconds", 30))))
        for kind, target in (("initContainers", w.init), ("containers", w.containers)):
            for c in pod.get(kind) or []:
                mounts = {m["mountPath"]: folders[m["name"]] for m in c.get("volumeMounts") or []
                          if folders.get(m["name"])}
                env = _environment(c, pod_name=f"{name}-0", address=w.address, config=config, secret_data=secret_data)
                fix = _with_paths(localise, mounts)
                argv = [sys.executable, "-m", "agentflow.cli", *(fix(a) for a in _arguments(c))]
                target.append(Container(c["name"], argv, {k: fix(v) for k, v in env.items()}))
        w.ports = [p for s in objects if s["kind"] == "Service" and _selects(s, d)
                   for p in _target_ports(s, pod)]
        workloads[name] = w
    return workloads


class RenderedRun:
    """The profile of ``values_files`` with ``overlay`` on top, running: ``start()``, then ``address(service, port)``
    for a Service's address, ``check()`` raises if a workload exited, ``stop()`` (also on leaving a ``with``)."""

    def __init__(self, values_files: list[str | Path], overlay: dict | None, out: Path, progress=print,
                 secrets_given: dict | None = None):
        self.values_files, self.overlay, self.out, self.progress = values_files, overlay or {}, Path(out), progress
        self.secrets_given = secrets_given or {}
        self.broker = None
        self.objects: list[dict] = []
        self.workloads: dict[str, Workload] = {}
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self, ready_timeout_s: float = 300.0) -> RenderedRun:
        from agentflow.bus.broker import start_tansu

        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        try:
            self.broker = start_tansu(log_dir=self.out / "logs")
            kafka = {"kafka": {"bootstrapServers": self.broker.bootstrap}}
            self.objects = chart.render(self.values_files, _merge(self.overlay, kafka), namespace=NAMESPACE)
            self.workloads = plan(self.objects, self.out, secrets_given=self.secrets_given)
            for w in self.workloads.values():
                for c in w.init:
                    self._run_init(w, c)
            for w in self.workloads.values():
                for c in w.containers:
                    self._spawn(w, c)
            self._wait_ready(ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def address(self, deployment: str, port: int) -> str:
        return f"{self.workloads[deployment].address}:{port}"

    def env(self, deployment: str, container: str | None = None) -> dict[str, str]:
        w = self.workloads[deployment]
        return next(c for c in w.containers if container in (None, c.name)).env

    def check(self) -> None:
        for key, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"{key} exited with {process.returncode}:\n{self.log_tail(key)}")

    def log_tail(self, key: str, lines: int = 30) -> str:
        path = self.out / "logs" / f"{key}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        for process in self.processes.values():  # all at once: each drains within its grace
            if process.poll() is None:
                signal_group(process, signal.SIGTERM)
        for key, process in self.processes.items():
            stop_group(process, self.workloads[key.split("/")[0]].grace_s)
        if self.broker is not None:
            self.broker.stop()
            self.broker = None

    def __enter__(self) -> RenderedRun:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _process_env(self, c: Container) -> dict[str, str]:
        return {**{k: os.environ[k] for k in INHERITED if k in os.environ}, **c.env}

    def _run_init(self, w: Workload, c: Container) -> None:
        self.progress(f"{w.name}: init container {c.name}")
        with (self.out / "logs" / f"{w.name}.{c.name}.log").open("ab") as log_file:
            done = subprocess.run(c.argv, env=self._process_env(c), stdout=log_file, stderr=log_file,
                                  timeout=INIT_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{w.name}'s init container {c.name} exited with {done.returncode}:\n"
                               f"{self.log_tail(f'{w.name}.{c.name}')}")

    def _spawn(self, w: Workload, c: Container) -> None:
        key = f"{w.name}/{c.name}"
        log_path = self.out / "logs" / f"{key}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log_file:
            self.processes[key] = spawn_tied(c.argv, env=self._process_env(c), stdout=log_file, stderr=log_file)
        self.progress(f"{w.name} ({c.name}) on {w.address}")

    def _wait_ready(self, timeout_s: float) -> None:
        waiting = {(w.name, w.address, port) for w in self.workloads.values() for port in w.ports}
        deadline = time.monotonic() + timeout_s
        while waiting:
            self.check()
            waiting = {(n, a, p) for n, a, p in waiting if not _listens(a, p)}
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"not listening after {timeout_s:g} s: "
                                   + ", ".join(f"{n} {a}:{p}" for n, a, p in sorted(waiting)))
            time.sleep(0.5)
        self.progress("every Service listens")


def _listens(address: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((address, port)) == 0


def _merge(base: dict, extra: dict) -> dict:
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) \
            else value
    return merged


def _secret(obj: dict) -> dict[str, str]:
    import base64

    data = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
    return {**data, **(obj.get("stringData") or {})}


def _selects(service: dict, deployment: dict) -> bool:
    labels = deployment["spec"]["template"]["metadata"].get("labels", {})
    selector = service["spec"].get("selector") or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _target_ports(service: dict, pod: dict) -> list[int]:
    named = {p["name"]: p["containerPort"] for c in pod["containers"] for p in c.get("ports") or [] if "name" in p}
    ports = []
    for p in service["spec"]["ports"]:
        target = p.get("targetPort", p["port"])
        ports.append(named[target] if isinstance(target, str) else int(target))
    return ports


def _service_addresses(objects, deployments, addresses) -> dict[str, str]:
    """Service name -> the address of the one Deployment it selects (a Service of none, or of several, is refused:
    the local run has one process per workload)."""
    found = {}
    for s in (o for o in objects if o["kind"] == "Service"):
        targets = [d["metadata"]["name"] for d in deployments if _selects(s, d)]
        if len(targets) != 1:
            raise InvalidInput(f"Service {s['metadata']['name']} selects {len(targets)} Deployments; the local run "
                               "needs exactly one")
        found[s["metadata"]["name"]] = addresses[targets[0]]
    return found


def _localiser(services: dict[str, str], own: str):
    """A text with every Service's DNS name (name, name.ns, name.ns.svc, name.ns.svc.cluster.local) before a port,
    a path or its end replaced by its address, and 0.0.0.0 by ``own``."""
    names = "|".join(re.escape(n) for n in sorted(services, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w.-])({names})(?:\.{NAMESPACE}(?:\.svc(?:\.cluster\.local)?)?)?(?=[:/,]|$)")

    def localise(text: str) -> str:
        text = pattern.sub(lambda m: services[m.group(1)], text) if services else text
        return text.replace("0.0.0.0", own)
    return localise


def _with_paths(localise, mounts: dict[str, Path]):
    """``localise``, then, in one pass, each mount path where it starts a path replaced by its folder (the longest
    path first: /tmp/x before /tmp)."""
    if not mounts:
        return localise
    paths = "|".join(re.escape(p) for p in sorted(mounts, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w/.])({paths})(?=/|$|[,:\s])")

    def fix(text: str) -> str:
        return pattern.sub(lambda m: str(mounts[m.group(1)]), localise(text))
    return fix


def _volumes(volumes: list[dict], out: Path, workload: str) -> dict[str, Path | None]:
    """Volume name -> its folder: a claim's is shared (out/claims/NAME), any other is the workload's own; a memory
    emptyDir at /dev/shm is the machine's (None: not replaced)."""
    folders: dict[str, Path | None] = {}
    for v in volumes:
        if v.get("emptyDir", {}).get("medium") == "Memory":
            folders[v["name"]] = None
            continue
        claim = v.get("persistentVolumeClaim", {}).get("claimName")
        folder = out / "claims" / claim if claim else out / "volumes" / workload / v["name"]
        folder.mkdir(parents=True, exist_ok=True)
        folders[v["name"]] = folder
    return folders


def _arguments(c: dict) -> list[str]:
    """The container's `agentflow` arguments (its command after the images' entrypoint, then its args)."""
    command = list(c.get("command") or [IMAGE_ENTRYPOINT])
    if command[0] != IMAGE_ENTRYPOINT:
        raise InvalidInput(f"container {c['name']} runs {command[0]!r}: the local run starts `agentflow` commands "
                           "only (torchrun: the CPU overlay keeps trainer.gpusPerNode at 0 or 1)")
    return [*command[1:], *(str(a) for a in c.get("args") or [])]


def _environment(c: dict, *, pod_name: str, address: str, config: dict, secret_data: dict) -> dict[str, str]:
    """The container's variables as the kubelet sets them: envFrom in order, then env with $(VAR) expanded from the
    variables before it; a Secret the chart does not render gets a random token, once per run."""
    env: dict[str, str] = {}
    for source in c.get("envFrom") or []:
        if ref := source.get("configMapRef"):
            env.update(config.get(ref["name"], {}))
        elif ref := source.get("secretRef"):
            env.update(secret_data.setdefault(ref["name"], {}))
    fields = {"metadata.name": pod_name, "metadata.namespace": NAMESPACE, "spec.nodeName": "local",
              "status.podIP": address, "spec.serviceAccountName": "default"}
    for var in c.get("env") or []:
        if "value" in var:
            env[var["name"]] = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), str(var["value"]))
            continue
        source = var.get("valueFrom", {})
        if ref := source.get("secretKeyRef"):
            data = secret_data.setdefault(ref["name"], {})
            if ref["key"] not in data and not ref.get("optional"):
                data[ref["key"]] = secrets.token_hex(24)
            if ref["key"] in data:
                env[var["name"]] = data[ref["key"]]
        elif ref := source.get("configMapKeyRef"):
            if ref["key"] in config.get(ref["name"], {}):
                env[var["name"]] = config[ref["name"]][ref["key"]]
        elif ref := source.get("fieldRef"):
            env[var["name"]] = fields.get(ref["fieldPath"], "")
    return env
