"""The verifier: reads the memory and says STOP (enough to answer) or CONTINUE."""

from __future__ import annotations

from dataclasses import dataclass

from agentflow.domain.deadline import Deadline
from agentflow.errors import ParseFailure
from agentflow.domain.memory import Memory
from agentflow.domain.parsing import VERDICT_SCHEMA, parse_verdict
from agentflow.llm.base import Completion
from agentflow.modules.base import Module
from agentflow.modules.prompting import messages


@dataclass
class Verifier(Module):
    def verify(self, memory: Memory, deadline: Deadline, key: str = "") -> tuple[str, str, Completion]:
        """(analysis, "STOP" | "CONTINUE", completion). An unreadable verdict means CONTINUE, with the reason."""
        completion = self.call(messages("verify", query=memory.query, memory=memory.render()), deadline,
                               schema=VERDICT_SCHEMA, key=key)
        try:
            analysis, conclusion = parse_verdict(completion.text)
        except ParseFailure as e:
            return f"parse_error: {e}", "CONTINUE", completion
        return analysis, conclusion, completion
