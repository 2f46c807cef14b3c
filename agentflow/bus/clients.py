"""Producing outside a worker (``Publisher``, e.g. the gateway; it survives a broker restart), following topics
outside a group (``Follower``), reading a whole topic (``TopicReader``, for sinks, tools and tests), plus
``wait_for_broker`` and ``reach_brokers`` for start-up checks."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kafka.errors import (InvalidProducerEpochError, KafkaError, KafkaTimeoutError, OutOfOrderSequenceNumberError,
                          ProducerFencedError, UnknownProducerIdError)
from kafka.future import Future

from agentflow.bus import codec, topics
from agentflow.bus.config import BusConfig
from agentflow.errors import AgentFlowError, Reason
from agentflow.proto.v1.events_pb2 import Envelope
from agentflow.startup import first_contact

log = logging.getLogger(__name__)


class BusUnavailable(AgentFlowError):
    """The Kafka brokers could not be reached (or refused a request) in time."""

    reason = Reason.UNAVAILABLE


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


def reach_brokers(config: BusConfig, *, set_by: str = "--bootstrap (or AGENTFLOW_KAFKA_BOOTSTRAP_SERVERS)") -> None:
    """A command's first connection to the brokers, by the rule of ``agentflow.startup.first_contact``; kafka-python's
    own log lines are held back meanwhile (one line per failed try, not a dozen)."""
    kafka_log = logging.getLogger("kafka")
    level = kafka_log.level
    kafka_log.setLevel(logging.CRITICAL)
    try:
        first_contact("Kafka", config.bootstrap_servers,
                      lambda: wait_for_broker(config, timeout_s=config.connect_timeout_ms / 1000), set_by=set_by)
    finally:
        kafka_log.setLevel(level)


class Delivery(Future):
    """The result of one record's send, across producer rebuilds: ``get(timeout)`` -> RecordMetadata, or raises."""

    __slots__ = ("_settled",)

    def __init__(self):
        super().__init__()
        self._settled = threading.Event()
        self.add_both(lambda _result: self._settled.set())

    def get(self, timeout: float | None = None):
        if not self._settled.wait(timeout):
            raise KafkaTimeoutError(f"the record was not confirmed within {timeout} s")
        if self.exception is not None:
            raise self.exception
        return self.value


@dataclass
class _Outgoing:
    topic: str  # logical
    value: bytes | None
    key: bytes | None
    headers: list
    give_up_at: float  # monotonic: past this a failed send is final


# Send failures that say the producer (not the record) is at fault: another producer, or a rebuilt one, succeeds.
_PRODUCER_ERRORS = (UnknownProducerIdError, OutOfOrderSequenceNumberError, InvalidProducerEpochError,
                    ProducerFencedError)


