"""One turn's stages as functions over a turn dict (the ``agentflow.v1.Turn`` shape).

The in-process loop calls them in sequence; each service calls the one it owns. Each fills its part of the turn
and leaves the rest alone, so a turn cut short by a deadline still holds what was reached.
"""

from __future__ import annotations

import time
from dataclasses import asdict

from opentelemetry import trace

from agentflow.deadline import Deadline
from agentflow.errors import ParseFailure
from agentflow.flow import trajectory
from agentflow.flow.memory import Memory, MemoryStep, TokenCounter
from agentflow.flow.parsing import PlanDecision
from agentflow.modules.executor import Executor
from agentflow.modules.planner import Planner
from agentflow.modules.verifier import Verifier

tracer = trace.get_tracer("agentflow.stages")


def new_turn(step: int) -> dict:
    return {
        "step": step, "planner": {}, "decision": {"sub_goal": "", "tool": "", "context": ""}, "parse_error": "",
        "command": "", "executor": {}, "result": "", "tool_error": "", "verdict": "", "verifier_analysis": "",
        "timings": {"plan_s": 0.0, "execute_s": 0.0, "verify_s": 0.0, "total_s": 0.0}, "verifier": {},
    }


def plan(planner: Planner, memory: Memory, turn: dict, max_steps: int, deadline: Deadline, key: str) -> None:
    """planner(q, tools, M_t) -> the turn's decision, or its parse error."""
    clock = time.monotonic()
    with tracer.start_as_current_span("planner.plan", attributes={"agentflow.step": turn["step"]}):
        decision, completion = planner.plan(memory, turn["step"] + 1, max_steps, deadline, key=key)
    turn["planner"] = trajectory.llm_call(completion)
    if isinstance(decision, ParseFailure):
        turn["parse_error"] = str(decision)
    else:
        turn["decision"] = asdict(decision)
    turn["timings"]["plan_s"] = since(clock)


def execute(executor: Executor, query: str, turn: dict, deadline: Deadline, key: str) -> None:
    """executor(a_t) -> command -> tool result or typed error. A turn without a decision is left as it is."""
    if turn["parse_error"] or not turn["decision"]["tool"]:
        return
    clock = time.monotonic()
    decision = PlanDecision(**turn["decision"])
    with tracer.start_as_current_span("executor.execute", attributes={"agentflow.tool": decision.tool}):
        command, completion = executor.command(query, decision, deadline, key=key)
        turn["executor"] = trajectory.llm_call(completion)
        if isinstance(command, ParseFailure):
            turn["tool_error"] = f"parse_error: {command}"
        else:
            turn["command"] = command
            with tracer.start_as_current_span(f"tool.{decision.tool}"):
                result = executor.run(decision.tool, command, deadline)
            turn["result"], turn["tool_error"] = result.output, result.error
    turn["timings"]["execute_s"] = since(clock)


def remember(memory: Memory, turn: dict, *, budget_tokens: int, count: TokenCounter, max_result_chars: int) -> None:
    """M_{t+1} = M_t + this turn's step, compacted to the budget. Pure given its inputs: every service agrees."""
    if turn["parse_error"]:
        memory.add(MemoryStep(step=turn["step"], error=f"parse_error: {turn['parse_error']}"))
        return
    d = turn["decision"]
    memory.add(MemoryStep(step=turn["step"], sub_goal=d["sub_goal"], tool=d["tool"], command=turn["command"],
                          result=turn["result"], error=turn["tool_error"]), max_result_chars=max_result_chars)
    memory.compact(budget_tokens, count)


def verify(verifier: Verifier, memory: Memory, turn: dict, deadline: Deadline, key: str) -> None:
    """verifier(q, M_{t+1}) -> STOP | CONTINUE. An unreadable plan needs no verifier: CONTINUE."""
    if turn["parse_error"]:
        turn["verdict"] = "CONTINUE"
        return
    clock = time.monotonic()
    with tracer.start_as_current_span("verifier.verify"):
        analysis, conclusion, completion = verifier.verify(memory, deadline, key=key)
    turn.update(verdict=conclusion, verifier_analysis=analysis, verifier=trajectory.llm_call(completion))
    memory.steps[-1].verdict = conclusion
    turn["timings"]["verify_s"] = since(clock)


def since(clock: float) -> float:
    return round(time.monotonic() - clock, 6)
