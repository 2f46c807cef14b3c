"""The retriever service: a ``DenseIndex`` over HTTP (stdlib ``ThreadingHTTPServer``), what `agentflow serve
retriever` runs and the ``search`` tool reads when ``retriever_url`` is set.

* ``GET /search?q=<query>&limit=<k>`` -> ``{"results": [{"title", "text", "url", "score"}, ...]}`` (the shape of
  ``agentflow.tools.http_tools``), best first;
* ``POST /search`` ``{"queries": [...], "limit": k}`` -> ``{"results": [[...], ...]}``, one list per query, embedded
  as one batch;
* ``GET /healthz`` -> ``{"status": "ok", "passages": N, "model": ...}``;
* ``GET /metrics``: Prometheus text (requests by route and code, latency histogram), from a registry of this server.

Limits (400 with ``{"error": {"message", "code"}}``): a query of 1 to ``MAX_QUERY_CHARS`` characters, ``limit``
1 to ``MAX_LIMIT``, at most ``MAX_BATCH`` queries a POST, a JSON object body of at most ``MAX_BODY_BYTES`` (413).
With an ``api_token``, ``/search`` needs ``Authorization: Bearer <token>`` (401); ``/healthz`` and ``/metrics`` stay
open (they show counts and timings, nothing a caller sent)."""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from agentflow import httpd
from agentflow.errors import AgentFlowError

log = logging.getLogger(__name__)

MAX_QUERY_CHARS = 1000
MAX_LIMIT = 50
DEFAULT_LIMIT = 3
MAX_BATCH = 64
MAX_BODY_BYTES = 256 * 1024
READ_TIMEOUT_S = 60.0
ROUTES = {"/search": ("GET", "POST"), "/healthz": ("GET",), "/metrics": ("GET",)}


class RequestError(Exception):
    """A request the server refuses, with its HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class _Metrics:
    """The server's own Prometheus registry: requests by route and code, latency by route."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter("agentflow_retriever_requests_total", "HTTP requests by route and status code",
                                ["route", "code"], registry=self.registry)
        self.latency = Histogram("agentflow_retriever_request_seconds", "request latency in seconds", ["route"],
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                                 registry=self.registry)
        self.queries = Counter("agentflow_retriever_queries_total", "queries searched (a batch counts each)",
                               registry=self.registry)

    def observe(self, route: str, code: int, seconds: float) -> None:
        self.requests.labels(route, str(code)).inc()
        self.latency.labels(route).observe(seconds)

    def text(self) -> tuple[str, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry).decode(), CONTENT_TYPE_LATEST


def parse_limit(value) -> int:
    """``limit`` as an integer from 1 to ``MAX_LIMIT`` (a string from a query string, or a JSON integer)."""
    if value is None:
        return DEFAULT_LIMIT
    if isinstance(value, str) and value.strip().lstrip("+").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise RequestError(400, f"limit must be an integer from 1 to {MAX_LIMIT}, got {value!r}")
    return value


def check_query(query, where: str = "q") -> str:
    if not isinstance(query, str) or not query.strip():
        raise RequestError(400, f"{where} must be a non-empty string")
    if len(query) > MAX_QUERY_CHARS:
        raise RequestError(400, f"{where} is {len(query)} characters; at most {MAX_QUERY_CHARS}")
    return query.strip()


def parse_batch(body) -> tuple[list[str], int]:
    if not isinstance(body, dict):
        raise RequestError(400, 'the body must be a JSON object {"queries": [...], "limit": k}')
    queries = body.get("queries")
    if not isinstance(queries, list) or not queries:
        raise RequestError(400, "queries must be a non-empty list of strings")
    if len(queries) > MAX_BATCH:
        raise RequestError(400, f"at most {MAX_BATCH} queries a request, got {len(queries)}")
    return [check_query(q, f"queries[{i}]") for i, q in enumerate(queries)], parse_limit(body.get("limit"))


def result_rows(hits) -> list[dict]:
    return [{"title": p.title, "text": p.text, "url": p.url, "score": round(score, 6)} for score, p in hits]


def make_server(index, host: str = "127.0.0.1", port: int = 0, api_token: str | None = None) -> ThreadingHTTPServer:
    """The retriever service over a loaded ``DenseIndex``; ``server.registry`` holds its metrics."""
    metrics = _Metrics()
    token = api_token or ""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True
        timeout = READ_TIMEOUT_S

        def log_message(self, fmt, *args):
            log.debug("%s " + fmt, self.address_string(), *args)

        def do_GET(self):
            self._handle("GET")

        def do_POST(self):
            self._handle("POST")

        def _handle(self, method: str):
            started, url = time.perf_counter(), urlsplit(self.path)
            route = url.path.rstrip("/") or "/"
            self._status = 0
            try:
                self._dispatch(method, route, url.query)
            except RequestError as e:
                self._error(e.status, str(e))
            except AgentFlowError as e:
                self._error(httpd.http_status(e), str(e))
            except Exception as e:
                log.exception("retriever request failed")
                self._error(500, f"internal error: {type(e).__name__}")
            label = route if route in ROUTES else "other"  # unknown paths share one label (bounded cardinality)
            metrics.observe(label, self._status or 499, time.perf_counter() - started)

        def _dispatch(self, method: str, route: str, query: str):
            if route not in ROUTES:
                raise RequestError(404, f"no route {route}; routes: {', '.join(ROUTES)}")
            if method not in ROUTES[route]:
                raise RequestError(405, f"{route} takes {' or '.join(ROUTES[route])}")
            if route == "/healthz":
                return self._send(200, {"status": "ok", "passages": len(index), "model": index.meta.get("model"),
                                        "kind": index.meta.get("kind")})
            if route == "/metrics":
                text, content_type = metrics.text()
                return self._send(200, text, content_type)
            self._authorize()
            if method == "GET":
                params = parse_qs(query, keep_blank_values=True)
                q = check_query((params.get("q") or [None])[-1])
                k = parse_limit((params.get("limit") or [None])[-1])
                metrics.queries.inc()
                return self._send(200, {"results": result_rows(index.search(q, k))})
            queries, k = parse_batch(self._body())
            metrics.queries.inc(len(queries))
            self._send(200, {"results": [result_rows(h) for h in index.search_many(queries, k)]})

        def _authorize(self):
            if not token:
                return
            given = self.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                raise RequestError(401, "/search needs 'Authorization: Bearer <token>'")

        def _body(self):
            if self.headers.get("Transfer-Encoding"):
                raise RequestError(411, "send the body with a Content-Length (no Transfer-Encoding)")
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                raise RequestError(400, "Content-Length is not a number") from None
            if not 0 < length <= MAX_BODY_BYTES:
                raise RequestError(413 if length > 0 else 400,
                                   f"the request body must be 1 to {MAX_BODY_BYTES} bytes, got {length}")
            try:
                return json.loads(self.rfile.read(length))
            except (ValueError, RecursionError):
                raise RequestError(400, "the request body is not JSON") from None

        def _error(self, status: int, message: str):
            self.close_connection = True  # the body may be unread: the connection cannot carry another request
            self._send(status, {"error": {"message": message, "code": status}})

        def _send(self, status: int, payload, content_type: str = ""):
            httpd.send(self, status, payload, content_type=content_type or "application/json")

    server = httpd.listen("the retriever", host, port, Handler)
    server.daemon_threads = True
    server.index = index
    server.registry = metrics.registry
    return server


def server_url(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/search"


def serve_in_background(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="retriever-server", daemon=True)
    thread.start()
    return thread
