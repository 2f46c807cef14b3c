"""The tool contract: metadata that drives the prompts, and ``run(command, timeout)``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class ToolSpec:
    """What the planner and executor prompts say about a tool."""

    name: str
    description: str
    input_format: str  # what a command for this tool looks like, e.g. "Python 3 source code that prints its result"
    examples: tuple[str, ...] = ()
    limitations: str = ""

    def card(self) -> str:
        """A short plain-text description for prompts."""
        lines = [f"- {self.name}: {self.description}", f"  input: {self.input_format}"]
        lines += [f"  example: {e}" for e in self.examples]
        if self.limitations:
            lines.append(f"  limits: {self.limitations}")
        return "\n".join(lines)


@dataclass
class ToolResult:
    """The outcome of one command. Exactly one of ``output`` / ``error`` is meaningful: ``ok`` says which."""

    output: str = ""
    error: str = ""  # typed error, "kind: message", e.g. "timeout: ran past 5.0 s"
    duration_s: float = 0.0
    meta: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.error


class Tool(Protocol):
    spec: ToolSpec

    def run(self, command: str, timeout: float) -> ToolResult:
        """Run one command within ``timeout`` seconds. Never raises for a bad command: returns a ToolResult with error."""
        ...
