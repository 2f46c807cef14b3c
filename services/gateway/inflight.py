"""The gateway's calls in flight: each accepted query, kept until its trajectory record is seen (and published again
when Kafka lost it), and the inbox of the call waiting for it, fed by the listener's records."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from agentflow.bus.clients import Delivery
from agentflow.bus.codec import decode
from agentflow.errors import AgentFlowError, Reason
from agentflow.proto.v1 import events_pb2

log = logging.getLogger(__package__)  # the gateway's logger: its lines read as before the split
_STOP_CHECK_S = 0.5  # how often a waiting call looks whether the gateway is stopping
_GONE = object()  # put in a call's inbox when its client went away


class TimedOut(AgentFlowError):
    reason = Reason.DEADLINE_EXCEEDED


class ClientGone(AgentFlowError):
    reason = Reason.CANCELLED


class InFlight:
    """Accepted queries (tid -> (query, until, its latest Delivery), bounded by ``max_unanswered``) and the inboxes
    of the calls waiting for them (bounded by ``max_in_flight``; 0: unbounded). ``publish`` sends a query to Kafka;
    ``on_finished(tid, owner)`` hears of every trajectory record on ``trajectories_topic``."""

    def __init__(self, *, max_in_flight: int, max_unanswered: int, trajectories_topic: str,
                 publish: Callable[[events_pb2.Envelope], Delivery], on_finished: Callable[[str, str], None],
                 stopping: threading.Event):
        self.max_in_flight, self.max_unanswered = max_in_flight, max_unanswered
        self.trajectories_topic, self._publish, self._on_finished = trajectories_topic, publish, on_finished
        self._stopping = stopping
        self._lock = threading.Lock()
        self._waiters: dict[str, queue.Queue] = {}
        self._unanswered: OrderedDict[str, tuple[events_pb2.Envelope, float, Delivery | None]] = OrderedDict()

    # --- a call ----------------------------------------------------------------------------------------------------
    def check_room(self) -> None:
        """Refuse a new call when ``max_in_flight`` calls wait already."""
        with self._lock:
            if self.max_in_flight and len(self._waiters) >= self.max_in_flight:
                raise AgentFlowError(f"{len(self._waiters)} calls are in flight, the most this gateway serves at "
                                     "once; try again later", reason=Reason.RESOURCE_EXHAUSTED)

    def accept(self, tid: str, envelope: events_pb2.Envelope, keep_s: float) -> queue.Queue:
        """Keep an accepted query for ``keep_s`` (refused past ``max_unanswered``); the inbox of the call waiting."""
        inbox: queue.Queue = queue.Queue()
        with self._lock:
            self._keep(tid, envelope, keep_s)
            self._waiters[tid] = inbox
        return inbox

    def publish(self, tid: str, envelope: events_pb2.Envelope) -> Delivery:
        """Publish an accepted query (again: same event id) and keep its delivery with it."""
        delivery = self._publish(envelope)
        with self._lock:
            if tid in self._unanswered:
                self._unanswered[tid] = (*self._unanswered[tid][:2], delivery)
        return delivery

    def events(self, tid: str, inbox: queue.Queue, wait_s: float):
        """The trajectory's events in arrival order, ending with its record; raises TimedOut after ``wait_s`` without
        an event, and gives up once the gateway stops (a waiting call must not keep a stopped process alive)."""
        seen = set()
        while True:
            envelope = self._next(tid, inbox, wait_s)
            if envelope.event_id in seen:
                continue  # at-least-once delivery upstream
            seen.add(envelope.event_id)
            yield envelope
            if envelope.WhichOneof("payload") == "trajectory":
                return

    def finish(self, tid: str) -> None:
        """The call of ``tid`` returned: nothing waits for its events any more."""
        with self._lock:
            self._waiters.pop(tid, None)

    def abandon(self, tid: str) -> bool:
        """The call of ``tid`` ended. If it was still waiting (its client went away), wake it and stop keeping its
        query; True then (the ring should stop working on it)."""
        with self._lock:
            inbox = self._waiters.pop(tid, None)
            if inbox is None:
                return False  # answered (or failed) before the call ended
            self._unanswered.pop(tid, None)
        inbox.put(_GONE)
        return True

    def _keep(self, tid: str, envelope: events_pb2.Envelope, keep_s: float) -> None:
        """Remember an accepted query until its trajectory is seen (under the lock); refuses past the bound."""
        now = time.monotonic()
        while self._unanswered and next(iter(self._unanswered.values()))[1] < now:
            self._unanswered.popitem(last=False)  # past its deadline and grace: nobody waits for it any more
        if len(self._unanswered) >= self.max_unanswered:
            raise AgentFlowError(f"{len(self._unanswered)} queries are waiting for their answers; try again later",
                                 reason=Reason.RESOURCE_EXHAUSTED)
        self._unanswered[tid] = (envelope, now + keep_s, None)

    def _next(self, tid: str, inbox: queue.Queue, wait_s: float) -> events_pb2.Envelope:
        deadline = time.monotonic() + wait_s
        while True:
            if self._stopping.is_set():
                raise AgentFlowError(f"the gateway stopped before trajectory {tid} finished", reason=Reason.NOT_READY)
            try:
                envelope = inbox.get(timeout=max(0.0, min(_STOP_CHECK_S, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise TimedOut(f"trajectory {tid} did not finish within {wait_s:.0f} s") from None
                continue
            if envelope is _GONE:
                raise ClientGone(f"the caller of trajectory {tid} went away")
            return envelope

    # --- the listener ------------------------------------------------------------------------------------------------
    def resend_failed(self) -> None:
        """Publish again the unanswered queries whose send failed for good (the Publisher itself re-sends a failed
        record for ``RESEND_WITHIN_S``)."""
        self._publish_again(lambda delivery: delivery is not None and delivery.failed(), "whose send had failed")

    def resend_all(self) -> None:
        """The broker came back without its topics: every unanswered query goes out again."""
        self._publish_again(lambda _delivery: True, "after the broker lost its topics")

    def _publish_again(self, which, why: str) -> None:
        with self._lock:
            again = [(tid, envelope) for tid, (envelope, _until, delivery) in self._unanswered.items()
                     if which(delivery)]
        for tid, envelope in again:
            self.publish(tid, envelope)
        if again:
            log.warning("gateway: published %d unanswered queries again, %s", len(again), why)

    def dispatch(self, record) -> None:
        """A record the listener read: to the inbox of the call waiting for its trajectory; a trajectory record also
        ends the keeping of its query and goes to ``on_finished``."""
        tid = (record.key or b"").decode(errors="replace")
        finished = record.topic == self.trajectories_topic
        with self._lock:
            inbox = self._waiters.get(tid)
            if not finished and inbox is None and tid not in self._unanswered:
                return
        try:
            envelope = decode(record.value)
        except AgentFlowError:
            log.warning("gateway: undecodable record on %s at offset %d", record.topic, record.offset)
            return
        if finished:
            self._on_finished(tid, envelope.trajectory.owner)
        if inbox is None and tid not in self._unanswered:
            return
        if envelope.WhichOneof("payload") == "trajectory":
            with self._lock:
                self._unanswered.pop(tid, None)
        if inbox is not None:
            inbox.put(envelope)
