"""The ``agentflow rollout`` process: a Kafka worker on ``planner.versions`` and ``trajectories`` feeding the
controller, a ticker thread, decisions published on ``rollout.decisions``, Prometheus metrics, a SIGTERM drain."""

from __future__ import annotations

import logging
import threading

from agentflow.bus import Publisher, TopicReader, Worker, topics
from agentflow.bus.clients import BusUnavailable
from agentflow.bus.config import BusConfig
from agentflow.proto.v1 import events_pb2 as pb
from agentflow.rollout.backends import Backend, LocalBackend
from agentflow.rollout.controller import RolloutController
from agentflow.rollout.fleet import RolloutFleet, fleet_server
from agentflow.rollout.metrics import rollout_metrics
from agentflow.rollout.settings import RolloutSettings

log = logging.getLogger(__name__)

WORKER_NAME = "rollout"


def build_backend(settings: RolloutSettings) -> Backend:
    if settings.backend == "kserve":
        from agentflow.rollout.kserve import kserve_backend

        return kserve_backend(settings)
    if settings.backend == "lora":
        from agentflow.rollout.lora import LoraBackend

        return LoraBackend.from_settings(settings)
    options = dict(token=settings.admin_token, timeout_s=settings.request_timeout_s, retries=settings.retries)
    if settings.backend == "separate":
        from agentflow.rollout.backends import SeparateBackend

        return SeparateBackend([url.strip() for url in settings.llm_url.split(",") if url.strip()], **options)
    return LocalBackend(settings.llm_url, serving_url=settings.callers_url, **options)


def build_fleet(settings: RolloutSettings) -> RolloutFleet | None:
    """The rollout fleet the settings name (None without ``fleet_url``), its load lag observed as a metric."""
    if not settings.fleet_url:
        return None
    server = fleet_server(settings.fleet_type, settings.fleet_url,
                          token=settings.fleet_admin_token or settings.admin_token,
                          serving_url=settings.fleet_serving_url, mirror=settings.fleet_mirror,
                          timeout_s=settings.request_timeout_s,
                          retries=settings.retries)
    metrics = rollout_metrics()
    return RolloutFleet(server, settings.fleet_slots, on_loaded=lambda _name, lag: metrics.fleet_load.observe(lag))


def past_decisions(bus: BusConfig, backend: Backend, settle_s: float) -> list[tuple[int, pb.RolloutDecision]]:
    """This controller's earlier decisions (same backend kind and target), oldest first."""
    if settle_s <= 0:
        return []
    found = []
    with TopicReader(bus, topics.ROLLOUT_DECISIONS) as reader:
        for record in reader.read(0, timeout_s=settle_s, settle_s=settle_s):
            try:
                envelope = record.envelope()
            except Exception as e:  # noqa: BLE001 - a foreign record on the topic is skipped, not fatal
                log.warning("skipping an unreadable record on %s: %s", topics.ROLLOUT_DECISIONS, e)
                continue
            if envelope.WhichOneof("payload") != "rollout_decision":
                continue
            decision = envelope.rollout_decision
            if decision.backend == backend.kind and decision.target == backend.target:
                found.append((record.timestamp_ms, envelope.step, decision))
    found.sort(key=lambda item: (item[2].decided_at_unix_ms, item[0]))
    return [(step, decision) for _, step, decision in found]


class RolloutService:
    def __init__(self, settings: RolloutSettings, bus: BusConfig, backend: Backend | None = None):
        self.settings, self.bus = settings, bus
        self.backend = backend or build_backend(settings)
        self.publisher: Publisher | None = None
        self.controller: RolloutController | None = None
        self.worker: Worker | None = None
        self._stopping = threading.Event()
        self._ticker: threading.Thread | None = None

    def start(self) -> RolloutService:
        self.publisher = Publisher(self.bus, client_id=f"{self.bus.client_id}-rollout")
        self.controller = RolloutController(self.settings, self.backend, sink=self._publish,
                                            routes=self._publish_routes, fleet=build_fleet(self.settings))
        try:
            self.controller.resume(past_decisions(self.bus, self.backend, self.settings.recover_s))
        except BusUnavailable as e:
            log.warning("could not read earlier decisions (%s); starting from the backend's state", e)
        self.worker = Worker(WORKER_NAME, self.bus, [topics.PLANNER_VERSIONS, topics.TRAJECTORIES],
                             self.controller.handle,
                             output_topics=[topics.ROLLOUT_DECISIONS, topics.PLANNER_ROUTING]).start()
        self._ticker = threading.Thread(target=self._tick_loop, name="rollout-ticker", daemon=True)
        self._ticker.start()
        log.info("rollout controller on %s %s: ladder %s, min_samples %d, alpha %g", self.backend.kind,
                 self.backend.target, self.settings.ladder, self.settings.min_samples, self.settings.alpha)
        return self

    def _publish(self, envelope: pb.Envelope) -> None:
        """Decisions are durable before the worker commits the record that caused them."""
        assert self.publisher is not None
        self.publisher.publish(topics.ROLLOUT_DECISIONS, envelope).get(timeout=self.bus.request_timeout_ms / 1000)

    def _publish_routes(self, envelope: pb.Envelope) -> None:
        """A routing table is durable before the backend is asked to unload what it no longer names."""
        assert self.publisher is not None
        self.publisher.publish(topics.PLANNER_ROUTING, envelope).get(timeout=self.bus.request_timeout_ms / 1000)

    def _tick_loop(self) -> None:
        while not self._stopping.wait(self.settings.tick_s):
            try:
                self.controller.tick()
            except Exception:  # noqa: BLE001 - the ticker must outlive one bad tick
                log.exception("rollout tick failed")

    def stop(self) -> None:
        """Stop ticking and consuming, finish the record in hand, flush, close."""
        self._stopping.set()
        if self.worker is not None:
            self.worker.stop()
            self.worker.join(30)
        if self._ticker is not None:
            self._ticker.join(self.settings.tick_s + 5)
        if self.publisher is not None:
            self.publisher.close()
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()
