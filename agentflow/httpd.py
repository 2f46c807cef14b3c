"""What the project's stdlib HTTP servers (the LLM server, the retriever) share: listening, writing one response."""

from __future__ import annotations

import json
import logging
from http.server import ThreadingHTTPServer

from agentflow.errors import AgentFlowError, InvalidInput, Reason

log = logging.getLogger(__name__)

HTTP_STATUS_BY_REASON = {  # every Reason, as gRPC's codes map to HTTP (tests/unit/test_error_reasons.py)
    Reason.INTERNAL: 500,
    Reason.INVALID_INPUT: 400,
    Reason.PARSE_ERROR: 400,
    Reason.FAILED_PRECONDITION: 400,
    Reason.NOT_FOUND: 404,
    Reason.NOT_READY: 503,
    Reason.UNAVAILABLE: 503,
    Reason.ENGINE_UNAVAILABLE: 503,
    Reason.TOOL_ERROR: 500,
    Reason.DEADLINE_EXCEEDED: 504,
    Reason.UNAUTHENTICATED: 401,
    Reason.PERMISSION_DENIED: 403,
    Reason.RESOURCE_EXHAUSTED: 429,
    Reason.CANCELLED: 499,  # the client closed the request
}


def http_status(error: AgentFlowError) -> int:
    """The HTTP status of a domain error."""
    return HTTP_STATUS_BY_REASON[error.reason]


def listen(what: str, host: str, port: int, handler) -> ThreadingHTTPServer:
    """A ThreadingHTTPServer of ``handler`` on ``host``:``port``; an address it cannot have is one error naming it."""
    try:
        return ThreadingHTTPServer((host, port), handler)
    except (OSError, OverflowError) as e:
        raise cannot_listen(what, host, port, e) from None


def cannot_listen(what: str, host: str, port: int, error: Exception) -> InvalidInput:
    """``what`` cannot listen on host:port (the port is taken, or the address is not this machine's)."""
    return InvalidInput(f"{what} cannot listen on {host}:{port}: {getattr(error, 'strerror', None) or error}")


def send(handler, status: int, payload: dict | list | str, *, content_type: str = "",
         headers: dict[str, str] | None = None) -> None:
    """Write ``payload`` (JSON, or text when a str) with its length; a 401 names the Bearer scheme; a client that
    went away meanwhile only closes the connection. ``handler._status`` keeps the status for the metrics. A header
    whose name or value is not printable ASCII (a CR/LF in it would split it) is left out and logged."""
    text = isinstance(payload, str)
    data = (payload if text else json.dumps(payload)).encode()
    handler._status = status
    try:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type or ("text/plain; charset=utf-8" if text
                                                             else "application/json"))
        handler.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            if _printable_ascii(name) and _printable_ascii(value):
                handler.send_header(name, value)
            else:
                log.warning("left out the response header %r: not printable ASCII", name)
        if status == 401:
            handler.send_header("WWW-Authenticate", "Bearer")
        if handler.close_connection:
            handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(data)
    except OSError:  # the client went away meanwhile
        handler.close_connection = True


def _printable_ascii(text) -> bool:
    return isinstance(text, str) and text.isascii() and text.isprintable()
