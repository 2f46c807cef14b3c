"""The gateway's gRPC servicer, ``AgentFlow`` (the package's docstring tells what it does): Solve and SolveStream
submit a query and wait for its events (``inflight.InFlight``), Feedback publishes a rating (``feedback``)."""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from dataclasses import dataclass, field

from agentflow.bus import topics
from agentflow.bus.clients import Delivery, Follower, Publisher
from agentflow.bus.codec import new_envelope
from agentflow.bus.config import BusConfig
from agentflow.domain.convert import now_ms
from agentflow.errors import AgentFlowError, InvalidInput, Reason
from agentflow.flow.loop import LoopConfig, check_query
from agentflow.proto.v1 import events_pb2, gateway_pb2, gateway_pb2_grpc
from agentflow.services.gateway.feedback import Ratings, feedback_envelope, feedback_reward, rating_digest
from agentflow.services.gateway.inflight import InFlight
from agentflow.services.gateway.keys import Caller, KeyRing

log = logging.getLogger(__package__)  # the gateway's logger: its lines read as before the split
GRPC_SERVICE = "agentflow.v1.AgentFlow"
FOLLOWED = (topics.PLANS, topics.EXECUTIONS, topics.VERDICTS, topics.ANSWERS, topics.TRAJECTORIES)


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
        self._stopping = threading.Event()
        self._publisher: Publisher | None = None
        self.keys = KeyRing(config.api_keys, config.anonymous_scopes)
        # trajectories seen on `trajectories`, for Feedback: who asked for each, and the ratings accepted for it
        self.ratings = Ratings(max_known_trajectories=config.max_known_trajectories,
                               max_per_trajectory=config.max_ratings_per_trajectory,
                               max_per_rater_per_minute=config.max_ratings_per_rater_per_minute)
        self.inflight = InFlight(max_in_flight=config.max_in_flight, max_unanswered=config.max_unanswered,
                                 trajectories_topic=bus.topic(topics.TRAJECTORIES), publish=self._publish_query,
                                 on_finished=self.ratings.remember, stopping=self._stopping)
        self._listener = Follower(bus, FOLLOWED, self.inflight.dispatch, stop=self._stopping, name="gateway",
                                  on_connect=self._on_connect, on_lost=self.inflight.resend_all)
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
            for envelope in self.inflight.events(tid, inbox, wait_s):
                if envelope.WhichOneof("payload") == "trajectory":
                    t = envelope.trajectory
                    return gateway_pb2.SolveResponse(trajectory_id=tid, answer=t.answer, status=t.status,
                                                     trajectory=t, error=t.error)
        finally:
            self.inflight.finish(tid)
        raise AssertionError("unreachable")

    def SolveStream(self, request: gateway_pb2.SolveRequest, context):
        """Each stage as it arrives, then the answer. The gateway reads the ring's topics side by side, so their order
        across topics is not kept: the answer waits for the record (which follows it), and stages the record
        overtook are sent from it, so the stream always ends with the answer."""
        tid, inbox, wait_s = self._submit(request, context)
        streamed, answer = set(), None
        try:
            for envelope in self.inflight.events(tid, inbox, wait_s):
                kind = envelope.WhichOneof("payload")
                if kind == "answer":
                    answer = envelope
                elif kind != "trajectory":
                    streamed.add(_stage_key(envelope))
                    yield _step_event(envelope)
                else:
                    *stages, from_record = _stages_of(tid, envelope.trajectory)
                    yield from (_step_event(e) for e in stages if _stage_key(e) not in streamed)
                    yield _step_event(answer or from_record)
                    return
        finally:
            self.inflight.finish(tid)

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
        digest = rating_digest(reward)
        self.ratings.accept(tid, caller, reward.author, digest)
        envelope = feedback_envelope(tid, reward, digest)
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
        options, source = events_pb2.QueryOptions(), request.source or "traffic"
        options.CopyFrom(request.options)
        if source != "traffic" or request.group_id or request.ground_truth or request.HasField("branch"):
            caller.require("train", "send source, group_id, ground_truth or branch (they teach the planner directly)")
        if options.background:
            raise InvalidInput("options.background is the gateway's to set (on training rollouts), not a caller's")
        options.background = source == "training"  # its LLM calls yield to users' (docs/serving.md)
        if not self.ready.is_set():
            raise AgentFlowError("the gateway is not connected to Kafka yet", reason=Reason.NOT_READY)
        branch = request.branch if request.HasField("branch") else None
        query = check_query(events_pb2.Query(query=request.query, options=options, ground_truth=request.ground_truth,
                                             group_id=request.group_id, source=source, branch=branch), self.loop)
        max_time = options.max_time_s or self.loop.max_time_s
        tid = uuid.uuid4().hex
        self.inflight.check_room()
        train_ok = request.train_ok if request.HasField("train_ok") else self.config.train_on_traffic
        event = events_pb2.Query(query=query, options=options, ground_truth=request.ground_truth,
                                 group_id=request.group_id, source=source, train_ok=train_ok,
                                 deadline_unix_ms=now_ms() + int(max_time * 1000), owner=caller.name,
                                 branch=branch)
        envelope = new_envelope(tid, 0, event)
        inbox = self.inflight.accept(tid, envelope, max_time + self.config.answer_grace_s)
        context.add_callback(lambda: self._client_gone(tid))  # runs when the call ends, whichever way
        try:
            self.inflight.publish(tid, envelope).get(timeout=self.bus.request_timeout_ms / 1000)
        except Exception as e:  # noqa: BLE001 - accepted all the same: kept, and published again on reconnect
            log.warning("gateway: query %s not confirmed by Kafka yet (%s); it is published again once Kafka is "
                        "back", tid, e)
        return tid, inbox, max_time + self.config.answer_grace_s

    def _caller(self, context) -> Caller:
        return self.keys.caller(str(dict(context.invocation_metadata()).get("x-api-key", "")))

    def _client_gone(self, tid: str) -> None:
        """The call of ``tid`` ended. If it was still waiting (its client cancelled or went away), tell the ring to
        stop working on it."""
        if self.inflight.abandon(tid) and self._publisher is not None:
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

    def _publish_query(self, envelope: events_pb2.Envelope) -> Delivery:
        return self._publisher.publish(topics.QUERIES, envelope)

    def _on_connect(self) -> None:
        """Runs before the listener (re)connects: open the publisher, or re-create the topics of a broker that came
        back empty; then publish again the unanswered queries whose send failed for good. ``on_lost``
        (``InFlight.resend_all``) runs after it when the topics were found re-created: only then, as a query Kafka
        still holds would come back as a duplicate (memory would send a finished record twice)."""
        if self._publisher is None:
            self._publisher = Publisher(self.bus, client_id=f"{self.bus.client_id}-gateway")  # creates the topics
        else:
            self._publisher.reset()  # back after a loss: a new producer, on re-created topics
        self.inflight.resend_failed()


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


