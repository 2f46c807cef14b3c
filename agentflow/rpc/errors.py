"""One server interceptor maps domain errors (``AgentFlowError.reason``) to gRPC status codes.

Handlers never set status codes themselves; anything that is not a domain error is INTERNAL and logged once.
"""

from __future__ import annotations

import logging

import grpc

from agentflow.errors import AgentFlowError, Reason

log = logging.getLogger(__name__)

STATUS_BY_REASON = {  # every Reason (tests/unit/test_error_reasons.py)
    Reason.INTERNAL: grpc.StatusCode.INTERNAL,
    Reason.INVALID_INPUT: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.PARSE_ERROR: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Reason.NOT_READY: grpc.StatusCode.UNAVAILABLE,
    Reason.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Reason.ENGINE_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Reason.TOOL_ERROR: grpc.StatusCode.INTERNAL,
    Reason.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    Reason.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Reason.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    Reason.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reason.CANCELLED: grpc.StatusCode.CANCELLED,
}


def status_for(error: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(error, AgentFlowError):
        return STATUS_BY_REASON[error.reason], f"{error.reason}: {error}"
    return grpc.StatusCode.INTERNAL, f"internal error ({type(error).__name__}); see the service log"


class ErrorInterceptor(grpc.ServerInterceptor):
    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if handler.unary_unary:
            return handler._replace(unary_unary=_guard_unary(handler.unary_unary, method))
        if handler.unary_stream:
            return handler._replace(unary_stream=_guard_stream(handler.unary_stream, method))
        return handler


def _abort(context: grpc.ServicerContext, error: Exception, method: str):
    code, message = status_for(error)
    if code == grpc.StatusCode.INTERNAL:
        log.exception("%s failed", method, exc_info=error)
    context.abort(code, message)


def _guard_unary(behaviour, method):
    def call(request, context):
        try:
            return behaviour(request, context)
        except Exception as e:  # abort raises its own exception type, which is not caught twice
            if isinstance(e, grpc.RpcError) or type(e).__name__ == "_AbortionError":
                raise
            _abort(context, e, method)

    return call


def _guard_stream(behaviour, method):
    def call(request, context):
        try:
            yield from behaviour(request, context)
        except Exception as e:
            if isinstance(e, grpc.RpcError) or type(e).__name__ == "_AbortionError":
                raise
            _abort(context, e, method)

    return call
