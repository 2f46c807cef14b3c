"""A zero-latency engine that answers from a script: for logic tests, benches of loop overhead, and debugging."""

from __future__ import annotations

from typing import Callable, Sequence

from agentflow.llm.base import Completion, Message, Sampling

Responder = Callable[[Sequence[Message]], str]


class ScriptedEngine:
    """Answers each call with ``responder(messages)``; a list of strings is replayed in order, then repeats its last."""

    supports_structured_output = False

    def __init__(self, responder: Responder | Sequence[str], version: str = "scripted"):
        if callable(responder):
            self._respond = responder
        else:
            replies = list(responder)
            self._respond = lambda _messages: replies.pop(0) if len(replies) > 1 else replies[0]
        self.version = version
        self.calls: list[list[Message]] = []

    def complete(self, messages: Sequence[Message], sampling: Sampling, *, timeout: float,
                 json_schema: dict | None = None, key: str = "") -> Completion:
        self.calls.append(list(messages))
        return Completion(text=self._respond(messages), model_version=self.version, finish_reason="stop")
