"""The engine contract every module talks to: OpenAI-style chat messages in, a Completion out."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol, Sequence

#: vLLM's request priority (lower is served first; 0, the default, is users') of the LLM calls made in this context:
#: the ring's services set ``BACKGROUND`` while they handle a training rollout's event (``QueryOptions.background``),
#: and an engine configured for servers that schedule by priority sends it (``OpenAIEngineConfig``)
PRIORITY: ContextVar[int] = ContextVar("agentflow_llm_priority", default=0)
BACKGROUND = 1


@contextmanager
def llm_priority(background: bool) -> Iterator[None]:
    """The LLM calls made inside yield to users' when ``background``."""
    token = PRIORITY.set(BACKGROUND if background else 0)
    try:
        yield
    finally:
        PRIORITY.reset(token)


@dataclass(frozen=True)
class Sampling:
    """Per-call sampling settings (the subset of the OpenAI chat API the project uses)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # pin the call to a served version ("latest": the newest one loaded); a server holding one version ignores it
    model_version: str = ""
    # the version that served this trajectory's earlier planner calls: a routing engine keeps the trajectory on it
    # while it is served (agentflow.llm.routing); other engines ignore it
    trajectory_version: str = ""


@dataclass
class Completion:
    """One chat completion and what the trainer needs to learn from it.

    Token ids and logprobs are empty when the server does not return them.
    ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under the serving model.
    """

    text: str
    prompt_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    model_version: str = ""
    finish_reason: str = ""
    latency_s: float = 0.0
    first_token_s: float = 0.0  # from the request to its first token, where the engine measures it; 0: unknown


Message = dict  # {"role": "system"|"user"|"assistant", "content": str}


class Engine(Protocol):
    """Anything that completes chat messages within a timeout.

    ``json_schema`` asks for structured output when the engine supports it (engines that do not, ignore it and the
    caller falls back to parsing text). ``key`` names the caller's trajectory, for sticky routing between versions.
    Raises EngineError / EngineTimeout.
    """

    supports_structured_output: bool

    def complete(
        self,
        messages: Sequence[Message],
        sampling: Sampling,
        *,
        timeout: float,
        json_schema: dict | None = None,
        key: str = "",
    ) -> Completion: ...
