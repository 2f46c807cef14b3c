"""The gateway: the user API. ``AgentFlow.Solve`` waits for the whole trajectory; ``AgentFlow.SolveStream`` streams
each plan, execution, verdict and the answer as they happen.

A query becomes a ``Query`` event on ``queries``; a listener follows the ring's topics (a ``Follower``, outside any
consumer group, so every gateway replica sees every event) and hands each event to the call waiting for that
trajectory.
A query the gateway accepted is kept until its trajectory record is seen (bounded: ``max_unanswered``, and
dropped past its deadline plus ``answer_grace_s``) and published again, with the same event id, when the listener
finds the topics re-created (a broker that restarted empty has lost it) or when its send failed for good
(docs/event-bus.md, "Broker restarts"); the memory service answers a repeated query with what that trajectory is
owed.
Requests are checked before anything is published: the caller (``x-api-key`` metadata, ``keys.KeyRing``: a named key
with scopes; only ``train`` may send ``source=training``, a ``group_id`` or a ``ground_truth``), empty or oversized
query, bad options (``flow.loop.check_query``: the same check the memory service applies to what it reads from
``queries``; every field bounded, every numeric option range-checked, NaN and infinity refused).

``AgentFlow.Feedback`` rates a finished trajectory: the gateway knows the ids of the records it has seen on
``trajectories`` (the listener reads that topic from its start, so a restarted gateway knows them again; bounded by
``max_known_trajectories``) and who asked for each (``Trajectory.owner``): a key rates only its own trajectories,
unless it has the ``review`` scope. The rater is the key (``NAME``, or ``NAME/LABELLER`` for a key with the
``delegate`` scope), never a name the caller chose. The gateway bounds the ratings that change a trajectory
(``max_ratings_per_trajectory``: each makes the memory service emit the record again; the same rating again is free)
and the ratings of one rater a minute (``max_ratings_per_rater_per_minute``), and publishes a ``Feedback`` event that
the memory service joins onto the record as a ``human`` reward of that rater (docs/rewards.md).
"""

from __future__ import annotations

import hashlib
import logging
import math
import queue
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from agentflow.bus import topics
from agentflow.bus.clients import Delivery, Follower, Publisher
from agentflow.bus.codec import decode, new_envelope
from agentflow.bus.config import BusConfig
from agentflow.errors import AgentFlowError, InvalidInput, Reason
from agentflow.domain.convert import now_ms
from agentflow.flow.loop import LoopConfig, check_query
from agentflow.proto.v1 import events_pb2, gateway_pb2, gateway_pb2_grpc, trajectory_pb2
from agentflow.services.gateway.keys import Caller, KeyRing, PermissionDenied

log = logging.getLogger(__name__)
GRPC_SERVICE = "agentflow.v1.AgentFlow"
FOLLOWED = (topics.PLANS, topics.EXECUTIONS, topics.VERDICTS, topics.ANSWERS, topics.TRAJECTORIES)
_STOP_CHECK_S = 0.5  # how often a waiting call looks whether the gateway is stopping


class TimedOut(AgentFlowError):
    reason = Reason.DEADLINE_EXCEEDED


class ClientGone(AgentFlowError):
    reason = Reason.CANCELLED


_GONE = object()  # put in a call's inbox when its client went away


