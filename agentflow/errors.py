"""Domain errors. Each carries a short machine-readable ``reason``; transports map reasons to status codes."""

from __future__ import annotations


class AgentFlowError(Exception):
    """Base of every error the library raises on purpose."""

    reason = "internal"

    def __init__(self, message: str, *, reason: str | None = None):
        super().__init__(message)
        if reason:
            self.reason = reason


class InvalidInput(AgentFlowError):
    """The caller gave something unusable (empty or oversized query, unknown tool, bad setting)."""

    reason = "invalid_input"


class EngineError(AgentFlowError):
    """An LLM engine failed (refused connection, HTTP error, bad response)."""

    reason = "engine_unavailable"


class EngineTimeout(EngineError):
    """An LLM call ran past its deadline."""

    reason = "deadline_exceeded"


class ToolFailure(AgentFlowError):
    """A tool could not run a command (its own error, a limit, a timeout)."""

    reason = "tool_error"


class ParseFailure(AgentFlowError):
    """An LLM response could not be read as the structure a module expects."""

    reason = "parse_error"
