"""Running one service: its gRPC server and its Kafka worker in one process, with health, metrics and a drain.

Health is NOT_SERVING until the worker has joined its group (the engine is loaded before the runner starts), follows
the worker (or the gateway's listener) while it runs, so it is NOT_SERVING while the brokers cannot be reached, and
turns NOT_SERVING as soon as a stop begins. ``stop()`` drains in this order, so that nothing consumed is lost and no
caller is cut off: health NOT_SERVING (load balancers stop sending), stop consuming, finish in-flight work, flush
and commit, stop the server with grace (docs/event-bus.md).

A service with a ``prepare()`` runs it before consuming (the judge's first calibration); one with a ``serving()``
gates the health of its own gRPC service name on it, while the server's ("", what the probes ask) follows the worker
alone (the judge, while it is refused as a reward source, is alive but not serving).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Protocol

import grpc

from agentflow import telemetry
from agentflow.bus.clients import BusUnavailable
from agentflow.bus.config import BusConfig
from agentflow.bus.worker import Worker
from agentflow.rpc.server import RpcConfig, create_server, set_serving

log = logging.getLogger(__name__)


class Service(Protocol):
    """A service either consumes topics (``input_topics`` and ``handle``: the runner gives it a Worker) or runs its
    own listener (``start``, ``stop`` and a ``ready`` event: the gateway). Optional: ``recover(bus)`` and
    ``prepare()``, run before it starts; ``serving() -> bool``, the health of its own name."""

    name: str

    def register(self, server: grpc.Server) -> None: ...


class ServiceRunner:
    def __init__(self, service: Service, grpc_name: str, rpc: RpcConfig, bus: BusConfig, *, concurrency: int = 8):
        self.service, self.grpc_name, self.rpc, self.bus = service, grpc_name, rpc, bus
        self.concurrency = concurrency
        self.server = self.health = self.worker = None
        self.port = 0
        self._stopping = threading.Event()
        self._started = threading.Event()

    def start(self) -> ServiceRunner:
        public = [self.grpc_name] if getattr(self.service, "public_api", False) else []  # own authentication
        self.server, self.port, self.health = create_server(
            self.rpc, [self.service.register], [self.grpc_name], interceptors=[telemetry.grpc_server_interceptor()],
            public=public)
        self.server.start()
        if hasattr(self.service, "handle"):
            from prometheus_client import REGISTRY

            handle = telemetry.timed_handler(self.service.name, self.service.handle)
            self.worker = Worker(self.service.name, self.bus, self.service.input_topics, handle,
                                 concurrency=self.concurrency)
            if hasattr(self.service, "bind_worker"):
                self.service.bind_worker(self.worker)
            REGISTRY.register(telemetry.WorkerCollector(self.service.name, self.worker))
        threading.Thread(target=self._bring_up, name=f"{self.service.name}-up", daemon=True).start()
        log.info("%s: gRPC on %s:%d", self.service.name, self.rpc.host, self.port)
        return self

    def _bring_up(self) -> None:
        """Recover state (services that keep some), start consuming, then let health follow the worker."""
        recover = getattr(self.service, "recover", None)
        delay = 0.2
        while recover is not None and not self._stopping.is_set():
            try:
                recover(self.bus)
                break
            except BusUnavailable as e:
                log.warning("%s: cannot recover yet (%s); retrying in %.1f s", self.service.name, e, delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, 5.0)
        if self._stopping.is_set():
            return
        prepare = getattr(self.service, "prepare", None)
        if prepare is not None:
            try:
                prepare()
            except Exception:  # noqa: BLE001 - the service still starts; its own checks report the failure
                log.exception("%s: prepare failed", self.service.name)
        if self._stopping.is_set():
            return
        (self.worker or self.service).start()
        self._started.set()
        readiness = self.worker.ready if self.worker else self.service.ready
        own = getattr(self.service, "serving", None)
        serving = named = None
        while not self._stopping.is_set():
            ready = readiness.is_set()
            if ready != serving:
                set_serving(self.health, [self.grpc_name], ready)
                if serving is not None:  # after a broker loss and its return (docs/event-bus.md, "Broker restarts")
                    log.warning("%s: health %s", self.service.name, "SERVING" if ready else "NOT_SERVING (no Kafka)")
                serving, named = ready, ready
            if own is not None and (now := ready and own()) != named:
                set_serving(self.health, [self.grpc_name], now, server=ready)
                named = now
            self._stopping.wait(0.2)

    def stop(self) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()
        set_serving(self.health, [self.grpc_name], False)
        if self.worker is None:
            self.server.stop(self.rpc.grace_s).wait()  # the gateway: let calls in flight get their answers
            self.service.stop()
        else:
            self.worker.stop()
            if self._started.is_set() and not self.worker.join(self.rpc.grace_s):
                log.warning("%s: worker did not drain within %.0f s", self.service.name, self.rpc.grace_s)
            self.server.stop(self.rpc.grace_s).wait()
        telemetry.shutdown_tracing()


def on_stop_signal(callback: Callable[[], None]) -> None:
    """Call ``callback`` once, on a watcher thread, after the first SIGTERM or SIGINT.

    The handlers only record the signal. Python runs a handler in the main thread between two bytecodes, so one
    that takes a lock (``Event.set``) can deadlock: the main thread may hold that lock inside ``Event.wait``, or a
    second signal's handler may interrupt the first one holding it (seen: a service that never stopped).
    """
    received: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, _frame: received.append(signum))

    def watch() -> None:
        while not received:
            time.sleep(0.1)
        callback()

    threading.Thread(target=watch, name="stop-signal", daemon=True).start()