@dataclass(frozen=True)
class GatewayConfig:
    api_keys: tuple[str, ...] = field(default=(), metadata={
        "help": "accepted keys, NAME:SCOPE+SCOPE:sha256:HEX each (agentflow keys new); empty: every caller is "
                "anonymous with anonymous_scopes"})
    anonymous_scopes: tuple[str, ...] = field(default=("solve", "feedback"), metadata={
        "help": "what a caller may do when no api_keys are set (solve, feedback, train, review, delegate)"})
    answer_grace_s: float = field(default=30.0, metadata={"help": "wait this long past a query's budget"})
    max_unanswered: int = field(default=10000, metadata={
        "help": "accepted queries kept for re-publishing until answered; past it new ones are refused"})
    allow_anonymous: bool = field(default=False, metadata={
        "help": "serve beyond loopback without API keys (anyone who reaches the gateway may submit queries)"})
    train_on_traffic: bool = field(default=False, metadata={
        "help": "whether a query that does not say (SolveRequest.train_ok unset) may be replayed for training; a "
                "request's own train_ok=false is never overridden"})
    max_known_trajectories: int = field(default=200_000, metadata={
        "help": "finished trajectory ids remembered for Feedback (the oldest are forgotten first)"})
    max_ratings_per_trajectory: int = field(default=20, metadata={
        "help": "ratings that change a trajectory (each makes the memory service emit the record again), counted "
                "over all its raters, alternating scores included; a rater's same rating again is always accepted; "
                "past it RESOURCE_EXHAUSTED"})
    max_ratings_per_rater_per_minute: int = field(default=600, metadata={
        "help": "ratings one rater (a key, or a delegated person) may send in a minute; past it RESOURCE_EXHAUSTED"})
    max_request_kb: int = field(default=512, metadata={
        "help": "largest request body in KiB (a query and a ground truth of max_query_bytes each fit); a larger one "
                "is refused by gRPC (RESOURCE_EXHAUSTED) before it is parsed"})
    max_in_flight: int = field(default=256, metadata={
        "help": "Solve/SolveStream calls waiting at once (each holds a gRPC thread while it waits); past it "
                "RESOURCE_EXHAUSTED. The gateway's thread pool is sized to this plus 8, so health checks always "
                "find a thread"})


