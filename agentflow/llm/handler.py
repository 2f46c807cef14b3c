"""The LLM server's HTTP routes (``agentflow.llm.server`` lists them): one ``Handler`` per request, reading what it
serves from ``ServerState`` (``server.state``, set by ``make_server``). Every failure is answered with its status and
an OpenAI-style error body, never a dropped connection; a client that goes away while its completion is generated
gets its engine row cancelled."""

from __future__ import annotations

import hmac
import json
import logging
import select
import socket
import time
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

from agentflow import httpd
from agentflow.errors import AgentFlowError, EngineTimeout
from agentflow.llm.base import Engine
from agentflow.llm.metrics import ServerMetrics
from agentflow.llm.protocol import RequestError, ServerSettings, chat_completion, string_field
from agentflow.llm.served_models import list_models, load_lora, unload_lora
from agentflow.llm.versions import VersionError, Versions


log = logging.getLogger("agentflow.llm.server")  # the server's log lines, under the name they had before the split
ADMIN = "/admin"  # the version admin API (docs/serving.md)
CHAT_ROUTES = ("/v1/chat/completions", "/chat/completions")
MODEL_ROUTES = ("/v1/models", "/models")
LOAD_LORA, UNLOAD_LORA = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"  # vLLM's runtime LoRA API
POLL_S = 0.1  # how often a waiting handler checks whether its client is still there
READ_TIMEOUT_S = 120.0  # a client that sends nothing for this long (idle keep-alive, slow body) is dropped
ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 504: "timeout_error"}


@dataclass(frozen=True)
class ServerState:
    """What every request of one server reads."""

    versions: Versions
    model_name: str  # the served name
    settings: ServerSettings
    metrics: ServerMetrics


