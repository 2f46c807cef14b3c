"""The memory service: owns every trajectory's state and drives the ring (also ``Memory.Get/List`` over gRPC).

  queries  -> memory.updated (step 0)
  verdicts -> memory.updated (next step) | finalize (STOP, max_steps, or the steps' deadline passed)
  answers  -> trajectories (the complete record; with ground truth, scored by the rule reward)
  feedback -> trajectories (the record again, with the reward joined; at most ``max_feedback_emits`` times)
  cancel (on queries) -> trajectories (the record so far, status "cancelled": its caller went away)
  deadletter -> trajectories (a worker gave up on one of its stage events: the record so far, status "error")

Every trajectory ends: a stage event that a worker dead-letters (a handler that fails on every attempt) would
leave its trajectory waiting for ever, so its dead letter closes it.

Handling is idempotent: the first event for a step wins and later duplicates are dropped, so at-least-once delivery
upstream is harmless. A query again for a finished trajectory gets its record again only if the record went out
before the worker last (re)joined its group (the broker may have lost it); otherwise the broker holds it already and
a second copy would count it twice. Each state change is written to the compacted ``memory.changelog`` topic after
the outputs, and replayed at start-up; trajectories still in flight then get their pending event again (duplicates
are dropped).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass

from agentflow.bus import topics
from agentflow.bus.codec import STAGES, new_envelope
from agentflow.config import setting
from agentflow.errors import AgentFlowError, InvalidInput, Reason
from agentflow.domain import trajectory
from agentflow.flow import stages
from agentflow.domain.convert import deadline_from_ms, from_dict, now_ms, record_from_proto, to_dict
from agentflow.flow.loop import LoopConfig, check_query
from agentflow.domain.memory import Memory
from agentflow.rewards import get_kind, score_record
from agentflow.proto.v1 import events_pb2, modules_pb2, modules_pb2_grpc, trajectory_pb2
from agentflow.services.memory.metrics import trajectory_metrics

GRPC_SERVICE = "agentflow.v1.Memory"
_CLIP = 1000  # characters of a refused query's fields kept in its error record
Outputs = list[tuple[str, events_pb2.Envelope]]
#: The events of a trajectory on its way round the ring (Envelope.stage): one dead-lettered ends the trajectory.
STAGE_EVENTS = frozenset(STAGES[name] for name in ("query", "memory_updated", "plan", "execution", "verdict",
                                                    "finalize", "answer", "cancel"))
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemorySettings:
    """The memory service's settings (AGENTFLOW_MEMORY_*)."""

    max_feedback_emits: int = setting(32, "times one finished record goes out again on `trajectories` for feedback "
                                          "that changed its rewards; past it that trajectory's feedback is dropped "
                                          "(counted, logged once). 0: feedback never joins a finished record")

    def __post_init__(self):
        if self.max_feedback_emits < 0:
            raise InvalidInput(f"memory max_feedback_emits must not be negative, got {self.max_feedback_emits}")


class NotFound(AgentFlowError):
    reason = Reason.NOT_FOUND


