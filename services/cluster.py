"""`agentflow up`: the whole ring on one machine as separate processes on 127.0.0.1.

Starts the embedded broker (tansu) unless a bootstrap address is given, an LLM endpoint (`agentflow serve-llm`)
unless a URL is given, then the six services; waits until every one reports SERVING over gRPC health, prints the
endpoints, and on Ctrl-C (or SIGTERM) stops them in reverse order, each with SIGTERM and a grace period. Every
child gets SIGTERM from the kernel if `agentflow up` itself is killed, so nothing outlives it.

The LLM server it starts gets two fresh random tokens per run, in its environment (never on a command line): an
admin token (``Cluster.admin_token``, for whoever drives its admin API: the demo's rollout controller) and an API
token for its chat routes, which the services get as ``AGENTFLOW_API_KEY``. ``up`` writes both to
``<log dir>/llm-tokens.json`` (mode 0600) for the operator.

Internal gRPC needs a service token, as on Kubernetes: every child gets ``AGENTFLOW_RPC_SERVICE_TOKEN`` in its
environment, a fresh random one per run (``Cluster.service_token``) unless one is set already. The gateway's user API
stays keyed by API keys. The embedded broker has no authentication (docs/event-bus.md, "tansu"); it listens on
127.0.0.1 only.

While it runs, ``up`` records its addresses and the service token in ``$XDG_STATE_HOME/agentflow/up.json`` (default
``~/.local/state/agentflow``; mode 0600), so ``agentflow ask`` and ``agentflow feedback`` find its gateway from any
directory.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from agentflow.services.serving import SERVICES

from agentflow import cli_args
from agentflow.children import signal_group, spawn_tied, stop_group
from agentflow.errors import AgentFlowError, Reason
from agentflow.tools import tool_names

START_ORDER = ("memory", "planner", "executor", "verifier", "generator", "gateway")


class StartFailed(AgentFlowError):
    reason = Reason.NOT_READY


@dataclass
class Child:
    name: str
    args: list[str]
    process: subprocess.Popen
    info: dict = field(default_factory=dict)
    log_path: Path | None = None
    env: dict = field(default_factory=dict)  # this child's own variables (the LLM server's tokens)

    def log_tail(self, lines: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Cluster:
    """The processes of one `agentflow up`; ``stop()`` is safe to call more than once."""

    log_dir: Path
    env: dict = field(default_factory=dict)
    children: list[Child] = field(default_factory=list)
    broker: object = None
    bootstrap: str = ""
    llm_url: str = ""
    admin_token: str = field(default="", repr=False)  # the started LLM server's admin API token ("" if none)
    api_token: str = field(default="", repr=False)  # and its chat routes' token
    service_token: str = field(default="", repr=False)  # what internal gRPC callers present (AGENTFLOW_RPC_...)

    def spawn(self, name: str, args: list[str], timeout_s: float, env: dict | None = None) -> Child:
        """Start ``agentflow ARGS`` (with ``env`` on top of the cluster's) and wait for its JSON ready line."""
        log_path = self.log_dir / f"{name}.log"
        process = spawn_tied([sys.executable, "-m", "agentflow.cli", *args], stdout=subprocess.PIPE,
                             stderr=log_path.open("ab"), env={**os.environ, **self.env, **(env or {})}, text=True)
        child = Child(name, args, process, log_path=log_path, env=dict(env or {}))
        self.children.append(child)
        child.info = _ready_line(child, timeout_s)
        return child

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def restart(self, name: str, timeout_s: float = 120.0) -> Child:
        """Start a process again with its original arguments (after it died or was killed)."""
        old = self.child(name)
        if old.process.poll() is None:
            raise StartFailed(f"{name} is still running")
        self.children.remove(old)
        child = self.spawn(name, old.args, timeout_s, old.env)
        if "grpc_port" in child.info:
            self.wait_serving(child, timeout_s)
        return child

    def wait_serving(self, child: Child, timeout_s: float) -> None:
        from agentflow.rpc.client import wait_serving

        if not wait_serving(f"127.0.0.1:{child.info['grpc_port']}", timeout_s):
            raise StartFailed(f"{child.name} did not become SERVING within {timeout_s:g} s\n{child.log_tail()}")

    def endpoint(self, name: str) -> str:
        return f"127.0.0.1:{self.child(name).info['grpc_port']}"

    def addresses(self) -> dict:
        """Every address a user may need: the broker, the LLM server, and each service's gRPC and metrics ports."""
        services = {c.name: {"grpc": f"127.0.0.1:{c.info['grpc_port']}",
                             "metrics": (f"http://127.0.0.1:{c.info['metrics_port']}/metrics"
                                         if c.info.get("metrics_port") else "")}
                    for c in self.children if "grpc_port" in c.info}
        return {"kafka": self.bootstrap, "llm": self.llm_url, "services": services}

    def stop(self, grace_s: float = 15.0) -> None:
        for child in reversed(self.children):  # all at once, so that they stop in parallel
            signal_group(child.process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in reversed(self.children):
            stop_group(child.process, max(0.1, deadline - time.monotonic()))
        self.children.clear()
        if self.broker is not None:
            self.broker.stop()
            self.broker = None


def _ready_line(child: Child, timeout_s: float) -> dict:
    """The first stdout line of a child, parsed; the rest of its stdout is drained in the background."""
    box: dict = {}
    got_line = threading.Event()

    def read():
        line = child.process.stdout.readline()
        try:
            box["info"] = json.loads(line)
        except ValueError:
            box["error"] = line
        got_line.set()
        for _ in child.process.stdout:  # keep the pipe from filling up
            pass

    threading.Thread(target=read, daemon=True).start()
    got_line.wait(timeout_s)
    if "info" not in box:
        try:
            code = child.process.wait(1.0)
            why = f"exited with code {code}"
        except subprocess.TimeoutExpired:
            why = f"did not report ready within {timeout_s:g} s"
        raise StartFailed(f"{child.name} {why}; the end of {child.log_path}:\n{child.log_tail()}")
    return box["info"]


def start_cluster(*, log_dir: Path, bootstrap: str = "", llm_url: str = "", model: str = "", tools: str = "",
                  env: dict | None = None, timeout_s: float = 180.0, progress=print,
                  llm_args: tuple[str, ...] = ()) -> Cluster:
    """Bring everything up; on any failure stop what was started and raise StartFailed. ``llm_args`` are extra
    `serve-llm` flags (e.g. ``--follow-versions``); the broker's address is added to them."""
    log_dir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(log_dir=log_dir, env=dict(env or {}))
    try:
        if not bootstrap:
            from agentflow.bus.broker import start_tansu

            cluster.broker = start_tansu(log_dir=log_dir)
            bootstrap = cluster.broker.bootstrap
            progress(f"broker (tansu) on {bootstrap}")
        cluster.bootstrap = bootstrap
        if not llm_url:
            args = ["serve-llm", *llm_args] + (["--model", model] if model else [])
            if "--follow-versions" in llm_args:
                args += ["--bootstrap", bootstrap]
            environ = {**os.environ, **cluster.env}
            cluster.admin_token = environ.get("AGENTFLOW_LLM_ADMIN_TOKEN") or secrets.token_urlsafe(32)
            cluster.api_token = environ.get("AGENTFLOW_LLM_API_TOKEN") or secrets.token_urlsafe(32)
            llm = cluster.spawn("llm", args, timeout_s, {"AGENTFLOW_LLM_ADMIN_TOKEN": cluster.admin_token,
                                                         "AGENTFLOW_LLM_API_TOKEN": cluster.api_token})
            cluster.env["AGENTFLOW_API_KEY"] = cluster.api_token  # the services' (and the demo's) LLM client
            llm_url = llm.info["url"]
            progress(f"LLM server on {llm_url} ({llm.info['version']})")
        cluster.llm_url = llm_url
        environ = {**os.environ, **cluster.env}
        cluster.service_token = environ.get("AGENTFLOW_RPC_SERVICE_TOKEN") or secrets.token_urlsafe(32)
        cluster.env["AGENTFLOW_RPC_SERVICE_TOKEN"] = cluster.service_token  # every child from here on
        for name in START_ORDER:
            args = ["serve", name, "--port", "0", "--metrics-port", "0", "--bootstrap", bootstrap, "--endpoint", llm_url]
            child = cluster.spawn(name, args + (["--tools", tools] if tools else []), timeout_s)
            progress(f"{name} gRPC on 127.0.0.1:{child.info['grpc_port']}")
        for child in cluster.children:
            if "grpc_port" in child.info:
                cluster.wait_serving(child, timeout_s)
        return cluster
    except BaseException:
        cluster.stop()
        raise


def write_tokens(cluster: Cluster, log_dir: Path) -> Path:
    """The LLM server's tokens in a file only the owner can read."""
    path = log_dir / "llm-tokens.json"
    _write_private(path, {"admin_token": cluster.admin_token, "api_token": cluster.api_token})
    return path


def _write_private(path: Path, data: dict) -> None:
    """``data`` as JSON in a file only the owner can read or write."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file that existed keeps its mode through open()
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)


def state_path() -> Path:
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "agentflow" / "up.json"


def _write_state(cluster: Cluster) -> None:
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_private(path, {"pid": os.getpid(), **cluster.addresses(), "service_token": cluster.service_token})


def _clear_state() -> None:
    try:
        if json.loads(state_path().read_text()).get("pid") == os.getpid():
            state_path().unlink()
    except (OSError, ValueError):
        pass


def running_state() -> dict:
    """The addresses of the `agentflow up` still running on this machine ({} if none: no state file, or its process
    is gone)."""
    try:
        state = json.loads(state_path().read_text())
        os.kill(int(state["pid"]), 0)
        return state
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def running_gateway() -> str:
    """The gateway of the `agentflow up` still running on this machine ("" if none)."""
    try:
        return running_state()["services"]["gateway"]["grpc"]
    except (KeyError, TypeError):
        return ""


def gateway_address(given: str | None) -> str:
    """``--gateway`` if given, else ``AGENTFLOW_GATEWAY``, else the running `agentflow up`'s, else 127.0.0.1:50051."""
    return given or os.environ.get("AGENTFLOW_GATEWAY") or running_gateway() or "127.0.0.1:50051"


def _print_addresses(addresses: dict) -> None:
    print(f"\n  {'kafka':<10} {addresses['kafka']}\n  {'llm':<10} {addresses['llm']}")
    for name, ports in addresses["services"].items():
        print(f"  {name:<10} gRPC {ports['grpc']:<18} metrics {ports['metrics'] or '-'}")


def up(args) -> int:
    """Start everything, wait for Ctrl-C or SIGTERM, stop everything. Either signal interrupts the start too (what
    was started is stopped); during the stop both are ignored, so a second Ctrl-C cannot leave a process behind."""
    for signum in (signal.SIGINT, signal.SIGTERM):  # both raise KeyboardInterrupt in the main thread
        signal.signal(signum, signal.default_int_handler)
    log_dir, cluster = Path(args.log_dir), None
    try:
        cluster = start_cluster(log_dir=log_dir, bootstrap=args.bootstrap or "", llm_url=args.llm_url or "",
                                model=args.model or "", tools=args.tools or "")
        tokens = ""
        if cluster.admin_token:
            tokens = f"LLM tokens (bearer; admin API and chat) in {write_tokens(cluster, log_dir)}.\n"
        _write_state(cluster)
        _print_addresses(cluster.addresses())
        broker = ("The broker (tansu) listens on 127.0.0.1 only and has no authentication.\n"
                  if cluster.broker is not None else "")
        print(f"\nAgentFlow is up. Gateway: {cluster.endpoint('gateway')}   Kafka: {cluster.bootstrap}   "
              f"LLM: {cluster.llm_url}\nTry:  agentflow ask \"What is 2+2?\"   (it finds this gateway; or "
              f"--gateway {cluster.endpoint('gateway')})\n{tokens}Service token (internal gRPC) in {state_path()}.\n"
              f"{broker}Logs in {log_dir}. Ctrl-C stops everything.", flush=True)
        while True:  # a sleep, not a wait without timeout: the signal may land on another thread (see serving)
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
        _clear_state()
        if cluster is not None:
            cluster.stop()
    print("stopped.")
    return 0


def add_parser(commands) -> None:
    parser = commands.add_parser("up", help="start the broker, an LLM server and all six services locally")
    parser.add_argument("--bootstrap", type=cli_args.addresses, help="use this Kafka instead of starting tansu")
    parser.add_argument("--llm-url", type=cli_args.url,
                        help="use this OpenAI-compatible endpoint instead of starting serve-llm")
    parser.add_argument("--model", type=cli_args.uri_or(cli_args.folder, words=("smollm2",)),
                        help="model folder for serve-llm (default SmolLM2)")
    parser.add_argument("--tools", type=cli_args.names(tool_names),
                        help="comma-separated tools for the executor and planner")
    parser.add_argument("--log-dir", default=".agentflow/logs", type=cli_args.out_folder,
                        help="one log file per process")
    parser.set_defaults(handler=up)


assert set(START_ORDER) == set(SERVICES)