class Publisher:
    """Produces envelopes with the worker's guarantees: idempotent producer, acks=all, key = trajectory id, the
    current trace context in the headers. Creates the ring's topics first when ``config.create_topics``.

    Survives a broker restart: a send that fails with a retriable error, or because the producer itself is broken
    (a broker that forgot its producer id: kafka-python's idempotent producer then fails fatally, for good), is sent
    again for up to ``RESEND_WITHIN_S``, on a new producer (topics re-created first) when the old one is in a fatal
    state. Consumers drop the duplicates this can make by event id. ``close()`` is bounded: a broker that is gone
    cannot hold up a shutdown."""

    CLOSE_TIMEOUT_S = 5.0
    RESEND_WITHIN_S = 120.0

    def __init__(self, config: BusConfig, *, client_id: str | None = None):
        self.config = config
        self.client_id = client_id or f"{config.client_id}-publisher"
        self._unconfirmed: dict[int, tuple[str, Delivery]] = {}  # id(future) -> (topic, future) until acked/failed
        self._lock = threading.Lock()
        self._retry = threading.Condition(self._lock)
        self._to_resend: list[tuple[_Outgoing, Delivery]] = []
        self._resender: threading.Thread | None = None
        self._closing = False
        self._suspect = False
        self.rebuilds = 0
        self._producer = self._new_producer()

    def _new_producer(self):
        from kafka import KafkaProducer

        try:
            if self.config.create_topics:
                topics.ensure_topics(self.config)
            # a send stuck in kafka-python's own retries fails after this, then goes to a new producer (_failed)
            delivery_ms = self.config.request_timeout_ms + self.config.linger_ms
            return KafkaProducer(**{**self.config.producer_options(), "client_id": self.client_id,
                                    "delivery_timeout_ms": delivery_ms})
        except (KafkaError, topics.TopicError) as e:
            raise BusUnavailable(f"cannot reach Kafka at {self.config.bootstrap_servers}: {e}") from e

    def publish(self, topic: str, envelope: Envelope, *, headers: Iterable[tuple[str, bytes]] = ()) -> Delivery:
        """Send ``envelope`` to the logical ``topic``; returns its ``Delivery`` (``.get(timeout)`` -> metadata)."""
        codec.stamp(envelope)
        return self._submit(topic, codec.encode(envelope), codec.record_key(envelope),
                            codec.trace_headers(headers=headers))

    def send_raw(self, topic: str, value: bytes | None, *, key: bytes | None = None,
                 headers: Iterable[tuple[str, bytes]] = ()) -> Delivery:
        """Send arbitrary bytes (replaying a dead letter, or a poison record in a test)."""
        return self._submit(topic, value, key, list(headers))

    def _submit(self, topic: str, value, key, headers) -> Delivery:
        future = Delivery()
        with self._lock:
            self._unconfirmed[id(future)] = (topic, future)

        def settled(_result):
            with self._lock:
                self._unconfirmed.pop(id(future), None)

        future.add_both(settled)
        self._send(_Outgoing(topic, value, key, headers, time.monotonic() + self.RESEND_WITHIN_S), future)
        return future

    def _send(self, record: _Outgoing, future: Delivery) -> None:
        producer = self._producer
        try:
            sent = producer.send(self.config.topic(record.topic), value=record.value, key=record.key,
                                 headers=record.headers)
        except KafkaError as e:
            self._failed(record, future, e, producer)
            return
        sent.add_callback(future.success)
        sent.add_errback(lambda e: self._failed(record, future, e, producer))

    def _broken(self) -> bool:
        """Whether the producer is in a fatal state (every later send on it fails at once) or suspected: a send on
        it failed with a producer error or ran out of time (against tansu, kafka-python can retry an
        UnknownProducerIdError for ever)."""
        manager = getattr(self._producer, "_transaction_manager", None)  # kafka-python has no public probe for this
        return self._suspect or (manager is not None and manager.has_fatal_error())

    def _failed(self, record: _Outgoing, future: Delivery, error: Exception, producer) -> None:
        """A send failed (on kafka-python's sender thread, usually): queue it for the resender, or fail it."""
        if producer is self._producer and isinstance(error, (*_PRODUCER_ERRORS, KafkaTimeoutError)):
            self._suspect = True
        again = (isinstance(error, KafkaError) and (error.retriable or isinstance(error, _PRODUCER_ERRORS)
                                                    or producer is not self._producer or self._broken()))
        with self._lock:
            if again and not self._closing and time.monotonic() < record.give_up_at:
                self._to_resend.append((record, future))
                self._retry.notify()
                if self._resender is None:
                    self._resender = threading.Thread(target=self._resend_loop, name=f"{self.client_id}-resend",
                                                      daemon=True)
                    self._resender.start()
                return
        future.failure(error)

    def _resend_loop(self) -> None:
        """Send queued records again, after rebuilding a broken producer; backs off while Kafka is away."""
        delay = 0.1
        while True:
            with self._lock:
                while not self._to_resend and not self._closing:
                    self._retry.wait()
                if self._closing:
                    failed, self._to_resend = self._to_resend, []
                    break
                batch, self._to_resend = self._to_resend, []
            try:
                if self._broken():
                    self._rebuild()
                delay = 0.1
            except BusUnavailable as e:
                log.warning("%s: cannot rebuild the producer yet (%s); retrying in %.1f s", self.client_id, e, delay)
                delay = min(delay * 2, self.config.reconnect_backoff_max_ms / 1000)
            time.sleep(delay)  # a retriable error is often a broker that is not back yet
            for record, future in batch:
                self._send(record, future)
        for _record, future in failed:
            future.failure(KafkaError("the publisher closed before the record could be sent again"))

    def _rebuild(self) -> None:
        old, self._producer, self._suspect = self._producer, self._new_producer(), False
        self.rebuilds += 1
        log.warning("%s: the producer was broken (a restarted broker?); replaced it", self.client_id)
        _close_producer(old, 0.0)  # what it still holds fails, and is sent again on the new one

    def reset(self) -> None:
        """Replace the producer now (re-creating the topics first): for owners that saw the brokers come back, as
        kafka-python may otherwise keep retrying on a producer id the restarted broker does not know. Raises
        BusUnavailable."""
        with self._lock:
            if self._closing:
                return
        self._rebuild()

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait for every record sent so far to be confirmed or to fail (resends included); KafkaTimeoutError
        after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            pending = [future for _topic, future in self._unconfirmed.values()]
        for future in pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not future._settled.wait(remaining):
                raise KafkaTimeoutError(f"{self.client_id}: records not confirmed within {timeout_s} s")

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
            self._closing = True
            self._retry.notify()
            lost = list(self._unconfirmed.values())
        failed = [topic for topic, future in pending if future.is_done and future.failed()]
        if lost or failed:
            topics_hit = sorted({topic for topic, _ in lost} | set(failed))
            log.warning("publisher: closing with %d record(s) not confirmed by Kafka at %s within %.1f s and %d "
                        "failed (topics: %s); they may not have been written", len(lost),
                        self.config.bootstrap_servers, timeout_s, len(failed), ", ".join(topics_hit))
        _close_producer(self._producer, max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _close_producer(producer, timeout_s: float) -> None:
    try:
        producer.close(timeout=timeout_s)
    except KafkaError:
        # kafka-python's close() raises from its flush while records are still pending, before it stops its sender
        # thread; stop that here: the pending records fail, which wakes whoever waits on them.
        sender = getattr(producer, "_sender", None)
        if sender is not None:
            sender.force_close()
            sender.join(1.0)
    except Exception:  # noqa: BLE001 - closing must not hide why we are closing
        log.debug("publisher: producer close failed", exc_info=True)


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


def _received(polled: dict) -> list[Received]:
    return [Received(r.topic, r.partition, r.offset, r.key, r.value, list(r.headers or ()), r.timestamp)
            for batch in polled.values() for r in batch]


def assigned_consumer(config: BusConfig, topic_names: Iterable[str], *, client_id: str, group_id: str | None = None,
                      offsets: dict | None = None, timeout_s: float = 10.0, **options):
    """A KafkaConsumer holding every partition of the (full) ``topic_names`` by assignment, so no group rebalances.
    Each partition (a ``TopicPartition``) starts at the later of ``offsets[tp]`` and, with a ``group_id``, the group's
    committed offset; with neither, at the beginning ("latest" is unreliable on tansu). Waits up to ``timeout_s`` for
    the topics to exist; raises BusUnavailable. The one place that waits for partitions, assigns and seeks."""
    from kafka import KafkaConsumer, TopicPartition

    try:
        consumer = KafkaConsumer(**{**config.consumer_options(group_id), "client_id": client_id, **options})
    except KafkaError as e:
        raise BusUnavailable(f"cannot reach Kafka at {config.bootstrap_servers}: {e}") from e
    try:
        deadline = time.monotonic() + timeout_s
        assigned = []
        for name in topic_names:
            while not (partitions := consumer.partitions_for_topic(name)):
                if time.monotonic() > deadline:
                    raise BusUnavailable(f"topic {name} does not exist")
                time.sleep(0.05)
            assigned += [TopicPartition(name, p) for p in sorted(partitions)]
        consumer.assign(assigned)
        for tp in assigned:
            start = max((consumer.committed(tp) if group_id else None) or 0, (offsets or {}).get(tp, 0))
            if start:
                consumer.seek(tp, start)
            else:
                consumer.seek_to_beginning(tp)
    except BaseException:
        consumer.close(autocommit=False)
        raise
    return consumer


class Follower:
    """Hands every record (or, ``per_batch``, every polled batch, empty ones too: time-based work runs while idle) of
    every partition of ``topic_names`` to ``handle`` until ``stop``, outside any group (nothing is committed), from
    the beginning or ``offsets`` ({TopicPartition: offset}). Failed connections (and ``on_connect``) are retried with
    backoff for ever; a failed poll re-opens the consumer at ``positions``. ``ready``: partitions assigned and a
    broker connected (cleared after ``DOWN_AFTER_S`` without one; when one is back, the consumer is re-opened and
    ``on_connect`` runs again). ``on_lost`` runs after ``on_connect`` when the topics were found re-created: the
    broker lost what it held. An exception from ``handle`` ends ``run()``. docs/event-bus.md."""

    DOWN_AFTER_S = 1.0  # no broker connection this long: not ready

    def __init__(self, config: BusConfig, topic_names: Iterable[str], handle: Callable, *, per_batch: bool = False,
                 offsets: dict | None = None, stop: threading.Event | None = None, name: str = "follower",
                 poll_s: float = 0.1, wait_s: float = 10.0, on_connect: Callable[[], None] | None = None,
                 on_lost: Callable[[], None] | None = None, **options):
        self.config, self.handle, self.per_batch, self.name = config, handle, per_batch, name
        self.on_lost, self._lost = on_lost, False
        self.topics = [config.topic(t) for t in topic_names]
        self.positions = dict(offsets or {})  # TopicPartition -> the next offset to hand over
        self.ready = threading.Event()
        self.stop_event = stop or threading.Event()
        self.poll_s, self.wait_s, self.on_connect, self.options = poll_s, wait_s, on_connect, options
        self.group_id: str | None = None
        self.consumer = None
        self._topic_ids: dict[str, str] = {}  # kept across reconnects: a changed id means a re-created topic

    def start(self) -> Follower:
        threading.Thread(target=self.run, name=self.name, daemon=True).start()
        return self

    def stop(self) -> None:
        self.stop_event.set()

    def run(self) -> None:
        delay = 0.1
        while not self.stop_event.is_set():
            try:
                if self.on_connect is not None:
                    self.on_connect()
                if self._lost and self.on_lost is not None:
                    self.on_lost()
                self._lost = False
                self.consumer = assigned_consumer(
                    self.config, self.topics, client_id=f"{self.config.client_id}-{self.name}",
                    group_id=self.group_id, offsets=self.positions, timeout_s=self.wait_s, **self.options)
            except (BusUnavailable, topics.TopicError, KafkaError) as e:
                log.warning("%s: Kafka not ready (%s); retrying in %.1f s", self.name, e, delay)
                self.stop_event.wait(delay)
                delay = min(delay * 2, self.config.reconnect_backoff_max_ms / 1000)
                continue
            delay = 0.1
            self.ready.set()
            try:
                self._follow()
            finally:
                self.ready.clear()
                self.consumer.close(autocommit=False)

    def _follow(self) -> None:
        """Poll and hand over until stopped; returns (to reconnect) when the poll fails or a topic was re-created."""
        from kafka import TopicPartition

        cluster, known = self.consumer._client.cluster, self._topic_ids  # kafka-python keeps the topic ids only there
        down_since = None
        while not self.stop_event.is_set():
            if not _connected(self.consumer):
                down_since = down_since or time.monotonic()
                if self.ready.is_set() and time.monotonic() - down_since > self.DOWN_AFTER_S:
                    log.warning("%s: no connection to Kafka at %s; not ready", self.name, self.config.bootstrap_servers)
                    self.ready.clear()
            elif not self.ready.is_set():
                log.warning("%s: Kafka is back; reconnecting", self.name)
                return  # re-open, after on_connect (which may re-create the topics of a broker that came back empty)
            else:
                down_since = None
            try:
                records = _received(self.consumer.poll(timeout_ms=int(self.poll_s * 1000)))
            except KafkaError as e:
                log.error("%s: %s; reconnecting", self.name, e)
                return
            ids = {name: topic_id for name in self.topics if (topic_id := cluster.topic_id(name)) is not None}
            if recreated := {name for name, topic_id in ids.items() if known.setdefault(name, topic_id) != topic_id}:
                # A broker that came back empty, then the topics created again: our positions mean nothing there.
                log.warning("%s: %s re-created; reading from its beginning", self.name, ", ".join(sorted(recreated)))
                self.positions = {tp: o for tp, o in self.positions.items() if tp.topic not in recreated}
                known.update(ids)
                self._lost = True
                return
            for r in records:
                self.positions[TopicPartition(r.topic, r.partition)] = r.offset + 1
            if self.per_batch:
                self.handle(records)
            else:
                for record in records:
                    self.handle(record)


def _connected(consumer) -> bool:
    """Whether a consumer holds a live connection to a broker (kafka-python has no public probe for this)."""
    try:
        return any(conn.connected for conn in consumer._client._manager._conns.values())
    except AttributeError:
        return True


class AssignedConsumer(Follower):
    """A ``Follower`` of one topic that resumes from given offsets ({partition: offset}) and commits (the trainer's
    exactly-once path: it keeps its offsets beside its checkpoints). The consumer group only stores offsets: the
    partitions are assigned, not subscribed, so a single instance owns them all and no rebalance interrupts it. Each
    partition starts at the later of its committed offset and ``offsets``; ``handle`` gets every polled batch and may
    call ``commit`` (same thread)."""

    def __init__(self, config: BusConfig, topic: str, group_id: str, handle: Callable, *,
                 offsets: dict[int, int] | None = None, **kwargs):
        from kafka import TopicPartition

        self.topic = config.topic(topic)
        super().__init__(config, [topic], handle, per_batch=True,
                         offsets={TopicPartition(self.topic, p): o for p, o in (offsets or {}).items()}, **kwargs)
        self.group_id = group_id

    def lag(self) -> int:
        """Records behind the end of the topic, by the high watermarks of the last fetches (same thread)."""
        behind = 0
        for tp, position in self.positions.items():
            end = self.consumer.highwater(tp)
            behind += max(0, end - position) if end is not None else 0
        return behind

    def commit(self, offsets: dict[int, int]) -> None:
        """Record ``offsets`` ({partition: the first offset not yet used}) as the group's committed offsets."""
        from kafka import OffsetAndMetadata, TopicPartition

        self.consumer.commit({TopicPartition(self.topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()})


class TopicReader:
    """Reads every partition of one logical topic from the beginning, outside any consumer group (nothing is
    committed). tansu's "latest" offsets are unreliable, so completion is judged by counting records."""

    def __init__(self, config: BusConfig, topic: str, *, timeout_s: float = 10.0):
        self.topic = config.topic(topic)
        self.records: list[Received] = []
        self._consumer = assigned_consumer(config, [self.topic], client_id=f"{config.client_id}-reader",
                                           timeout_s=timeout_s)

    def poll(self, timeout_s: float = 0.1) -> list[Received]:
        """The records that arrived since the last call (also appended to ``records``)."""
        new = _received(self._consumer.poll(timeout_ms=int(timeout_s * 1000)))
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
