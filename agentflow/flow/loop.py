"""The in-process AgentFlow loop: analyse, then plan → execute → verify until STOP, then generate the answer.

Limits hold *during* a step: every engine and tool call gets the smaller of its own timeout and the time left, and a
slice of ``max_time_s`` is kept back so the generator can still answer when the steps used up their share.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from dataclasses import dataclass
from typing import Callable

from opentelemetry import trace

from agentflow.domain.deadline import Deadline
from agentflow.errors import EngineError, EngineTimeout, InvalidInput
from agentflow.domain import trajectory
from agentflow.flow import stages
from agentflow.domain.convert import to_dict, turn_to_dict
from agentflow.domain.memory import Memory, TokenCounter, approx_tokens
from agentflow.modules.executor import Executor
from agentflow.modules.generator import Generator
from agentflow.modules.planner import Planner
from agentflow.modules.verifier import Verifier
from agentflow.versions import check_version_name

tracer = trace.get_tracer("agentflow.loop")
EventSink = Callable[[str, dict], None]  # (stage, payload): "stage" (a module starts), "analysis", "turn", "answer"


@dataclass(frozen=True)
class LoopConfig:
    max_steps: int = 5  # planner turns at most
    max_time_s: float = 120.0  # wall-clock budget for the whole query, answer included
    max_query_bytes: int = 64 * 1024  # larger queries are refused
    memory_budget_tokens: int = 1536  # older steps are summarised beyond this
    answer_reserve: float = 0.2  # share of max_time_s kept for the generator
    max_result_chars: int = 4000  # a tool result is clipped to this in memory
    # What a query may ask for in its options (check_query: the gateway, and the memory service for `queries`)
    max_steps_limit: int = 20  # largest options.max_steps
    max_time_limit_s: float = 900.0  # largest options.max_time_s
    max_tokens_limit: int = 2048  # largest options.max_tokens (the LLM server's own cap by default)

    def __post_init__(self):
        checks = [
            (self.max_steps >= 1, f"max_steps must be at least 1, got {self.max_steps}"),
            (math.isfinite(self.max_time_s) and self.max_time_s > 0,
             f"max_time_s must be positive, got {self.max_time_s}"),
            (self.max_steps_limit >= 1, f"max_steps_limit must be at least 1, got {self.max_steps_limit}"),
            (math.isfinite(self.max_time_limit_s) and self.max_time_limit_s > 0,
             f"max_time_limit_s must be positive, got {self.max_time_limit_s}"),
            (self.max_tokens_limit >= 1, f"max_tokens_limit must be at least 1, got {self.max_tokens_limit}"),
            (self.max_query_bytes > 0, f"max_query_bytes must be positive, got {self.max_query_bytes}"),
            (self.memory_budget_tokens >= 64, f"memory_budget_tokens must be at least 64, got {self.memory_budget_tokens}"),
            (0 <= self.answer_reserve < 1, f"answer_reserve must be in [0, 1), got {self.answer_reserve}"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidInput(message)


def validate_query(query: object, max_bytes: int) -> str:
    if not isinstance(query, str):
        raise InvalidInput(f"query must be text, got {type(query).__name__}")
    size = len(query.encode("utf-8", errors="surrogatepass"))
    if size > max_bytes:
        raise InvalidInput(f"query is {size} bytes; the limit is {max_bytes} (max_query_bytes)")
    if not query.strip():
        raise InvalidInput("query is empty")
    return query.strip()


def check_query(query, config: LoopConfig) -> str:
    """Check an ``agentflow.v1.Query`` (the text, every numeric option, source, group, ground truth) against the
    limits in ``config``; returns the stripped text, raises InvalidInput naming the field. One check for both ends:
    the gateway refuses a request with it, and the memory service applies it to what it reads from `queries`, where
    a record written directly would otherwise skip the gateway."""
    text = validate_query(query.query, config.max_query_bytes)
    options = query.options

    def within(name: str, value, low, high, *, open_low: bool = False) -> None:
        ok = math.isfinite(value) and (value > low if open_low else value >= low) and value <= high
        if not ok:
            raise InvalidInput(f"options.{name} must be in {'(' if open_low else '['}{low:g}, {high:g}], got {value}")

    within("max_steps", options.max_steps, 0, config.max_steps_limit)  # 0: the configured default
    within("max_time_s", options.max_time_s, 0, config.max_time_limit_s)
    within("max_tokens", options.max_tokens, 0, config.max_tokens_limit)
    if options.HasField("temperature"):
        within("temperature", options.temperature, 0, 2)
    if options.HasField("top_p"):
        within("top_p", options.top_p, 0, 1, open_low=True)
    if options.HasField("seed"):
        within("seed", options.seed, 0, 2**63 - 1)
    if query.source and query.source not in trajectory.SOURCES:
        raise InvalidInput(f"source must be one of {', '.join(trajectory.SOURCES)}, got {query.source!r}")
    if query.source == "training" and not query.group_id:
        raise InvalidInput("a training query needs a group_id (its group of G rollouts)")
    if len(query.ground_truth.encode("utf-8", errors="surrogatepass")) > config.max_query_bytes:
        raise InvalidInput(f"ground_truth is over {config.max_query_bytes} bytes (max_query_bytes)")
    if query.deadline_unix_ms < 0:
        raise InvalidInput(f"deadline_unix_ms must not be negative, got {query.deadline_unix_ms}")
    _check_names(query)
    if query.HasField("branch"):
        _check_branch(query, query.options.max_steps or config.max_steps)
    return text


MAX_NAME_CHARS = 128  # a group id, a tool name, an owner
MAX_TOOLS = 32
_TOOL_NAME = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def _check_branch(query, max_steps: int) -> None:
    """A shadow branch (Query.branch) is a training rollout of a group that goes on from a turn of a named
    trajectory, before its last step."""
    branch = query.branch
    if query.source != "training":
        raise InvalidInput("a branch is a training rollout: it needs source 'training' (and a group_id)")
    if not 0 < len(branch.trajectory_id) <= MAX_NAME_CHARS or not branch.trajectory_id.isprintable():
        raise InvalidInput(f"branch.trajectory_id must be 1 to {MAX_NAME_CHARS} printable characters")
    if not 1 <= branch.turn < max_steps:
        raise InvalidInput(f"branch.turn must be from 1 (0 is the whole query) to max_steps - 1 ({max_steps - 1}), "
                           f"got {branch.turn}")


def _check_names(query) -> None:
    """Every name in a query is short; a tool or version name is also ASCII from a small set (it ends up in
    URLs, headers and metric labels: ``versions.check_version_name``). A record too large for Kafka would never be
    answered."""
    options = query.options
    if len(options.tools) > MAX_TOOLS:
        raise InvalidInput(f"options.tools lists {len(options.tools)} tools; at most {MAX_TOOLS}")
    for field_name, value in [("group_id", query.group_id), ("owner", query.owner)]:
        if len(value) > MAX_NAME_CHARS or not value.isprintable():
            raise InvalidInput(f"{field_name} must be at most {MAX_NAME_CHARS} printable characters")
    if options.planner_version:
        try:
            check_version_name(options.planner_version)
        except InvalidInput as e:
            raise InvalidInput(f"options.planner_version: {e}") from None
    for tool in options.tools:
        if not _TOOL_NAME.fullmatch(tool):
            shown = tool[:40] + ("..." if len(tool) > 40 else "")
            raise InvalidInput(f"options.tools: a tool name must be 1 to 128 of A-Z a-z 0-9 . _ : -, got {shown!r}")


class Agent:
    def __init__(self, planner: Planner, executor: Executor, verifier: Verifier, generator: Generator,
                 config: LoopConfig = LoopConfig(), count_tokens: TokenCounter = approx_tokens):
        self.planner, self.executor, self.verifier, self.generator = planner, executor, verifier, generator
        self.config = config
        self.count_tokens = count_tokens

    def solve(self, query: str, *, ground_truth: str = "", source: str = "traffic", group_id: str = "",
              trajectory_id: str = "", on_event: EventSink | None = None, start: Memory | None = None) -> dict:
        """Solve one query and return its trajectory record (see agentflow/domain/trajectory.schema.json).

        ``start``: a state to go on from (a branch of a finished trajectory, ``Memory.after``): its analysis and
        steps are kept, the turns count on from its last step, and the record holds only the turns run here.

        Raises InvalidInput for an unusable query, and EngineError (with the partial record as ``.record``) when
        an engine is unreachable or misbehaves outside the query's own time budget.
        """
        query = validate_query(query, self.config.max_query_bytes)
        if source not in trajectory.SOURCES:
            raise InvalidInput(f"source must be one of {', '.join(trajectory.SOURCES)}, got {source!r}")
        emit = on_event or (lambda stage, payload: None)
        started, t0 = time.time(), time.monotonic()
        whole = Deadline(self.config.max_time_s)
        steps = Deadline(self.config.max_time_s * (1 - self.config.answer_reserve))
        tid = trajectory_id or uuid.uuid4().hex
        if start is not None and start.query != query:
            raise InvalidInput("start must be a state of the same query")
        memory, turns = (start.after(len(start.steps)) if start is not None else Memory(query=query)), []
        record = trajectory.new_record(tid, group_id, query, ground_truth, source, started)

        def close() -> dict:
            record["turns"] = [turn_to_dict(turn) for turn in turns]
            return trajectory.finish(record, memory, time.monotonic() - t0)

        with tracer.start_as_current_span("agentflow.solve", attributes={"agentflow.trajectory_id": tid}) as span:
            ctx = span.get_span_context()
            record["trace_id"] = format(ctx.trace_id, "032x") if ctx.is_valid else ""
            try:
                reason = self._steps(memory, record, turns, steps, tid, emit)
                emit("stage", {"module": "generator", "step": len(turns)})
                answer = stages.answer(self.generator, memory, whole, tid, reason)
            except EngineError as e:
                record.update(status="error", error=f"{e.reason}: {e}")
                e.record = close()
                raise
            record["status"], record["answer"] = answer.status, answer.answer
            record["generator"] = to_dict(answer.generator) if answer.HasField("generator") else {}
            emit("answer", {"answer": record["answer"], "status": record["status"]})
        return close()

    def _steps(self, memory: Memory, record: dict, turns: list, deadline: Deadline, tid: str,
               emit: EventSink) -> str:
        """Run turns (appended to ``turns`` as they start) until ``next_action`` ends the loop; returns why."""
        try:
            planner, done = self.planner, memory.step_count  # done: the steps of a state given to go on from
            if not memory.analysis:
                emit("stage", {"module": "planner", "step": 0})
                planner, analysis = stages.analyze(planner, memory, deadline, tid)  # one version per trajectory
                record["analysis_call"] = trajectory.llm_call(analysis)
            record["analysis"] = memory.analysis
            emit("analysis", {"analysis": memory.analysis})
            verdict, max_steps = "", self.config.max_steps - done
            while (action := stages.next_action(len(turns), max_steps, deadline, verdict)) == stages.CONTINUE:
                turn = stages.new_turn(done + len(turns))
                turns.append(turn)  # filled in place: a turn cut short by the deadline is kept
                clock = time.monotonic()
                try:
                    self._turn(planner, turn, memory, deadline, tid, emit)
                finally:
                    planner = stages.keep_version(planner, turn.planner.model_version)
                    turn.timings.total_s = stages.since(clock)
                    emit("turn", turn_to_dict(turn))
                verdict = turn.verdict
            return action
        except EngineTimeout:
            if not deadline.expired():
                raise
            return "timeout"

    def _turn(self, planner: Planner, turn, memory: Memory, deadline: Deadline, tid: str, emit: EventSink) -> None:
        step = turn.step + 1
        emit("stage", {"module": "planner", "step": step})
        stages.plan(planner, memory, turn, self.config.max_steps, deadline, tid)
        if turn.decision.tool and not turn.parse_error:
            emit("stage", {"module": "executor", "step": step, "tool": turn.decision.tool})
        stages.execute(self.executor, memory.query, turn, deadline, tid)
        stages.remember(memory, turn, budget_tokens=self.config.memory_budget_tokens, count=self.count_tokens,
                        max_result_chars=self.config.max_result_chars)
        if not turn.parse_error:
            emit("stage", {"module": "verifier", "step": step})
        stages.verify(self.verifier, memory, turn, deadline, tid)
