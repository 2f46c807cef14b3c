"""The consume → handle → produce → commit loop, written once for every service.

A worker subscribes a consumer group to its input topics and, per record: decodes the envelope, opens a CONSUMER
span continuing the producer's trace, calls the pure ``handle(envelope) -> [(topic, envelope), ...]`` (retrying
retryable errors with exponential backoff) and sends the outputs from inside that span. After each polled batch it
flushes the producer and only then commits the batch's offsets: at-least-once delivery, duplicates possible after
a crash, nothing lost. A record that cannot be decoded, fails with a non-retryable error, or exhausts its attempts
goes to ``deadletter`` and the worker carries on.

No single record can hold up its partition: a value over ``max_record_bytes`` is dead-lettered before it is
decoded, an output over it dead-letters its input instead of failing the batch, a dead letter keeps only a bounded
prefix of the record (with its size and SHA-256), and a dead letter that cannot be written is logged, counted
(``deadletter_failures``) and skipped: one poison record costs at most one dead letter, never a loop.

With ``concurrency > 1`` the records of a batch are handled on a thread pool, one chain per (partition, key):
records of one trajectory stay in order, different trajectories overlap (useful when ``handle`` waits on an LLM).

``stop()`` (on SIGTERM: through ``agentflow.services.runtime.on_stop_signal``) stops polling, lets the records in
hand finish, flushes, commits and leaves the group. ``ready`` is set once the group is joined and cleared while the
brokers cannot be reached.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from kafka.errors import CommitFailedError, KafkaError, KafkaTimeoutError, MessageSizeTooLargeError
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from agentflow.bus import codec, topics
from agentflow.bus.config import DEAD_LETTER_KEY_BYTES, BusConfig
from agentflow.errors import AgentFlowError, EngineError, Reason
from agentflow.proto.v1.events_pb2 import DeadLetter, Envelope

log = logging.getLogger(__name__)

Output = tuple[str, Envelope]
Handler = Callable[[Envelope], Iterable[Output] | None]

_POLL_MS = 100  # how quickly a stop request is noticed while idle
_FLUSH_SLICE_S = 0.5  # how quickly a lost broker is noticed while the outputs are being written
_MAX_ERROR_CHARS = 4000


class Retryable(AgentFlowError):
    """Raise (or subclass) in a handler for a transient failure: the record is tried again after a backoff."""

    reason = Reason.UNAVAILABLE


class BadOutput(AgentFlowError):
    """A handler returned something other than (topic, Envelope) pairs."""

    reason = Reason.INTERNAL


class RecordTooLarge(AgentFlowError):
    """An input record, or an output a handler made, is over ``max_record_bytes``: dead-lettered, never retried."""

    reason = Reason.RESOURCE_EXHAUSTED


def is_retryable(error: BaseException) -> bool:
    """The default policy: ``Retryable``, engine and connection errors and timeouts, or any exception with a truthy
    ``retryable`` attribute are retried; everything else goes to the dead-letter topic at once."""
    return (isinstance(error, (Retryable, EngineError, ConnectionError, TimeoutError))
            or bool(getattr(error, "retryable", False)))


class _Reconnect(Exception):
    """Outputs could not be written or the brokers were lost: drop what is uncommitted and start over."""


class Worker:
    """One service's Kafka loop. ``run()`` blocks; ``start()`` runs it on a daemon thread.

    ``name`` names the consumer group (``topic_prefix + name`` unless ``group_id`` or ``config.group_id`` is set),
    the client id and the dead letters. ``input_topics`` and the topics ``handle`` returns are logical names; the
    configured prefix is added here. ``output_topics`` only declares extra topics to create at start (all ring
    topics are created anyway when ``config.create_topics``).
    """

    def __init__(self, name: str, config: BusConfig, input_topics: Iterable[str], handle: Handler, *,
                 group_id: str | None = None, output_topics: Iterable[str] = (), concurrency: int = 1,
                 retryable: Callable[[BaseException], bool] = is_retryable, tracer: trace.Tracer | None = None):
        self.name, self.config, self.handle, self.retryable = name, config, handle, retryable
        self.input_topics = tuple(dict.fromkeys(input_topics))
        if not self.input_topics:
            raise ValueError("a worker needs at least one input topic")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.output_topics = tuple(output_topics)
        self.concurrency = concurrency
        self.group_id = group_id or config.group_id or config.topic_prefix + name
        self.instance = f"{name}@{socket.gethostname()}:{os.getpid()}"
        self.tracer = tracer or trace.get_tracer("agentflow.bus")
        self.ready = threading.Event()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._consumer = self._producer = None
        self._joined = False
        self.generation = 0  # counts assignments: a record written since the last one is on the current broker
        self._pending: list = []
        self._letters: list = []  # (send future, origin) of the dead letters since the last commit
        self._positions: dict = {}  # TopicPartition -> next offset to process (for the lag)
        self._lock = threading.Lock()
        self._metrics = dict.fromkeys(
            ("records_consumed", "records_processed", "handler_errors", "retries", "deadlettered", "decode_errors",
             "oversized", "deadletter_failures", "outputs_produced", "commits", "commit_failures", "connect_failures",
             "handle_seconds_total", "lag"), 0)

    # --- life cycle -------------------------------------------------------------------------------------------------

    def start(self) -> Worker:
        self._thread = threading.Thread(target=self.run, name=f"worker-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the loop to drain and exit; returns at once. ``join()`` waits for it. From a signal, go through
        ``agentflow.services.runtime.on_stop_signal``: this takes a lock, which a handler must not."""
        self._stopping.set()
        self.ready.clear()

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the loop to finish; True if it did."""
        return self._stopped.wait(timeout_s)

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        return self.ready.wait(timeout_s)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.join(30)

    def metrics(self) -> dict[str, float]:
        """Counters since start; ``lag`` is the records behind the high watermark of the assigned partitions."""
        with self._lock:
            return dict(self._metrics, ready=int(self.ready.is_set()))

    def _count(self, name: str, amount: float = 1) -> None:
        with self._lock:
            self._metrics[name] += amount

    # --- the loop ---------------------------------------------------------------------------------------------------

    def run(self) -> None:
        delay = 0.1
        if self.concurrency > 1:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"worker-{self.name}")
        try:
            while not self._stopping.is_set():
                try:
                    self._connect()
                except (KafkaError, topics.TopicError) as e:
                    self.ready.clear()
                    self._count("connect_failures")
                    log.warning("%s: Kafka at %s not reachable (%s); retrying in %.1f s", self.name,
                                self.config.bootstrap_servers, e, delay)
                    self._close(timeout_s=1.0)
                    self._stopping.wait(delay)
                    delay = min(delay * 2, self.config.reconnect_backoff_max_ms / 1000)
                    continue
                delay = 0.1
                try:
                    self._consume()
                except (_Reconnect, KafkaError) as e:
                    # Nothing of the failed batch was committed: reconnect and resume from the committed offsets.
                    log.error("%s: %s; reconnecting", self.name, e)
                    self.ready.clear()
                    self._close(timeout_s=1.0)
                    self._stopping.wait(delay)
                    continue
                self._close()
        finally:
            self.ready.clear()
            self._close()
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self._stopped.set()
            log.info("%s: stopped", self.name)

    def _connect(self) -> None:
        from kafka import ConsumerRebalanceListener, KafkaConsumer, KafkaProducer

        worker = self

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                log.info("%s: partitions revoked: %s", worker.name, sorted(revoked))

            def on_partitions_assigned(self, assigned):
                log.info("%s: partitions assigned: %s", worker.name, sorted(assigned))
                worker._positions = {tp: off for tp, off in worker._positions.items() if tp in assigned}
                worker._joined = True
                worker.generation += 1
                worker.ready.set()

        if self.config.create_topics:
            topics.ensure_topics(self.config, (*topics.ALL, *self.input_topics, *self.output_topics))
        client_id = f"{self.config.client_id}-{self.name}"
        self._producer = KafkaProducer(**{**self.config.producer_options(), "client_id": client_id})
        self._consumer = KafkaConsumer(**{**self.config.consumer_options(self.group_id), "client_id": client_id})
        self._consumer.subscribe([self.config.topic(t) for t in self.input_topics], listener=Listener())

    def _consume(self) -> None:
        lost_since = None
        while not self._stopping.is_set():
            batch = self._consumer.poll(timeout_ms=_POLL_MS)
            if not self._coordinator_known():
                # The brokers went away: not ready. Past the session timeout our membership is gone anyway, so start
                # over (which also re-creates the topics of a broker that came back empty).
                lost_since = lost_since or time.monotonic()
                self.ready.clear()
                if time.monotonic() - lost_since > self.config.session_timeout_ms / 1000:
                    raise _Reconnect(f"group coordinator unreachable for over {self.config.session_timeout_ms} ms")
            elif lost_since is not None:
                lost_since = None
                if self._joined:
                    # Back after a loss: start over anyway. The broker may have restarted (empty: topics to re-create,
                    # no committed offsets), and our idempotent producer then fails fatally on its next send.
                    raise _Reconnect("the brokers are back after a loss; starting over")
            if batch:
                self._finish(batch, self._handle_batch(batch))

    def _handle_batch(self, batch: dict) -> set:
        """Process the polled records, in order per (partition, key); returns the (partition, offset) pairs done."""
        chains = defaultdict(list)
        for tp, records in batch.items():
            for record in records:
                chains[(tp, record.key)].append(record)
        if self._pool is None or len(chains) == 1:
            return {done for chain in chains.values() for done in self._handle_chain(chain)}
        futures = [self._pool.submit(self._handle_chain, chain) for chain in chains.values()]
        done, error = set(), None
        for future in futures:  # wait for every chain, even after one failed: none may be running at commit time
            try:
                done.update(future.result())
            except Exception as e:
                error = error or e
        if error is not None:
            raise error
        return done

    def _handle_chain(self, records: list) -> list:
        done = []
        for record in records:
            if self._stopping.is_set() or not self._process(record):
                break  # draining: the rest stays uncommitted and is redelivered to the next owner
            done.append((record.topic, record.partition, record.offset))
        return done

    def _finish(self, batch: dict, done: set) -> None:
        """Flush the outputs, THEN commit, per partition, up to the first record not done."""
        from kafka import OffsetAndMetadata

        self._flush()
        with self._lock:
            pending, self._pending = self._pending, []
            letters, self._letters = self._letters, []
        for future, origin in letters:
            if future.failed():  # the broker refused it: the poison record is skipped all the same, not re-read
                self._letter_failed(origin, future.exception)
        letters_unsent = [f for f, _ in letters if not f.is_done]  # the broker is unreachable: like any output
        failed = [f.exception for f in pending if f.failed()]
        if failed or letters_unsent or not all(f.is_done for f in pending):
            raise _Reconnect(f"{len(failed) or 'some'} of {len(pending)} outputs were not written: "
                             f"{failed[0] if failed else 'flush timed out'}")
        self._count("outputs_produced", len(pending) + sum(1 for f, _ in letters if f.succeeded()))
        commits = {}
        for tp, records in batch.items():
            offset = None
            for record in records:
                if (record.topic, record.partition, record.offset) not in done:
                    break
                offset = record.offset + 1
            if offset is not None:
                commits[tp] = offset
        if not commits:
            return
        try:
            self._consumer.commit({tp: OffsetAndMetadata(offset, "", -1) for tp, offset in commits.items()})
            self._count("commits")
        except CommitFailedError as e:
            # The group rebalanced under us: the new owner re-processes these records (duplicates, not loss).
            self._count("commit_failures")
            log.warning("%s: commit failed after a rebalance (%s); records will be redelivered", self.name, e)
        self._positions.update(commits)
        self._update_lag()

    def _flush(self) -> None:
        """``producer.flush`` in slices: a broker lost meanwhile makes the worker not ready and start over at once
        (rather than after ``request_timeout_ms``); KafkaTimeoutError past that timeout."""
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        while True:
            try:
                self._producer.flush(timeout=min(_FLUSH_SLICE_S, max(0.0, deadline - time.monotonic())))
                return
            except KafkaTimeoutError:
                if time.monotonic() >= deadline:
                    raise
                if not self._coordinator_known():
                    self.ready.clear()
                    raise _Reconnect("the brokers were lost while the outputs were being written") from None

    def _update_lag(self) -> None:
        lag = 0
        for tp, position in list(self._positions.items()):
            try:
                highwater = self._consumer.highwater(tp)
            except KafkaError:
                continue
            if highwater is not None:
                lag += max(0, highwater - position)
        with self._lock:
            self._metrics["lag"] = lag

    def _coordinator_known(self) -> bool:
        coordinator = getattr(self._consumer, "_coordinator", None)  # kafka-python has no public probe for this
        try:
            return not coordinator.coordinator_unknown()
        except AttributeError:
            return True

    def _close(self, timeout_s: float | None = None) -> None:
        timeout_s = self.config.request_timeout_ms / 1000 if timeout_s is None else timeout_s
        consumer, producer, self._consumer, self._producer = self._consumer, self._producer, None, None
        self._pending, self._letters, self._joined = [], [], False
        if producer is not None:
            try:
                producer.close(timeout=timeout_s)
            except Exception:  # closing must not hide the reason we are closing
                log.debug("%s: producer close failed", self.name, exc_info=True)
        if consumer is not None:
            try:
                consumer.close(autocommit=False, timeout_ms=int(timeout_s * 1000))
            except Exception:
                log.debug("%s: consumer close failed", self.name, exc_info=True)

    # --- one record -------------------------------------------------------------------------------------------------

    def _process(self, record) -> bool:
        """Handle one record; False if a stop request interrupted its retries (it is then left uncommitted)."""
        self._count("records_consumed")
        attributes = {
            "messaging.system": "kafka", "messaging.operation.type": "process",
            "messaging.destination.name": record.topic, "messaging.destination.partition.id": str(record.partition),
            "messaging.kafka.offset": record.offset, "messaging.consumer.group.name": self.group_id,
            "agentflow.worker": self.name,
        }
        parent = codec.trace_context(record.headers)
        with self.tracer.start_as_current_span(f"process {record.topic}", context=parent, kind=SpanKind.CONSUMER,
                                               attributes=attributes) as span:
            size = len(record.value or b"") + len(record.key or b"")
            if size > self.config.max_record_bytes:
                self._count("oversized")
                error = RecordTooLarge(f"the record is {size} bytes (key and value); the limit is "
                                       f"{self.config.max_record_bytes} (max_record_bytes)")
                span.set_status(Status(StatusCode.ERROR, str(error)))
                self._dead_letter(record, error, attempts=0, envelope=None)
                return True
            try:
                envelope = codec.decode(record.value)
            except codec.DecodeError as e:
                self._count("decode_errors")
                span.set_status(Status(StatusCode.ERROR, str(e)))
                self._dead_letter(record, e, attempts=0, envelope=None)
                return True
            span.set_attributes({"messaging.message.id": envelope.event_id,
                                 "messaging.kafka.message.key": envelope.trajectory_id,
                                 "agentflow.trajectory_id": envelope.trajectory_id, "agentflow.step": envelope.step,
                                 "agentflow.stage": envelope.stage})
            attempt = 0
            while True:
                attempt += 1
                started = time.perf_counter()
                try:
                    outputs = self._sized(self._checked(self.handle(envelope)))
                except Exception as e:  # the handler's failure is data here: retried or dead-lettered
                    self._count("handle_seconds_total", time.perf_counter() - started)
                    self._count("handler_errors")
                    span.record_exception(e)
                    if self.retryable(e) and attempt < self.config.max_attempts:
                        delay = min(self.config.retry_backoff_ms * 2 ** (attempt - 1),
                                    self.config.retry_backoff_max_ms) / 1000
                        self._count("retries")
                        span.add_event("retry", {"attempt": attempt, "delay_s": delay, "error": repr(e)})
                        log.info("%s: %s failed (attempt %d/%d: %r); retrying in %.2f s", self.name,
                                 envelope.event_id, attempt, self.config.max_attempts, e, delay)
                        if self._stopping.wait(delay):
                            return False
                        continue
                    span.set_status(Status(StatusCode.ERROR, repr(e)))
                    self._dead_letter(record, e, attempts=attempt, envelope=envelope)
                    return True
                self._count("handle_seconds_total", time.perf_counter() - started)
                for topic, value, key in outputs:  # sent inside the span: its context goes into the headers
                    self._send(topic, value, key)
                self._count("records_processed")
                return True

    @staticmethod
    def _checked(outputs) -> list[Output]:
        outputs = list(outputs or ())
        for item in outputs:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], Envelope) and item[1].trajectory_id):
                raise BadOutput(f"handler must return (topic, Envelope with a trajectory_id) pairs, got {item!r:.200}")
        return outputs

    def _sized(self, outputs: list[Output]) -> list[tuple[str, bytes, bytes]]:
        """The outputs encoded, as (topic, value, key); RecordTooLarge before any is sent if one is over the limit
        (the producer would refuse it, and the batch could then never be committed)."""
        encoded = [(topic, codec.encode(codec.stamp(envelope)), codec.record_key(envelope))
                   for topic, envelope in outputs]
        for topic, value, key in encoded:
            if len(value) + len(key) > self.config.max_record_bytes:
                raise RecordTooLarge(f"the handler's output to {topic} is {len(value) + len(key)} bytes; the limit is "
                                     f"{self.config.max_record_bytes} (max_record_bytes)")
        return encoded

    def _send(self, topic: str, value: bytes, key: bytes, origin: str = "") -> None:
        """Produce one output, or with ``origin`` the dead letter of that record (kept apart: see ``_finish``)."""
        future = self._producer.send(self.config.topic(topic), value=value, key=key, headers=codec.trace_headers())
        with self._lock:
            if origin:
                self._letters.append((future, origin))
            else:
                self._pending.append(future)

    def _letter_failed(self, origin: str, error: BaseException) -> None:
        self._count("deadletter_failures")
        log.error("%s: the dead letter for %s could not be written (%r); the record is skipped", self.name, origin,
                  error)

    def _dead_letter(self, record, error: BaseException, attempts: int, envelope: Envelope | None) -> None:
        self._count("deadlettered")
        origin = f"{record.topic}:{record.partition}:{record.offset}"
        log.error("%s: dead-lettering %s after %d attempt(s): %r", self.name, origin, attempts, error)
        letter = dead_letter(record, error, attempts, envelope, self.instance, self.config.dead_letter_value_bytes)
        key = letter.dead_letter.key or letter.trajectory_id.encode()
        try:
            self._send(topics.DEADLETTER, codec.encode(codec.stamp(letter)), key, origin)
        except KafkaError as e:  # refused before sending (e.g. MessageSizeTooLargeError): skip, do not re-read
            if not isinstance(e, MessageSizeTooLargeError) and e.retriable:
                raise
            self._letter_failed(origin, e)


def dead_letter(record, error: BaseException, attempts: int, envelope: Envelope | None, worker: str,
                max_value_bytes: int) -> Envelope:
    """The dead letter for a consumed ``record``: its origin (and stage, when it decoded), error and a bounded prefix
    of its key and value, with the whole value's size and SHA-256, so that it always fits in a record however large
    the poison was. The memory service ends the trajectory of a dead-lettered stage event (docs/event-bus.md)."""
    value, key = record.value or b"", (record.key or b"")[:DEAD_LETTER_KEY_BYTES]
    origin = f"{record.topic}:{record.partition}:{record.offset}"
    key_text = key.decode("utf-8", "replace")
    tid = envelope.trajectory_id if envelope else (key_text or origin)
    return Envelope(
        event_id=f"deadletter:{origin}", trajectory_id=tid[:DEAD_LETTER_KEY_BYTES],
        step=envelope.step if envelope else 0, stage="deadletter",
        dead_letter=DeadLetter(origin_topic=record.topic, partition=record.partition, offset=record.offset, key=key,
                               value=value[:max_value_bytes], value_size=len(value),
                               value_sha256=hashlib.sha256(value).hexdigest(),
                               value_truncated=len(value) > max_value_bytes,
                               error=f"{type(error).__name__}: {error}"[:_MAX_ERROR_CHARS], worker=worker,
                               attempts=attempts, failed_at_unix_ms=codec.now_ms(),
                               origin_stage=envelope.stage if envelope else ""))
