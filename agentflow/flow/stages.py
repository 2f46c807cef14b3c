"""One turn's stages, and the loop's control, as functions over the typed turn (``agentflow.v1.Turn``).

The in-process loop calls them in sequence; each service calls the one it owns, on the turn its input event
carries. Each stage fills its part of the turn and leaves the rest alone, so a turn cut short by a deadline still
holds what was reached. ``next_action`` decides, for both, whether another turn runs or why the loop ends, and
``answer`` is the generator's stage with its fallback when time ran out.
"""

from __future__ import annotations

import time
from dataclasses import replace

from opentelemetry import trace

from agentflow.domain.deadline import Deadline
from agentflow.errors import EngineTimeout, ParseFailure
from agentflow.domain.convert import llm_call_message
from agentflow.domain.memory import Memory, MemoryStep, TokenCounter
from agentflow.domain.parsing import PlanDecision
from agentflow.modules.executor import Executor
from agentflow.modules.generator import Generator
from agentflow.modules.planner import Planner
from agentflow.modules.verifier import Verifier
from agentflow.llm.base import Completion
from agentflow.proto.v1.events_pb2 import Answer, Plan
from agentflow.proto.v1.trajectory_pb2 import Decision, Timings, Turn

tracer = trace.get_tracer("agentflow.stages")

#: ``next_action``'s answer when another turn runs; every other answer is the reason the loop ended.
CONTINUE = "continue"
#: The answer's status for each reason the loop ended.
STATUS_BY_REASON = {"stop": "answered", "max_steps": "max_steps", "timeout": "timeout"}


def new_turn(step: int) -> Turn:
    return Turn(step=step, decision=Decision(), timings=Timings())


def next_action(step: int, max_steps: int, deadline: Deadline, verdict: str = "") -> str:
    """After ``step`` turns, the last one judged ``verdict``: CONTINUE, or why the loop ends ("stop" on the
    verifier's STOP, "max_steps" when the turns are used up, "timeout" when the steps' deadline has passed)."""
    if verdict == "STOP":
        return "stop"
    if step >= max_steps:
        return "max_steps"
    if deadline.expired():
        return "timeout"
    return CONTINUE


def keep_version(planner: Planner, version: str) -> Planner:
    """The planner for the rest of a trajectory whose earlier planner calls ``version`` served: the later ones are
    kept on it (routing by trajectory, ``agentflow.llm.routing``). Unchanged when a version is kept already, or for
    a call that reported none."""
    if not version or planner.sampling.trajectory_version:
        return planner
    return replace(planner, sampling=replace(planner.sampling, trajectory_version=version))


def analyze(planner: Planner, memory: Memory, deadline: Deadline, key: str) -> tuple[Planner, Completion]:
    """planner.analyze(q), once per trajectory, into the memory; returns the planner kept on the version that
    answered (``keep_version``) and the call."""
    with tracer.start_as_current_span("planner.analyze"):
        completion = planner.analyze(memory.query, deadline, key=key)
    memory.analysis = completion.text.strip()
    return keep_version(planner, completion.model_version), completion


def plan_step(planner: Planner, memory: Memory, plan_event: Plan, step: int, max_steps: int, deadline: Deadline,
              key: str) -> None:
    """The planner service's stage for turn ``step``: the analysis first when the memory has none (step 0), then the
    turn's decision, into ``plan_event`` (its ``turn`` and ``analysis_call``)."""
    plan_event.turn.CopyFrom(new_turn(step))
    if step == 0 and not memory.analysis:
        planner, completion = analyze(planner, memory, deadline, key)
        _record_call(plan_event, "analysis_call", completion)
    plan(planner, memory, plan_event.turn, max_steps, deadline, key)


