"""The planner: analyses the query once, then picks each next sub-goal and tool. The only trained module."""

from __future__ import annotations

from dataclasses import dataclass, replace

from agentflow.domain.deadline import Deadline
from agentflow.errors import ParseFailure
from agentflow.domain.memory import Memory
from agentflow.domain.parsing import PlanDecision, parse_plan, plan_schema
from agentflow.llm.base import Completion
from agentflow.modules.base import Module
from agentflow.modules.prompting import messages
from agentflow.tools.base import ToolSpec


@dataclass
class Planner(Module):
    tools: tuple[ToolSpec, ...] = ()

    @property
    def tool_names(self) -> list[str]:
        return [t.name for t in self.tools]

    def _cards(self) -> str:
        return "\n".join(t.card() for t in self.tools)

    analysis_max_tokens: int = 96

    def analyze(self, query: str, deadline: Deadline, key: str = "") -> Completion:
        sampling = replace(self.sampling, max_tokens=min(self.sampling.max_tokens, self.analysis_max_tokens))
        return self.call(messages("analyze", query=query, tools=self._cards()), deadline, key=key, sampling=sampling)

    def plan(self, memory: Memory, step: int, max_steps: int, deadline: Deadline,
             key: str = "") -> tuple[PlanDecision | ParseFailure, Completion]:
        """The next decision, or the ParseFailure explaining why the output could not be read."""
        msgs = messages("plan", query=memory.query, analysis=memory.analysis, tools=self._cards(),
                        memory=memory.render(), step=step, max_steps=max_steps, tool_names=", ".join(self.tool_names))
        completion = self.call(msgs, deadline, schema=plan_schema(self.tool_names), key=key)
        try:
            return parse_plan(completion.text, self.tool_names), completion
        except ParseFailure as e:
            return e, completion
