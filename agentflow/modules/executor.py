"""The executor: turns a sub-goal into a concrete tool command, then runs the tool."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from agentflow.domain.deadline import Deadline
from agentflow.errors import ParseFailure
from agentflow.domain.parsing import PlanDecision, parse_command
from agentflow.llm.base import Completion
from agentflow.modules.base import Module
from agentflow.modules.prompting import copies_a_showcase, example_commands, messages
from agentflow.tools.base import Tool, ToolResult


@dataclass
class Executor(Module):
    tools: dict[str, Tool] = field(default_factory=dict)
    tool_timeout_s: float = 30.0

    def command(self, query: str, decision: PlanDecision, deadline: Deadline,
                key: str = "") -> tuple[str | ParseFailure, Completion]:
        spec = self.tools[decision.tool].spec
        msgs = messages("command", query=query, sub_goal=decision.sub_goal, context=decision.context or "none",
                        tool_card=spec.card().removeprefix("- "))
        # Plain text, not JSON: code reads better unescaped, and parse_command accepts fences, JSON or text.
        completion = self.call(msgs, deadline, key=key)
        try:
            command = parse_command(completion.text)
        except ParseFailure as e:
            return e, completion
        shown = (*example_commands(), *spec.examples)
        if copies_a_showcase(command, shown, " ".join((query, decision.sub_goal, decision.context or ""))):
            # not quoted: the memory would show the copied program to the generator, which then copies it
            copy = ParseFailure("the command repeats an example of the prompt instead of doing this step")
            return copy, completion
        return command, completion

    def run(self, tool: str, command: str, deadline: Deadline) -> ToolResult:
        timeout = deadline.cap(self.tool_timeout_s)
        if timeout <= 0:
            return ToolResult(error="timeout: no time left to run the tool")
        started = time.monotonic()
        try:
            result = self.tools[tool].run(command, timeout)
        except Exception as e:  # a tool bug must not end the query
            result = ToolResult(error=f"tool_crashed: {type(e).__name__}: {e}")
        result.duration_s = result.duration_s or time.monotonic() - started
        return result