def plan(planner: Planner, memory: Memory, turn: Turn, max_steps: int, deadline: Deadline, key: str) -> None:
    """planner(q, tools, M_t) -> the turn's decision, or its parse error."""
    clock = time.monotonic()
    with tracer.start_as_current_span("planner.plan", attributes={"agentflow.step": turn.step}):
        decision, completion = planner.plan(memory, turn.step + 1, max_steps, deadline, key=key)
    _record_call(turn, "planner", completion)
    if isinstance(decision, ParseFailure):
        turn.parse_error = str(decision)
    else:
        turn.decision.CopyFrom(Decision(sub_goal=decision.sub_goal, tool=decision.tool, context=decision.context))
    turn.timings.plan_s = since(clock)


def execute(executor: Executor, query: str, turn: Turn, deadline: Deadline, key: str) -> None:
    """executor(a_t) -> command -> tool result or typed error. A turn without a decision is left as it is."""
    if turn.parse_error or not turn.decision.tool:
        return
    clock = time.monotonic()
    decision = PlanDecision(sub_goal=turn.decision.sub_goal, tool=turn.decision.tool, context=turn.decision.context)
    with tracer.start_as_current_span("executor.execute", attributes={"agentflow.tool": decision.tool}):
        command, completion = executor.command(query, decision, deadline, key=key)
        _record_call(turn, "executor", completion)
        if isinstance(command, ParseFailure):
            turn.tool_error = f"parse_error: {command}"
        else:
            turn.command = command
            with tracer.start_as_current_span(f"tool.{decision.tool}"):
                result = executor.run(decision.tool, command, deadline)
            turn.result, turn.tool_error = result.output, result.error
    turn.timings.execute_s = since(clock)


def remember(memory: Memory, turn: Turn, *, budget_tokens: int, count: TokenCounter, max_result_chars: int) -> None:
    """M_{t+1} = M_t + this turn's step, compacted to the budget. Pure given its inputs: every service agrees."""
    if turn.parse_error:
        memory.add(MemoryStep(step=turn.step, error=f"parse_error: {turn.parse_error}"))
        return
    memory.add(MemoryStep(step=turn.step, sub_goal=turn.decision.sub_goal, tool=turn.decision.tool,
                          command=turn.command, result=turn.result, error=turn.tool_error),
               max_result_chars=max_result_chars)
    memory.compact(budget_tokens, count)


def verify(verifier: Verifier, memory: Memory, turn: Turn, deadline: Deadline, key: str) -> None:
    """verifier(q, M_{t+1}) -> STOP | CONTINUE. An unreadable plan needs no verifier: CONTINUE."""
    if turn.parse_error:
        turn.verdict = "CONTINUE"
        return
    clock = time.monotonic()
    with tracer.start_as_current_span("verifier.verify"):
        analysis, conclusion, completion = verifier.verify(memory, deadline, key=key)
    turn.verdict, turn.verifier_analysis = conclusion, analysis
    _record_call(turn, "verifier", completion)
    memory.steps[-1].verdict = conclusion
    turn.timings.verify_s = since(clock)


def answer(generator: Generator, memory: Memory, deadline: Deadline, key: str, reason: str) -> Answer:
    """generator(q, M_T) -> the answer, its status following the loop's end ``reason``. When the deadline has
    passed, the last good tool result stands in (status timeout); other engine errors propagate."""
    clock = time.monotonic()
    try:
        with tracer.start_as_current_span("generator.generate"):
            text, completion = generator.answer(memory, deadline, key=key)
    except EngineTimeout:
        if not deadline.expired():
            raise
        return Answer(answer=memory.last_result(), status="timeout", duration_s=since(clock))
    return Answer(answer=text, status=STATUS_BY_REASON.get(reason, "answered"),
                  generator=llm_call_message(completion), duration_s=since(clock))


def finish_turn(turn: Turn) -> Turn:
    """The turn's total time: the sum of its stages (the ring's hops between them are not the turn's work)."""
    t = turn.timings
    t.total_s = round(t.plan_s + t.execute_s + t.verify_s, 6)
    return turn


def _record_call(message, field: str, completion) -> None:
    """The call's record into ``message.field`` (a turn's module call, a plan's analysis call); none without one."""
    call = llm_call_message(completion)
    if call is not None:
        getattr(message, field).CopyFrom(call)


def since(clock: float) -> float:
    return round(time.monotonic() - clock, 6)
