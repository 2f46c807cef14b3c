"""Domain errors. Each carries a ``Reason``; the transports map every reason to a status code (gRPC:
``agentflow.rpc.errors.STATUS_BY_REASON``, HTTP: ``agentflow.httpd.HTTP_STATUS_BY_REASON``)."""

from __future__ import annotations

import enum


class Reason(enum.StrEnum):
    """Why a call failed, machine-readable; a str, so it prints and compares as its value."""

    INTERNAL = "internal"
    INVALID_INPUT = "invalid_input"
    PARSE_ERROR = "parse_error"
    FAILED_PRECONDITION = "failed_precondition"
    NOT_FOUND = "not_found"
    NOT_READY = "not_ready"
    UNAVAILABLE = "unavailable"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    TOOL_ERROR = "tool_error"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission_denied"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    CANCELLED = "cancelled"


class AgentFlowError(Exception):
    """Base of every error the library raises on purpose; a reason that is not a ``Reason`` is a ValueError where
    it is written (the class) or raised (the instance)."""

    reason: Reason = Reason.INTERNAL

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.reason = Reason(cls.reason)

    def __init__(self, message: str, *, reason: Reason | str | None = None):
        super().__init__(message)
        if reason:
            self.reason = Reason(reason)


class InvalidInput(AgentFlowError):
    """The caller gave something unusable (empty or oversized query, unknown tool, bad setting)."""

    reason = Reason.INVALID_INPUT


class EngineError(AgentFlowError):
    """An LLM engine failed (refused connection, HTTP error, bad response)."""

    reason = Reason.ENGINE_UNAVAILABLE


class EngineTimeout(EngineError):
    """An LLM call ran past its deadline."""

    reason = Reason.DEADLINE_EXCEEDED


class ToolFailure(AgentFlowError):
    """A tool could not run a command (its own error, a limit, a timeout)."""

    reason = Reason.TOOL_ERROR


class ParseFailure(AgentFlowError):
    """An LLM response could not be read as the structure a module expects."""

    reason = Reason.PARSE_ERROR