class Gateway(gateway_pb2_grpc.AgentFlowServicer):
    name = "gateway"
    public_api = True  # the user API: callers authenticate with an API key, not the internal service token

    def __init__(self, bus: BusConfig, loop: LoopConfig = LoopConfig(), config: GatewayConfig = GatewayConfig()):
        self.bus, self.loop, self.config = bus, loop, config
        self._waiters: dict[str, queue.Queue] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._publisher: Publisher | None = None
        # tid -> (query, until, its latest Delivery): kept until answered, published again if Kafka lost it
        self._unanswered: OrderedDict[str, tuple[events_pb2.Envelope, float, Delivery | None]] = OrderedDict()
        # trajectories seen on `trajectories`, for Feedback: who asked for each, and the ratings accepted for it
        self._finished: OrderedDict[str, _Finished] = OrderedDict()
        self._rated_at: dict[str, list[float]] = {}  # rater -> times of their ratings in the last minute
        self.keys = KeyRing(config.api_keys, config.anonymous_scopes)
        self._trajectories_topic = bus.topic(topics.TRAJECTORIES)
        self._listener = Follower(bus, FOLLOWED, self._dispatch, stop=self._stopping, name="gateway",
                                  on_connect=self._on_connect, on_lost=self._on_lost)
        self.ready = self._listener.ready  # set once the publisher is open and the listener's partitions assigned

    def register(self, server) -> None:
        """Like the generated registration, but a request that is not a SolveRequest becomes INVALID_ARGUMENT (gRPC
        would answer INTERNAL for a deserializer error)."""
        import grpc

        handlers = {
            "Solve": grpc.unary_unary_rpc_method_handler(
                self.Solve, request_deserializer=_parser(gateway_pb2.SolveRequest),
                response_serializer=gateway_pb2.SolveResponse.SerializeToString),
            "SolveStream": grpc.unary_stream_rpc_method_handler(
                self.SolveStream, request_deserializer=_parser(gateway_pb2.SolveRequest),
                response_serializer=gateway_pb2.StepEvent.SerializeToString),
            "Feedback": grpc.unary_unary_rpc_method_handler(
                self.Feedback, request_deserializer=_parser(gateway_pb2.FeedbackRequest),
                response_serializer=gateway_pb2.FeedbackResponse.SerializeToString),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(GRPC_SERVICE, handlers),))

    # --- the API -------------------------------------------------------------------------------------------------
    def Solve(self, request: gateway_pb2.SolveRequest, context) -> gateway_pb2.SolveResponse:
        tid, inbox, wait_s = self._submit(request, context)
        try:
            for envelope in self._events(inbox, wait_s, tid):
                if envelope.WhichOneof("payload") == "trajectory":
                    t = envelope.trajectory
                    return gateway_pb2.SolveResponse(trajectory_id=tid, answer=t.answer, status=t.status,
                                                     trajectory=t, error=t.error)
        finally:
            self._forget(tid)
        raise AssertionError("unreachable")

    def SolveStream(self, request: gateway_pb2.SolveRequest, context):
        tid, inbox, wait_s = self._submit(request, context)
        try:
            for envelope in self._events(inbox, wait_s, tid):
                kind = envelope.WhichOneof("payload")
                if kind == "trajectory":
                    return
                event = gateway_pb2.StepEvent(trajectory_id=tid, step=envelope.step, stage=envelope.stage,
                                              summary=_summary(envelope))
                getattr(event, kind).CopyFrom(getattr(envelope, kind))
                yield event
        finally:
            self._forget(tid)

    def Feedback(self, request: gateway_pb2.FeedbackRequest, context) -> gateway_pb2.FeedbackResponse:
        """Check the rating, then publish it for the memory service to join (confirmed by Kafka before the reply: a
        caller that gets an error may simply call again, the same call is idempotent)."""
        caller = self._caller(context)
        caller.require("feedback", "rate answers")
        if isinstance(request, Malformed):
            raise InvalidInput(f"the request is not a valid agentflow.v1.FeedbackRequest ({request.error})")
        reward = feedback_reward(request, caller)
        tid = request.trajectory_id
        if not self.ready.is_set() or self._publisher is None:
            raise AgentFlowError("the gateway is not connected to Kafka yet", reason=Reason.NOT_READY)
        digest = hashlib.sha256(reward.SerializeToString(deterministic=True)).hexdigest()[:16]
        self._accept_rating(tid, caller, reward.author, digest)
        envelope = new_envelope(tid, 0, events_pb2.Feedback(trajectory_id=tid, reward=reward, author=reward.author),
                                stage=f"feedback-{digest}")
        try:
            self._publisher.publish(topics.FEEDBACK, envelope).get(timeout=self.bus.request_timeout_ms / 1000)
        except Exception as e:  # noqa: BLE001 - not confirmed: the caller is told and may call again
            raise AgentFlowError(f"Kafka did not confirm the feedback ({type(e).__name__}); call again",
                                 reason=Reason.NOT_READY) from None
        return gateway_pb2.FeedbackResponse(trajectory_id=tid, event_id=envelope.event_id)

    def _submit(self, request, context) -> tuple[str, queue.Queue, float]:
        caller = self._caller(context)
        caller.require("solve", "ask queries")
        if isinstance(request, Malformed):
            raise InvalidInput(f"the request is not a valid agentflow.v1.SolveRequest ({request.error})")
        options, source = request.options, request.source or "traffic"
        if source != "traffic" or request.group_id or request.ground_truth:
            caller.require("train", "send source, group_id or ground_truth (they teach the planner directly)")
        if not self.ready.is_set():
            raise AgentFlowError("the gateway is not connected to Kafka yet", reason=Reason.NOT_READY)
        query = check_query(events_pb2.Query(query=request.query, options=options, ground_truth=request.ground_truth,
                                             group_id=request.group_id, source=source), self.loop)
        max_time = options.max_time_s or self.loop.max_time_s
        tid = uuid.uuid4().hex
        inbox: queue.Queue = queue.Queue()
        with self._lock:
            if self.config.max_in_flight and len(self._waiters) >= self.config.max_in_flight:
                raise AgentFlowError(f"{len(self._waiters)} calls are in flight, the most this gateway serves at "
                                     "once; try again later", reason=Reason.RESOURCE_EXHAUSTED)
        train_ok = request.train_ok if request.HasField("train_ok") else self.config.train_on_traffic
        event = events_pb2.Query(query=query, options=options, ground_truth=request.ground_truth,
                                 group_id=request.group_id, source=source, train_ok=train_ok,
                                 deadline_unix_ms=now_ms() + int(max_time * 1000), owner=caller.name)
        envelope = new_envelope(tid, 0, event)
        with self._lock:
            self._keep(tid, envelope, max_time + self.config.answer_grace_s)
            self._waiters[tid] = inbox
        context.add_callback(lambda: self._client_gone(tid))  # runs when the call ends, whichever way
        try:
            self._published(tid, envelope).get(timeout=self.bus.request_timeout_ms / 1000)
        except Exception as e:  # noqa: BLE001 - accepted all the same: kept, and published again on reconnect
            log.warning("gateway: query %s not confirmed by Kafka yet (%s); it is published again once Kafka is "
                        "back", tid, e)
        return tid, inbox, max_time + self.config.answer_grace_s

    def _keep(self, tid: str, envelope: events_pb2.Envelope, keep_s: float) -> None:
        """Remember an accepted query until its trajectory is seen (under the lock); refuses past the bound."""
        now = time.monotonic()
        while self._unanswered and next(iter(self._unanswered.values()))[1] < now:
            self._unanswered.popitem(last=False)  # past its deadline and grace: nobody waits for it any more
        if len(self._unanswered) >= self.config.max_unanswered:
            raise AgentFlowError(f"{len(self._unanswered)} queries are waiting for their answers; try again later",
                                 reason=Reason.RESOURCE_EXHAUSTED)
        self._unanswered[tid] = (envelope, now + keep_s, None)

    def _events(self, inbox: queue.Queue, wait_s: float, tid: str):
        """The trajectory's events in arrival order, ending with its record; raises TimedOut after ``wait_s`` without
        an event, and gives up once the gateway stops (a waiting call must not keep a stopped process alive)."""
        seen = set()
        while True:
            deadline = time.monotonic() + wait_s
            while True:
                if self._stopping.is_set():
                    raise AgentFlowError(f"the gateway stopped before trajectory {tid} finished", reason=Reason.NOT_READY)
                try:
                    envelope = inbox.get(timeout=max(0.0, min(_STOP_CHECK_S, deadline - time.monotonic())))
                    if envelope is _GONE:
                        raise ClientGone(f"the caller of trajectory {tid} went away")
                    break
                except queue.Empty:
                    if time.monotonic() >= deadline:
                        raise TimedOut(f"trajectory {tid} did not finish within {wait_s:.0f} s") from None
            if envelope.event_id in seen:
                continue  # at-least-once delivery upstream
            seen.add(envelope.event_id)
            yield envelope
            if envelope.WhichOneof("payload") == "trajectory":
                return

    def _caller(self, context) -> Caller:
        return self.keys.caller(str(dict(context.invocation_metadata()).get("x-api-key", "")))

    def _forget(self, tid: str) -> None:
        with self._lock:
            self._waiters.pop(tid, None)

    def _client_gone(self, tid: str) -> None:
        """The call of ``tid`` ended. If it was still waiting (its client cancelled or went away), wake it, stop
        keeping its query, and tell the ring to stop working on it."""
        with self._lock:
            inbox = self._waiters.pop(tid, None)
            if inbox is None:
                return  # answered (or failed) before the call ended
            self._unanswered.pop(tid, None)
        inbox.put(_GONE)
        if self._publisher is not None:
            cancel = events_pb2.Cancel(reason="the caller went away")
            self._publisher.publish(topics.QUERIES, new_envelope(tid, 0, cancel))

    # --- the listener --------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._listener.start()

    def stop(self) -> None:
        """Calls still waiting give up; the publisher gets a bounded close (``Publisher.CLOSE_TIMEOUT_S``) that logs
        what Kafka did not confirm, so a broker that is gone cannot hold up the stop."""
        self._stopping.set()
        if self._publisher is not None:
            self._publisher.close()

    def _published(self, tid: str, envelope: events_pb2.Envelope) -> Delivery:
        """Publish an accepted query (again: same event id) and keep its delivery with it."""
        delivery = self._publisher.publish(topics.QUERIES, envelope)
        with self._lock:
            if tid in self._unanswered:
                self._unanswered[tid] = (*self._unanswered[tid][:2], delivery)
        return delivery

    def _on_connect(self) -> None:
        """Runs before the listener (re)connects: open the publisher, or re-create the topics of a broker that came
        back empty; then publish again the unanswered queries whose send failed for good (the Publisher itself
        re-sends a failed record for ``RESEND_WITHIN_S``)."""
        if self._publisher is None:
            self._publisher = Publisher(self.bus, client_id=f"{self.bus.client_id}-gateway")  # creates the topics
        else:
            self._publisher.reset()  # back after a loss: a new producer, on re-created topics
        self._publish_again(lambda delivery: delivery is not None and delivery.failed(), "whose send had failed")

    def _on_lost(self) -> None:
        """The broker came back without its topics: every accepted query not answered yet goes out again. Only
        then: a query Kafka still holds would come back as a duplicate (memory would send a finished record
        twice)."""
        self._publish_again(lambda _delivery: True, "after the broker lost its topics")

    def _publish_again(self, which, why: str) -> None:
        with self._lock:
            again = [(tid, envelope) for tid, (envelope, _until, delivery) in self._unanswered.items()
                     if which(delivery)]
        for tid, envelope in again:
            self._published(tid, envelope)
        if again:
            log.warning("gateway: published %d unanswered queries again, %s", len(again), why)

    def _dispatch(self, record) -> None:
        tid = (record.key or b"").decode(errors="replace")
        finished = record.topic == self._trajectories_topic
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
            self._remember_finished(tid, envelope.trajectory.owner)
        if inbox is None and tid not in self._unanswered:
            return
        if envelope.WhichOneof("payload") == "trajectory":
            with self._lock:
                self._unanswered.pop(tid, None)
        if inbox is not None:
            inbox.put(envelope)

    def _accept_rating(self, tid: str, caller: Caller, rater: str, digest: str) -> None:
        """A known trajectory that ``caller`` may rate, with room for one more rating that changes it (the rater's
        current rating again always has room: a caller retrying an unconfirmed call must get through)."""
        with self._lock:
            finished = self._finished.get(tid)
            if finished is None:
                raise UnknownTrajectory(f"no finished trajectory {tid[:64]!r} (give the trajectory_id that Solve "
                                        "returned, once it has answered)")
            if finished.owner != caller.name and "review" not in caller.scopes:
                raise PermissionDenied(f"the key {caller.name!r} may rate only the trajectories it asked for "
                                       "(rating others needs the scope 'review')")
            if finished.ratings.get(rater) == digest:
                return
            if finished.changes >= self.config.max_ratings_per_trajectory:
                raise AgentFlowError(f"trajectory {tid[:64]!r} was rated {finished.changes} times, the most this "
                                     "gateway accepts for one", reason=Reason.RESOURCE_EXHAUSTED)
            self._rate_limit(rater)
            finished.ratings[rater] = digest
            finished.changes += 1

    def _rate_limit(self, rater: str) -> None:
        """At most ``max_ratings_per_rater_per_minute`` ratings of one rater in any minute (under the lock)."""
        now = time.monotonic()
        recent = [t for t in self._rated_at.get(rater, ()) if t > now - 60.0]
        if len(recent) >= self.config.max_ratings_per_rater_per_minute:
            raise AgentFlowError(f"rater {rater[:80]!r} sent {len(recent)} ratings in the last minute, the most this "
                                 "gateway accepts; try again later", reason=Reason.RESOURCE_EXHAUSTED)
        self._rated_at[rater] = recent + [now]
        if len(self._rated_at) > self.config.max_known_trajectories:  # bounded: forget raters idle for a minute
            self._rated_at = {r: ts for r, ts in self._rated_at.items() if ts[-1] > now - 60.0}

    def _remember_finished(self, tid: str, owner: str) -> None:
        with self._lock:
            self._finished.setdefault(tid, _Finished(owner))
            self._finished.move_to_end(tid)
            while len(self._finished) > self.config.max_known_trajectories:
                self._finished.popitem(last=False)


