"""The evolving memory M_t: a structured, JSON-serialisable record of the query and every step so far.

It is the ``MemorySnapshot`` message of protos/agentflow/v1/trajectory.proto field for field: ``to_proto`` and
``from_proto`` carry it in events, and its dict form is the trajectory record's ``memory``. When its rendered text
would exceed a token budget, the oldest steps are compacted into one-line summaries (extractive and deterministic:
no LLM call, nothing invented).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Callable

from agentflow.proto.v1 import trajectory_pb2

TokenCounter = Callable[[str], int]
_OMITTED = " earlier steps omitted)"


def approx_tokens(text: str) -> int:
    """A tokenizer-free estimate (about 4 characters a token) used when no tokenizer is at hand."""
    return (len(text) + 3) // 4


@dataclass
class MemoryStep:
    step: int
    sub_goal: str = ""
    tool: str = ""
    command: str = ""
    result: str = ""
    error: str = ""
    verdict: str = ""

    def render(self) -> str:
        outcome = f"Error: {self.error}" if self.error else f"Result: {self.result}"
        return (f"Step {self.step}: {self.sub_goal}\n  Tool: {self.tool}\n  Command: {self.command}\n  {outcome}"
                + (f"\n  Verifier: {self.verdict}" if self.verdict else ""))

    def summary_line(self, width: int = 120) -> str:
        outcome = f"error {self.error}" if self.error else self.result
        return _clip(f"step {self.step} [{self.tool}] {self.sub_goal} -> {outcome}", width)


@dataclass
class Memory:
    query: str
    analysis: str = ""
    summary: str = ""  # one line per compacted step
    steps: list[MemoryStep] = field(default_factory=list)
    compacted_steps: int = 0

    def add(self, step: MemoryStep, *, max_result_chars: int = 4000) -> None:
        step.result = _clip(step.result, max_result_chars)
        self.steps.append(step)

    def last_result(self) -> str:
        """The latest successful tool result: the stand-in answer when no time is left to generate one."""
        results = [s.result for s in self.steps if s.result and not s.error]
        return results[-1].strip() if results else ""

    @property
    def step_count(self) -> int:
        return self.compacted_steps + len(self.steps)

    def render(self) -> str:
        """The text the modules see."""
        parts = []
        if self.summary:
            parts.append(f"Earlier steps (summarised):\n{self.summary}")
        parts += [s.render() for s in self.steps]
        return "\n".join(parts) if parts else "(no steps yet)"

    def compact(self, budget_tokens: int, count: TokenCounter = approx_tokens, keep_recent: int = 1) -> int:
        """Summarise the oldest steps until ``render()`` fits ``budget_tokens``; returns how many were compacted.

        The last ``keep_recent`` steps always stay verbatim. When the summary itself grows too long its oldest
        lines give way to a count; when the recent steps alone exceed the budget, their results are clipped.
        """
        moved = 0
        while count(self.render()) > budget_tokens and len(self.steps) > keep_recent:
            oldest = self.steps.pop(0)
            self.summary = "\n".join(filter(None, [self.summary, oldest.summary_line()]))
            self.compacted_steps += 1
            moved += 1
        listed = [line for line in self.summary.splitlines() if not line.endswith(_OMITTED)]
        while count(self.render()) > budget_tokens and listed:
            listed.pop(0)
            omitted = self.compacted_steps - len(listed)
            self.summary = "\n".join([f"({omitted}{_OMITTED}"] + listed)
        for step in self.steps:
            while count(self.render()) > budget_tokens and len(step.result) > 200:
                step.result = _clip(step.result, len(step.result) // 2)
        return moved

    def after(self, turns: int) -> Memory:
        """The state after the first ``turns`` steps, as the modules saw it then (a branch point). Refused when steps
        were compacted: the state before compaction is not kept."""
        if self.compacted_steps or self.summary:
            raise ValueError("a compacted memory does not hold its earlier states")
        if not 0 <= turns <= len(self.steps):
            raise ValueError(f"turns must be in [0, {len(self.steps)}], got {turns}")
        steps = [MemoryStep(**vars(step)) for step in self.steps[:turns]]
        return Memory(self.query, self.analysis, steps=steps)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_proto(self) -> trajectory_pb2.MemorySnapshot:
        return trajectory_pb2.MemorySnapshot(
            query=self.query, analysis=self.analysis, summary=self.summary, compacted_steps=self.compacted_steps,
            steps=[trajectory_pb2.MemoryStep(**vars(step)) for step in self.steps])

    @classmethod
    def from_proto(cls, snapshot: trajectory_pb2.MemorySnapshot) -> Memory:
        steps = [MemoryStep(**{f.name: getattr(step, f.name) for f in _STEP_FIELDS}) for step in snapshot.steps]
        return cls(snapshot.query, snapshot.analysis, snapshot.summary, steps, snapshot.compacted_steps)

    @classmethod
    def from_dict(cls, data: dict) -> Memory:
        steps = [MemoryStep(**s) for s in data.get("steps", [])]
        return cls(**{**data, "steps": steps})


_STEP_FIELDS = fields(MemoryStep)


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    marker = f" …[{len(text) - limit} chars cut]"
    return text[: max(0, limit - len(marker))] + marker
