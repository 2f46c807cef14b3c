"""What every module shares: one engine call under the caller's deadline, structured output when available."""

from __future__ import annotations

from dataclasses import dataclass

from agentflow.domain.deadline import Deadline
from agentflow.errors import EngineTimeout
from agentflow.llm.base import Completion, Engine, Message, Sampling


@dataclass
class Module:
    engine: Engine
    sampling: Sampling
    timeout_s: float = 120.0  # per call; the query's deadline may cut it shorter

    def call(self, msgs: list[Message], deadline: Deadline, *, schema: dict | None = None, key: str = "",
             sampling: Sampling | None = None) -> Completion:
        timeout = deadline.cap(self.timeout_s)
        if timeout <= 0:
            raise EngineTimeout("no time left for this step")
        use_schema = schema if getattr(self.engine, "supports_structured_output", False) else None
        return self.engine.complete(msgs, sampling or self.sampling, timeout=timeout, json_schema=use_schema, key=key)