@dataclass
class _Finished:
    """What the gateway keeps of a finished trajectory for Feedback: who asked, and the ratings it accepted."""

    owner: str
    ratings: dict[str, str] = field(default_factory=dict)  # rater -> digest of their current rating
    changes: int = 0  # ratings accepted that changed the record


class UnknownTrajectory(AgentFlowError):
    reason = Reason.NOT_FOUND


MAX_COMMENT_CHARS = 2000
MAX_LABELLER_CHARS = 128


def feedback_reward(request: gateway_pb2.FeedbackRequest, caller: Caller) -> trajectory_pb2.Reward:
    """The ``human`` reward ``caller``'s rating asks for, authored by the rater (the key's name, or ``NAME/LABELLER``
    for a key that may ``delegate``: a labeller is otherwise only a note in the detail); InvalidInput names what is
    wrong with it."""
    tid = request.trajectory_id
    if not tid or len(tid) > 64 or not tid.isascii() or not tid.isprintable():
        raise InvalidInput("trajectory_id must be the id Solve returned (1-64 printable ASCII characters)")
    kind = request.WhichOneof("rating")
    if kind is None:
        raise InvalidInput("a rating is required: score in [0, 1] or thumbs_up")
    value = float(request.thumbs_up) if kind == "thumbs_up" else request.score
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise InvalidInput(f"score must be a number in [0, 1], got {value!r}")
    if len(request.comment) > MAX_COMMENT_CHARS:
        raise InvalidInput(f"comment is {len(request.comment)} characters; at most {MAX_COMMENT_CHARS}")
    labeller = request.labeller
    if len(labeller) > MAX_LABELLER_CHARS or not labeller.isprintable():
        raise InvalidInput(f"labeller must be at most {MAX_LABELLER_CHARS} printable characters")
    if labeller and "delegate" in caller.scopes:
        return trajectory_pb2.Reward(value=value, source="human", detail=request.comment,
                                     author=f"{caller.name}/{labeller}")
    detail = f"[labeller {labeller}] {request.comment}".strip() if labeller else request.comment
    return trajectory_pb2.Reward(value=value, source="human", detail=detail, author=caller.name)