class MemoryService(modules_pb2_grpc.MemoryServicer):
    name = "memory"
    input_topics = (topics.QUERIES, topics.VERDICTS, topics.ANSWERS, topics.FEEDBACK, topics.DEADLETTER)

    def __init__(self, config: LoopConfig = LoopConfig(), max_kept: int = 100_000, reward_kind: str = "math",
                 settings: MemorySettings = MemorySettings()):
        get_kind(reward_kind)  # an unknown kind fails at start, not on the first answer
        self.config, self.settings = config, settings
        self.reward_kind = reward_kind  # the rule that scores an answer against a query's ground truth
        self.max_kept = max_kept  # finished trajectories kept for Get/List and duplicate detection
        self.states: dict[str, events_pb2.MemoryState] = {}
        self.recorded_in: dict[str, int] = {}  # trajectory -> the worker generation its finished record went out in
        self.feedback_warned: set[str] = set()  # trajectories whose feedback was dropped, logged once
        self.generation = lambda: None  # the consuming worker's (bind_worker); None: unknown, always send again
        self.lock = threading.Lock()

    def bind_worker(self, worker) -> None:
        self.generation = lambda: worker.generation

    def register(self, server) -> None:
        modules_pb2_grpc.add_MemoryServicer_to_server(self, server)

    # --- the ring ------------------------------------------------------------------------------------------------
    def handle(self, envelope: events_pb2.Envelope) -> Outputs:
        handler = {"query": self._on_query, "verdict": self._on_verdict, "answer": self._on_answer,
                   "feedback": self._on_feedback, "cancel": self._on_cancel,
                   "dead_letter": self._on_dead_letter}.get(envelope.WhichOneof("payload"))
        if handler is None:
            raise AgentFlowError(f"memory service does not take {envelope.WhichOneof('payload')} events",
                                 reason=Reason.INVALID_INPUT)
        with self.lock:
            return handler(envelope)

    def _on_query(self, envelope) -> Outputs:
        tid, query = envelope.trajectory_id, envelope.query
        if tid in self.states:  # a redelivered or re-published query: send again what the trajectory is owed
            if self.generation() is not None and self.recorded_in.get(tid) == self.generation():
                return []  # its record went out since the worker last (re)joined: this broker holds it already
            return self._save(tid, self.states[tid], self._owed(tid, self.states[tid]))
        try:
            check_query(query, self.config)  # the gateway's limits: a record written to `queries` directly skips it
            memory, first_step = self._starting_state(query)
        except (InvalidInput, NotFound) as e:
            return self._refuse(tid, query, f"{e.reason}: {e}")
        max_steps = query.options.max_steps or self.config.max_steps
        max_time = query.options.max_time_s or self.config.max_time_s
        start = now_ms()
        latest = start + int(self.config.max_time_limit_s * 1000)  # no deadline beyond what the gateway would give
        deadline = min(query.deadline_unix_ms or start + int(max_time * 1000), latest)
        steps_deadline = deadline - int((deadline - start) * self.config.answer_reserve)
        record = trajectory.new_record(tid, query.group_id, query.query, query.ground_truth,
                                       query.source or "traffic", start / 1000, train_ok=query.train_ok,
                                       owner=query.owner)
        record["trace_id"] = _trace_id()  # the consumer span continues the gateway's trace
        record["analysis"] = memory.analysis  # a branch's, which its planner does not make again
        state = events_pb2.MemoryState(
            record=from_dict(_storable(record), trajectory_pb2.Trajectory), memory=memory.to_proto(),
            options=query.options, max_steps=max_steps, steps_deadline_unix_ms=steps_deadline,
            deadline_unix_ms=deadline, phase="running", first_step=first_step)
        return self._save(tid, state, self._next_step(tid, state))

    def _starting_state(self, query) -> tuple[Memory, int]:
        """The memory a query starts from and its steps: an empty one, or for a shadow branch (``Query.branch``) the
        state of the finished trajectory it names after ``branch.turn`` turns. NotFound when that trajectory is not
        kept (unknown, forgotten, or not finished), InvalidInput when it may not be branched there."""
        if not query.HasField("branch"):
            return Memory(query.query), 0
        point = query.branch
        origin = self.states.get(point.trajectory_id)
        if origin is None or origin.phase != "done":
            raise NotFound(f"branch: no finished trajectory {point.trajectory_id[:80]!r} is kept here")
        record = record_from_proto(origin.record)
        if record["query"] != query.query:
            raise InvalidInput(f"branch: trajectory {point.trajectory_id!r} answered another query")
        if not trajectory.may_branch(record, point.turn):
            raise InvalidInput(f"branch: trajectory {point.trajectory_id!r} ({record['source']}, {record['status']}, "
                               f"{len(record['turns'])} turns) may not be branched after turn {point.turn}")
        return Memory.from_proto(origin.memory).after(point.turn), point.turn

    def _refuse(self, tid: str, query, error: str) -> Outputs:
        """A query the limits refuse (or one this service failed on) ends at once: a finished record with status
        "error", as a caller waiting for it (or a sink) expects one, holding the reason and the start of the query."""
        record = trajectory.new_record(tid, query.group_id[:_CLIP], query.query[:_CLIP], query.ground_truth[:_CLIP],
                                       query.source if query.source in trajectory.SOURCES else "traffic", time.time())
        record.update(status="error", error=error, trace_id=_trace_id())
        trajectory.finish(record, Memory(record["query"]), 0.0)
        return self._finish(tid, events_pb2.MemoryState(memory=Memory(record["query"]).to_proto()), record)

    def _on_verdict(self, envelope) -> Outputs:
        tid, verdict = envelope.trajectory_id, envelope.verdict
        state = self.states.get(tid)
        if state is None or state.phase != "running" or verdict.turn.step != _step(state):
            return []  # unknown, finished, or a duplicate of a step already recorded
        state.record.turns.append(stages.finish_turn(verdict.turn))
        if verdict.HasField("analysis_call"):
            state.record.analysis_call.CopyFrom(verdict.analysis_call)
            state.record.analysis = verdict.memory.analysis
        state.memory.CopyFrom(verdict.memory)
        return self._save(tid, state, self._next_step(tid, state, verdict.turn.verdict))

    def _next_step(self, tid: str, state, verdict: str = "") -> Outputs:
        step = _step(state)
        reason = stages.next_action(step, state.max_steps, deadline_from_ms(state.steps_deadline_unix_ms), verdict)
        if reason != stages.CONTINUE:
            state.phase, state.finish_reason = "finalizing", reason
            finalize = events_pb2.Finalize(memory=state.memory, reason=reason, turns=step, options=state.options,
                                           deadline_unix_ms=state.deadline_unix_ms)
            return [(topics.FINALIZE, new_envelope(tid, step, finalize))]
        update = events_pb2.MemoryUpdated(
            memory=state.memory, step=step, steps_left=state.max_steps - step,
            time_left_s=max(0.0, (state.steps_deadline_unix_ms - now_ms()) / 1000), options=state.options,
            deadline_unix_ms=state.steps_deadline_unix_ms, planner_version=_first_planner_version(state.record))
        return [(topics.MEMORY_UPDATED, new_envelope(tid, step, update))]

    def _on_answer(self, envelope) -> Outputs:
        tid, answer = envelope.trajectory_id, envelope.answer
        state = self.states.get(tid)
        if state is None or state.phase == "done":
            return []
        record = record_from_proto(state.record)
        record.update(answer=answer.answer, status=answer.status, error=answer.error,
                      generator=to_dict(answer.generator) if answer.HasField("generator") else {})
        latency = time.time() - record["started_at_unix"]
        trajectory.finish(record, Memory.from_proto(state.memory), latency)
        score_record(record, self.reward_kind)  # the verifiable outcome reward, for the trainer and rollouts
        return self._finish(tid, state, record)

    def _on_cancel(self, envelope) -> Outputs:
        """The caller went away: the trajectory ends now, status "cancelled" (no answer is generated; the events
        still on their way are dropped as for any finished trajectory)."""
        tid = envelope.trajectory_id
        state = self.states.get(tid)
        if state is None or state.phase == "done":
            return []
        return self._end(tid, state, "cancelled", f"cancelled: {envelope.cancel.reason or 'by the caller'}")

    def _on_dead_letter(self, envelope) -> Outputs:
        """A worker gave up on one of a trajectory's stage events: nothing would come next, so the trajectory ends
        now, status "error", naming the stage and why. A dead letter of anything else, of a finished trajectory or
        of a step already recorded (a stale duplicate failed) changes nothing."""
        tid, letter = envelope.trajectory_id, envelope.dead_letter
        if letter.origin_stage not in STAGE_EVENTS:
            return []
        error = (f"stage_failed: {letter.worker.split('@')[0] or 'a worker'} gave up on the {letter.origin_stage} "
                 f"event of step {envelope.step} after {letter.attempts} attempt(s): {letter.error}")
        state = self.states.get(tid)
        if state is None:  # this service failed on the query itself, so kept nothing
            return self._refuse(tid, events_pb2.Query(), error) if letter.origin_stage == STAGES["query"] else []
        if state.phase == "done" or envelope.step < len(state.record.turns):
            return []
        return self._end(tid, state, "error", error)

    def _end(self, tid: str, state, status: str, error: str) -> Outputs:
        """End a trajectory in flight now with its record so far (no answer is generated; the events still on
        their way are dropped as for any finished trajectory)."""
        record = record_from_proto(state.record)
        record.update(status=status, error=error)
        trajectory.finish(record, Memory.from_proto(state.memory), time.time() - record["started_at_unix"])
        return self._finish(tid, state, record)

    def _finish(self, tid: str, state, record: dict) -> Outputs:
        """The trajectory is done: keep its closed ``record`` and emit it on ``trajectories``."""
        state.record.CopyFrom(from_dict(_storable(record), trajectory_pb2.Trajectory))
        state.phase = "done"
        self.recorded_in[tid] = self.generation()
        trajectory_metrics().finished_record(record, _first_planner_version(state.record))
        self._forget_oldest()
        return self._save(tid, state, [(topics.TRAJECTORIES, new_envelope(tid, len(record["turns"]), state.record))])

    def _on_feedback(self, envelope) -> Outputs:
        """Join a reward (a person's feedback, a judge's verdict) onto its trajectory; a finished record goes out
        again with it. A reward with an author replaces that author's earlier reward of the same source; the same
        reward again (or the same event) changes nothing. A value that is not a finite number is dropped, and so is
        any new reward once the record went out again ``max_feedback_emits`` times (e.g. ratings flipping 0, 1, 0,
        ...: each would emit the whole record)."""
        feedback = envelope.feedback
        tid = feedback.trajectory_id or envelope.trajectory_id
        state = self.states.get(tid)
        if state is None or not math.isfinite(feedback.reward.value):
            return []
        reward = trajectory_pb2.Reward()
        reward.CopyFrom(feedback.reward)
        reward.author = reward.author or feedback.author
        if not reward.author:
            reward.detail = reward.detail or envelope.event_id  # an anonymous reward: its event tells repeats apart
        rewards = state.record.rewards
        if any(r == reward or r.detail == envelope.event_id for r in rewards):
            return []  # the same feedback again
        if state.phase == "done" and state.feedback_emits >= self.settings.max_feedback_emits:
            return self._drop_feedback(tid)
        if reward.author:
            kept = [r for r in rewards if not (r.author == reward.author and r.source == reward.source)]
            del rewards[:]
            rewards.extend(kept)
        rewards.append(reward)
        if state.phase == "done":
            trajectory_metrics().reward(reward.source, reward.value, _first_planner_version(state.record))
        outputs = []
        if state.phase == "done":
            state.feedback_emits += 1
            out = new_envelope(tid, len(state.record.turns), state.record, stage=f"feedback-{envelope.event_id}")
            outputs.append((topics.TRAJECTORIES, out))
        return self._save(tid, state, outputs)

    def _drop_feedback(self, tid: str) -> Outputs:
        trajectory_metrics().feedback_dropped.inc()
        if tid not in self.feedback_warned:
            self.feedback_warned.add(tid)
            log.warning("memory: trajectory %s went out again for feedback %d times (max_feedback_emits); its "
                        "further feedback is dropped", tid, self.settings.max_feedback_emits)
        return []

    def _save(self, tid: str, state, outputs: Outputs) -> Outputs:
        """Keep the new state; its changelog record goes out after the outputs (see the module docstring)."""
        self.states[tid] = state
        snapshot = events_pb2.MemoryState()
        snapshot.CopyFrom(state)
        step = len(state.record.turns)
        return outputs + [(topics.MEMORY_CHANGELOG, new_envelope(tid, step, snapshot, stage=f"state-{state.phase}"))]

    def _forget_oldest(self) -> None:
        done = [tid for tid, s in self.states.items() if s.phase == "done"]
        for tid in done[: max(0, len(done) - self.max_kept)]:
            del self.states[tid]
            self.recorded_in.pop(tid, None)
            self.feedback_warned.discard(tid)

    # --- recovery ------------------------------------------------------------------------------------------------
    def restore(self, changelog: list[events_pb2.Envelope]) -> Outputs:
        """Rebuild state from the changelog (latest record per trajectory wins) and return the events still owed by
        trajectories in flight."""
        with self.lock:
            for envelope in changelog:
                self.states[envelope.trajectory_id] = envelope.memory_state
            return [output for tid, state in self.states.items() if state.phase != "done"
                    for output in self._owed(tid, state)]

    def _owed(self, tid: str, state) -> Outputs:
        """The event a trajectory waits for, again (same event id): its next step, its finalize, or its record.
        After a broker restart that lost the ring's events, the gateway's re-published query brings it here."""
        if state.phase == "running":
            return self._next_step(tid, state)
        if state.phase == "finalizing":
            finalize = events_pb2.Finalize(memory=state.memory, reason=state.finish_reason,
                                           turns=_step(state), options=state.options,
                                           deadline_unix_ms=state.deadline_unix_ms)
            return [(topics.FINALIZE, new_envelope(tid, _step(state), finalize))]
        return [(topics.TRAJECTORIES, new_envelope(tid, len(state.record.turns), state.record))]

    def recover(self, bus) -> None:
        """Replay the changelog (until it goes quiet), then publish what trajectories in flight are owed."""
        from agentflow.bus.clients import Publisher, TopicReader

        publisher = Publisher(bus, client_id=f"{bus.client_id}-memory-recovery")  # also creates the topics
        try:
            with TopicReader(bus, topics.MEMORY_CHANGELOG) as reader:
                while reader.poll(0.3):
                    pass
                owed = self.restore([r.envelope() for r in reader.records])
            for topic, envelope in owed:
                publisher.publish(topic, envelope)
            publisher.flush()
        finally:
            publisher.close()

    # --- gRPC ----------------------------------------------------------------------------------------------------
    def Get(self, request: modules_pb2.MemoryGetRequest, context) -> modules_pb2.MemoryGetResponse:
        with self.lock:
            state = self.states.get(request.trajectory_id)
            if state is None:
                raise NotFound(f"no trajectory {request.trajectory_id!r}")
            return modules_pb2.MemoryGetResponse(trajectory=state.record, finished=state.phase == "done")

    def List(self, request: modules_pb2.MemoryListRequest, context) -> modules_pb2.MemoryListResponse:
        if request.page_size < 0:
            raise InvalidInput(f"page_size must not be negative, got {request.page_size}")
        size = min(request.page_size or 100, 1000)
        token = request.page_token or "0"
        if not (token.isascii() and token.isdigit() and len(token) <= 18):
            raise InvalidInput(f"page_token {token[:40]!r} is not one this service issued")
        start = int(token)
        with self.lock:
            rows = [modules_pb2.TrajectorySummary(
                trajectory_id=tid, group_id=s.record.group_id, query=s.record.query[:200], status=s.record.status,
                turns=len(s.record.turns), started_at_unix=s.record.started_at_unix, finished=s.phase == "done")
                for tid, s in self.states.items()
                if (not request.group_id or s.record.group_id == request.group_id)
                and (not request.status or s.record.status == request.status)]
        page = rows[start:start + size]
        token = str(start + size) if start + size < len(rows) else ""
        return modules_pb2.MemoryListResponse(trajectories=page, next_page_token=token)


def _step(state) -> int:
    """The step a trajectory in flight is at: the turns it started with (a branch's) and those it ran."""
    return state.first_step + len(state.record.turns)


def _first_planner_version(record) -> str:
    """The version that served the trajectory's first planner call: its later calls are kept on it."""
    calls = [record.analysis_call, *(turn.planner for turn in record.turns)]
    return next((call.model_version for call in calls if call.model_version), "")


def _storable(record: dict) -> dict:
    """A record as the Trajectory message holds it (empty sub-messages left out)."""
    return {k: v for k, v in record.items() if v != {}}


def _trace_id() -> str:
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""