class ClientGone(Exception):
    """The client closed its connection while its completion was being generated."""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as two writes: Nagle + delayed ACK cost ~40 ms a call
    timeout = READ_TIMEOUT_S

    @property
    def state(self) -> ServerState:
        return self.server.state

    def log_message(self, fmt, *args):
        log.debug("%s " + fmt, self.address_string(), *args)

    def do_GET(self):
        path = self.path.rstrip("/")
        if path == "/health":
            self._health()
        elif path in MODEL_ROUTES:
            self._guarded(lambda: self._send(200, list_models(self.state.versions, self.state.model_name)),
                          admin_too=True)
        elif path == ADMIN + "/versions":
            self._admin(lambda: None, 200, read_body=False)
        elif path == "/metrics":  # Prometheus text, open like vLLM's: counts and timings, nothing a caller sent
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            self._send(200, generate_latest().decode(), content_type=CONTENT_TYPE_LATEST)
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self):
        path = self.path.rstrip("/")
        if path == ADMIN + "/versions":
            return self._admin(lambda body: self.state.versions.add(string_field(body, "name"),
                                                                    string_field(body, "uri")), 201)
        if path in (LOAD_LORA, UNLOAD_LORA):
            return self._lora(load_lora if path == LOAD_LORA else unload_lora)
        if path not in CHAT_ROUTES:
            return self._error(404, f"no route {self.path}")
        started, self._served, self._status, self._completion = time.perf_counter(), "", 0, None
        self._guarded(self._chat)
        self.state.metrics.observe(self._served or "none", self._status or 499, time.perf_counter() - started,
                                   self._completion)

    def do_PUT(self):
        if self.path.rstrip("/") != ADMIN + "/weights":
            return self._error(404, f"no route {self.path}")
        self._admin(lambda body: self.state.versions.set_weights(body.get("weights")), 200)

    def do_DELETE(self):
        prefix = ADMIN + "/versions/"
        if not self.path.startswith(prefix):
            return self._error(404, f"no route {self.path}")
        name = self.path[len(prefix):].rstrip("/")
        self._admin(lambda: self.state.versions.remove(name), 200, read_body=False)

    def _health(self):
        health = self.state.versions.health()
        ok = bool(health) and all(health.values())
        self._send(200 if ok else 503, {"status": "ok" if ok else "unavailable", "versions": sorted(health),
                                        "unhealthy": [n for n, good in health.items() if not good]})

    def _chat(self):
        body = self._body()
        name, chosen, answered_as = self._route(body.get("model"))
        self._served = name
        response, self._completion = chat_completion(chosen, answered_as, body, self.state.settings, wait=self._wait)
        self._send(200, response, name)

    def _route(self, model) -> tuple[str, Engine, str]:
        """The version that answers (its name and engine) and the name it answers as: the version a ``model`` names,
        as vLLM serves an adapter (the pin header is then ignored); else one chosen by weight, trajectory and pin."""
        versions, served_name = self.state.versions, self.state.model_name
        if isinstance(model, str) and model and model != served_name:
            if model not in versions.names():
                raise RequestError(404, f"model {model!r} is not served here; this server serves "
                                        f"{', '.join([served_name, *versions.names()])}", "model")
            name, chosen = versions.route(pin=model)
            return name, chosen, name
        name, chosen = versions.route(self.headers.get("x-trajectory-id", ""),
                                      pin=self.headers.get("x-model-version-pin", ""))
        return name, chosen, served_name

    def _guarded(self, handle, *, admin_too: bool = False):
        """Answer a chat-side route: the API token first (``admin_too``: or the admin token, which may read what
        is served, as the LoRA routes' caller does), then every failure as its status (never a dropped
        connection, never an exception out of the handler)."""
        settings = self.state.settings
        try:
            if not (admin_too and settings.admin_token and self._bearer_is(settings.admin_token)):
                self._authorize(settings.api_token, "the chat API")
            handle()
        except ClientGone:
            self.close_connection = True
        except (RequestError, VersionError) as e:
            self._error(e.status, str(e), getattr(e, "param", None))
        except AgentFlowError as e:
            self._error(httpd.http_status(e), str(e))
        except Exception as e:
            log.exception("chat request failed")
            self._error(500, f"internal error: {type(e).__name__}")

    def _wait(self, pending, timeout: float):
        """The engine's answer to ``pending``; cancel it when the client goes away or the deadline passes."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return pending.future.result(timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
            except FutureTimeout:
                if self._client_gone():
                    pending.cancel()
                    log.info("client %s went away: its request is cancelled", self.address_string())
                    raise ClientGone() from None
                if time.monotonic() >= deadline:
                    pending.cancel()
                    raise EngineTimeout(f"the request ran past its deadline of {timeout:g} s") from None

    def _client_gone(self) -> bool:
        """Whether the client closed its end: readable with nothing to read (EOF) or an error."""
        poller = select.poll()
        poller.register(self.connection, select.POLLIN | select.POLLERR | select.POLLHUP)
        events = poller.poll(0)
        if not events:
            return False
        if events[0][1] & (select.POLLERR | select.POLLHUP):
            return True
        try:
            return self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def _admin(self, change, status: int, read_body: bool = True):
        """Apply an admin change and answer with the versions; a bad change answers its error status and leaves
        the serving versions as they were. Always behind the admin token (none configured: the API is off)."""
        try:
            self._authorize_admin()
            change(self._body()) if read_body else change()
            self._send(status, {"versions": self.state.versions.describe()})
        except (RequestError, VersionError) as e:
            self._error(e.status, str(e), getattr(e, "param", None))

    def _lora(self, change):
        """vLLM's runtime LoRA routes: behind the admin token like the admin API; 200 with vLLM's text body."""
        try:
            self._authorize_admin()
            self._send(200, change(self.state.versions, self.state.model_name, self._body()))
        except (RequestError, VersionError) as e:
            self._error(e.status, str(e), getattr(e, "param", None), getattr(e, "kind", None))

    def _authorize_admin(self) -> None:
        admin_token = self.state.settings.admin_token
        if not admin_token:
            raise RequestError(403, "the admin API is off: start serve-llm with --admin-token (or "
                                    "AGENTFLOW_LLM_ADMIN_TOKEN)")
        self._authorize(admin_token, "the admin API")

    def _authorize(self, token: str, what: str) -> None:
        if token and not self._bearer_is(token):
            raise RequestError(401, f"{what} needs 'Authorization: Bearer <token>'")

    def _bearer_is(self, token: str) -> bool:
        given = self.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    def _body(self) -> dict:
        max_bytes = self.state.settings.max_body_bytes
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise RequestError(400, "Content-Length is not a number") from None
        if self.headers.get("Transfer-Encoding"):
            raise RequestError(411, "send the body with a Content-Length (no Transfer-Encoding)")
        if length < 0 or length > max_bytes:
            self.close_connection = True  # the body is left unread
            raise RequestError(413, f"the request body must be 0 to {max_bytes} bytes, got {length}")
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except (ValueError, RecursionError):  # bad JSON, bad UTF-8, nesting too deep
            raise RequestError(400, "request body is not JSON") from None
        if not isinstance(body, dict):
            raise RequestError(400, "request body must be a JSON object")
        return body

    def _error(self, status: int, message: str, param: str | None = None, kind: str | None = None):
        kind = kind or ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.close_connection = True  # the body may be unread: the connection cannot carry another request
        self._send(status, {"error": {"message": message, "type": kind, "param": param, "code": status}})

    def _send(self, status: int, payload: dict | str, served: str = "", content_type: str = ""):
        """A JSON answer, or a text one (vLLM's LoRA routes answer success as text)."""
        httpd.send(self, status, payload, content_type=content_type,
                   headers={"x-model-version": served} if served else None)