class Malformed:
    """Stands in for a request body that did not parse, so the handler can refuse it with a clear status."""

    def __init__(self, error: str):
        self.error = error


def _parser(message_type):
    """A request deserializer that turns a body that does not parse into ``Malformed`` (refused with a clear status
    by the handler; gRPC would answer INTERNAL for a deserializer error)."""
    def parse(data: bytes):
        try:
            return message_type.FromString(data)
        except Exception as e:  # protobuf raises DecodeError, and others for some corrupt inputs
            return Malformed(f"{type(e).__name__}: {e}")

    return parse


def _turn_summary(stage: str, turn) -> str:
    if stage == "plan" and turn.parse_error:
        return f"unreadable plan ({turn.parse_error})"
    if stage == "plan":
        return f"{turn.decision.tool}: {turn.decision.sub_goal}"
    if stage == "execution":
        return f"error {turn.tool_error}" if turn.tool_error else f"result {turn.result[:200]}"
    return turn.verdict


def _summary(envelope: events_pb2.Envelope) -> str:
    kind = envelope.WhichOneof("payload")
    if kind in ("plan", "execution", "verdict"):
        turn = getattr(envelope, kind).turn
        return f"step {turn.step + 1}: " + _turn_summary(kind, turn)
    if kind == "answer":
        return f"answer ({envelope.answer.status}): {envelope.answer.answer[:200]}"
    return kind or ""
