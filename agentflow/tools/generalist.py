"""The ``generalist`` tool: a general-purpose LLM (an injected Engine) answers one self-contained sub-question."""

from __future__ import annotations

import time
from dataclasses import dataclass

from agentflow.config import setting
from agentflow.errors import EngineError, EngineTimeout, InvalidInput
from agentflow.llm.base import Engine, Sampling
from agentflow.tools.base import ToolResult, ToolSpec

SYSTEM_PROMPT = (
    "You are a careful assistant. Answer the question directly and concisely. "
    "If you are not sure, say so instead of guessing."
)


@dataclass(frozen=True)
class GeneralistConfig:
    timeout_s: float = setting(30.0, "limit of one LLM call in seconds")
    max_tokens: int = setting(512, "longest answer in tokens")
    temperature: float = setting(0.0, "sampling temperature of the answer")

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.max_tokens < 1 or self.temperature < 0:
            raise InvalidInput(f"generalist settings must be positive (temperature >= 0), got {self!r}")


class GeneralistTool:
    """Asks the engine a sub-question; engine failures become error results."""

    def __init__(self, engine: Engine, config: GeneralistConfig | None = None):
        self.engine = engine
        self.config = config or GeneralistConfig()
        self.spec = ToolSpec(
            name="generalist",
            description="Asks a general-purpose language model a self-contained question and returns its answer.",
            input_format="one self-contained question in plain language, including any context it needs",
            examples=("Explain in one sentence why the sky is blue.",),
            limitations="no tools, no browsing; it may be wrong about facts, numbers and recent events",
        )

    def run(self, command: str, timeout: float) -> ToolResult:
        started = time.monotonic()
        question = command.strip()
        if not question:
            return ToolResult(error="invalid_input: empty question")
        result = self._ask(question, min(self.config.timeout_s, timeout))
        result.duration_s = time.monotonic() - started
        return result

    def _ask(self, question: str, timeout: float) -> ToolResult:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
        sampling = Sampling(temperature=self.config.temperature, max_tokens=self.config.max_tokens)
        try:
            completion = self.engine.complete(messages, sampling, timeout=timeout)
        except EngineTimeout as exc:
            return ToolResult(error=f"timeout: the model did not answer within {timeout:g} s ({exc})")
        except EngineError as exc:
            return ToolResult(error=f"unavailable: the model failed: {exc}")
        answer = completion.text.strip()
        if not answer:
            return ToolResult(error="bad_response: the model returned an empty answer")
        meta = {"model_version": completion.model_version, "finish_reason": completion.finish_reason}
        return ToolResult(output=answer, meta=meta)
