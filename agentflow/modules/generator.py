"""The generator: writes the final answer from the query and the memory."""

from __future__ import annotations

from dataclasses import dataclass

from agentflow.domain.deadline import Deadline
from agentflow.domain.memory import Memory
from agentflow.domain.parsing import parse_answer
from agentflow.llm.base import Completion
from agentflow.modules.base import Module
from agentflow.modules.prompting import messages


@dataclass
class Generator(Module):
    def answer(self, memory: Memory, deadline: Deadline, key: str = "") -> tuple[str, Completion]:
        completion = self.call(messages("answer", query=memory.query, memory=memory.render()), deadline, key=key)
        return parse_answer(completion.text), completion