def _step_event(envelope: events_pb2.Envelope) -> gateway_pb2.StepEvent:
    kind = envelope.WhichOneof("payload")
    event = gateway_pb2.StepEvent(trajectory_id=envelope.trajectory_id, step=envelope.step, stage=envelope.stage,
                                  summary=_summary(envelope))
    getattr(event, kind).CopyFrom(getattr(envelope, kind))
    return event


def _stage_key(envelope: events_pb2.Envelope) -> tuple[str, int]:
    kind = envelope.WhichOneof("payload")
    return kind, getattr(envelope, kind).turn.step


def _stages_of(tid: str, record) -> list[events_pb2.Envelope]:
    """The stage events a finished record stands for, in order: each turn's plan, execution and verdict (those it
    reached), then the answer."""
    stages = []
    for turn in record.turns:
        stages.append(new_envelope(tid, turn.step, events_pb2.Plan(turn=turn)))
        if turn.command or turn.tool_error or turn.result:
            stages.append(new_envelope(tid, turn.step, events_pb2.Execution(turn=turn)))
        if turn.verdict:
            stages.append(new_envelope(tid, turn.step, events_pb2.Verdict(turn=turn)))
    answer = events_pb2.Answer(answer=record.answer, status=record.status, error=record.error,
                               generator=record.generator)
    return [*stages, new_envelope(tid, len(record.turns), answer)]


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
