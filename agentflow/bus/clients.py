"""Producing outside a worker (``Publisher``, e.g. the gateway) and reading a whole topic (``TopicReader``, for
sinks, tools and tests), plus ``wait_for_broker`` for start-up checks."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from kafka.errors import KafkaError

from agentflow.bus import codec, topics
from agentflow.bus.config import BusConfig
from agentflow.errors import AgentFlowError
from agentflow.proto.v1.events_pb2 import Envelope

log = logging.getLogger(__name__)


class BusUnavailable(AgentFlowError):
    """The Kafka brokers could not be reached (or refused a request) in time."""

    reason = "unavailable"


def wait_for_broker(config: BusConfig, timeout_s: float = 10.0) -> bool:
    """True once the brokers answer a metadata request, False if they do not within ``timeout_s``."""
    from kafka import KafkaAdminClient

    deadline = time.monotonic() + timeout_s
    while True:
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            return False
        options = {**config.admin_options(), "bootstrap_timeout_ms": min(remaining_ms, config.connect_timeout_ms)}
        try:
            KafkaAdminClient(**options).close()
            return True
        except KafkaError:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


class Publisher:
    """Produces envelopes with the worker's guarantees: idempotent producer, acks=all, key = trajectory id, the
    current trace context in the headers. Creates the ring's topics first when ``config.create_topics``.
    ``close()`` is bounded: a broker that is gone cannot hold up a shutdown."""

    CLOSE_TIMEOUT_S = 5.0

    def __init__(self, config: BusConfig, *, client_id: str | None = None):
        from kafka import KafkaProducer

        self.config = config
        self._unconfirmed: dict[int, tuple[str, object]] = {}  # id(future) -> (topic, future) until acked/failed
        self._lock = threading.Lock()
        try:
            if config.create_topics:
                topics.ensure_topics(config)
            self._producer = KafkaProducer(**{**config.producer_options(),
                                              "client_id": client_id or f"{config.client_id}-publisher"})
        except KafkaError as e:
            raise BusUnavailable(f"cannot reach Kafka at {config.bootstrap_servers}: {e}") from e

    def publish(self, topic: str, envelope: Envelope, *, headers: Iterable[tuple[str, bytes]] = ()):
        """Send ``envelope`` to the logical ``topic``; returns the send future (``.get(timeout)`` -> metadata)."""
        codec.stamp(envelope)
        return self._track(topic, self._producer.send(self.config.topic(topic), value=codec.encode(envelope),
                                                      key=codec.record_key(envelope),
                                                      headers=codec.trace_headers(headers=headers)))

    def send_raw(self, topic: str, value: bytes | None, *, key: bytes | None = None,
                 headers: Iterable[tuple[str, bytes]] = ()):
        """Send arbitrary bytes (replaying a dead letter, or a poison record in a test)."""
        return self._track(topic, self._producer.send(self.config.topic(topic), value=value, key=key,
                                                      headers=list(headers)))

    def _track(self, topic: str, future):
        with self._lock:
            self._unconfirmed[id(future)] = (topic, future)

        def settled(_result):
            with self._lock:
                self._unconfirmed.pop(id(future), None)

        future.add_both(settled)  # runs at once if the future is already done
        return future

    def flush(self, timeout_s: float | None = None) -> None:
        self._producer.flush(timeout=timeout_s)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Wait up to ``timeout_s`` in all for the records still unconfirmed, then close; what is still unconfirmed
        then is dropped and logged (kafka-python's own close could wait a timeout per batch, twice)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            pending = list(self._unconfirmed.values())
        for _topic, future in pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                future.get(timeout=remaining)
            except Exception:  # noqa: BLE001 - a failed send is counted below, closing goes on
                pass
        with self._lock:
            lost = list(self._unconfirmed.values())
        failed = [topic for topic, future in pending if future.is_done and future.failed()]
        if lost or failed:
            topics_hit = sorted({topic for topic, _ in lost} | set(failed))
            log.warning("publisher: closing with %d record(s) not confirmed by Kafka at %s within %.1f s and %d "
                        "failed (topics: %s); they may not have been written", len(lost),
                        self.config.bootstrap_servers, timeout_s, len(failed), ", ".join(topics_hit))
        try:
            self._producer.close(timeout=max(0.0, deadline - time.monotonic()))
        except KafkaError:
            # kafka-python's close() raises from its flush while records are still pending, before it stops its sender
            # thread; stop that here: the pending records fail, which wakes whoever waits on them.
            sender = getattr(self._producer, "_sender", None)
            if sender is not None:
                sender.force_close()
                sender.join(1.0)
        except Exception:  # noqa: BLE001 - closing must not hide why we are closing
            log.debug("publisher: producer close failed", exc_info=True)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class Received:
    """One record as read from a topic."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp_ms: int = 0

    def envelope(self) -> Envelope:
        """The decoded value (raises ``codec.DecodeError`` for a record that is not an envelope)."""
        return codec.decode(self.value)

    def header(self, name: str) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)


class TopicReader:
    """Reads every partition of one logical topic from the beginning, outside any consumer group (nothing is
    committed). tansu's "latest" offsets are unreliable, so completion is judged by counting records."""

    def __init__(self, config: BusConfig, topic: str, *, timeout_s: float = 10.0):
        from kafka import KafkaConsumer, TopicPartition

        self.topic = config.topic(topic)
        self.records: list[Received] = []
        try:
            self._consumer = KafkaConsumer(**{**config.consumer_options(None),
                                              "client_id": f"{config.client_id}-reader"})
        except KafkaError as e:
            raise BusUnavailable(f"cannot reach Kafka at {config.bootstrap_servers}: {e}") from e
        deadline = time.monotonic() + timeout_s
        while not (partitions := self._consumer.partitions_for_topic(self.topic)):
            if time.monotonic() > deadline:
                self._consumer.close()
                raise BusUnavailable(f"topic {self.topic} does not exist")
            time.sleep(0.05)
        assigned = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        self._consumer.assign(assigned)
        self._consumer.seek_to_beginning(*assigned)

    def poll(self, timeout_s: float = 0.1) -> list[Received]:
        """The records that arrived since the last call (also appended to ``records``)."""
        new = []
        for batch in self._consumer.poll(timeout_ms=int(timeout_s * 1000)).values():
            new.extend(Received(r.topic, r.partition, r.offset, r.key, r.value, list(r.headers or ()), r.timestamp)
                       for r in batch)
        self.records.extend(new)
        return new

    def read(self, count: int, timeout_s: float = 10.0, settle_s: float = 0.0) -> list[Received]:
        """All records read so far, once there are at least ``count``; then keeps reading ``settle_s`` more to catch
        extras (duplicates). Raises TimeoutError if ``count`` is not reached within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while len(self.records) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.topic}: {len(self.records)} of {count} records after {timeout_s:g} s")
            self.poll(0.05)
        settle_until = time.monotonic() + settle_s
        while time.monotonic() < settle_until:
            self.poll(0.05)
        return list(self.records)

    def close(self) -> None:
        self._consumer.close(autocommit=False)

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
