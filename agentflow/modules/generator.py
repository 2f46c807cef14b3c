"""The generator: writes the final answer from the query and the memory."""

from __future__ import annotations

from dataclasses import dataclass

from agentflow.domain.deadline import Deadline
from agentflow.domain.memory import Memory
from agentflow.domain.parsing import parse_answer
from agentflow.llm.base import Completion
from agentflow.modules.base import Module
from agentflow.modules.prompting import messages, repeats_an_example


@dataclass
class Generator(Module):
    def answer(self, memory: Memory, deadline: Deadline, key: str = "") -> tuple[str, Completion]:
        """The answer, "" when there is none: also when it repeats a worked example's calculation that neither the
        question nor the steps mention (a copy, not an answer)."""
        steps = memory.render()
        completion = self.call(messages("answer", query=memory.query, memory=steps), deadline, key=key)
        answer = parse_answer(completion.text)
        return ("" if repeats_an_example(answer, f"{memory.query}\n{steps}") else answer), completion
