"""A local OpenAI-compatible endpoint over any Engine: ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``, ``GET /metrics`` (Prometheus: requests, tokens, latency and time to first token per version, batch
occupancy and queue; ``llm/metrics.py``). What `agentflow up` starts when no LLM URL is given.

It speaks the subset the project's OpenAIEngine uses, with vLLM's extensions: ``return_token_ids`` (prompt ids at the
top level, response ids in the choice), ``logprobs`` (per-token, raw), ``response_format`` json_schema, and the
serving version in an ``x-model-version`` header. Concurrent requests reach the engine concurrently, so the
embedded engine batches them.

It can hold several versions of the model (``agentflow.llm.versions.Versions``) and split traffic between them by
weight, sticky by the ``x-trajectory-id`` request header. The admin API changes the set while serving:
``GET /admin/versions``; ``POST /admin/versions`` ``{"name", "uri"}`` (201; 409 if loaded; 400 if it cannot load,
or for a name ``agentflow.versions.check_version_name`` refuses: version names end up in response headers);
``PUT /admin/weights`` ``{"weights": {name: percent}}`` (400 unless known names summing to 100);
``DELETE /admin/versions/NAME`` (404 unknown; 409 while it has weight). The admin API always needs
``Authorization: Bearer <admin token>`` (without a configured token it is off: 403); the chat routes need
``Authorization: Bearer <api token>`` when one is configured (``ServerSettings``).

vLLM's runtime LoRA API is spoken too, behind the admin token like the admin API: ``POST /v1/load_lora_adapter``
``{"lora_name", "lora_path"}`` adds a version with weight 0, ``POST /v1/unload_lora_adapter`` ``{"lora_name"}``
removes one, with vLLM's status codes and error bodies (``load_lora``, ``unload_lora``). ``GET /v1/models`` lists
the served name (``parent`` null) and every other version (``parent`` the served name, ``root`` its URI), and a chat
request whose ``model`` names a loaded version goes to that version (the pin header is then ignored, as vLLM knows
none) and answers with that name as ``model``; the served name routes by weight as before.

Every request field is checked before the engine sees it (``parse_chat``: a 400 with an OpenAI-style error body
names the field); ``max_tokens``, the prompt's length, the body's size and the request's time are capped; a client
that disconnects while its completion is generated gets its engine row cancelled (``EmbeddedEngine.submit``).
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import select
import socket
import threading
import time
import uuid
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agentflow import httpd
from agentflow.config import setting
from agentflow.errors import AgentFlowError, EngineTimeout, InvalidInput
from agentflow.llm.base import Completion, Engine, Sampling
from agentflow.llm.metrics import server_metrics
from agentflow.llm.versions import VersionError, Versions
from agentflow.versions import check_version_name

log = logging.getLogger(__name__)
ADMIN = "/admin"  # the version admin API (docs/serving.md)
CHAT_ROUTES = ("/v1/chat/completions", "/chat/completions")
MODEL_ROUTES = ("/v1/models", "/models")
LOAD_LORA, UNLOAD_LORA = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"  # vLLM's runtime LoRA API
ROLES = ("system", "user", "assistant", "tool")
MAX_STOPS = 16  # OpenAI allows 4; the project's modules may send more
MAX_SEED = 2 ** 63 - 1  # torch.Generator.manual_seed takes 64-bit seeds
POLL_S = 0.1  # how often a waiting handler checks whether its client is still there
READ_TIMEOUT_S = 120.0  # a client that sends nothing for this long (idle keep-alive, slow body) is dropped


@dataclass(frozen=True)
class ServerSettings:
    """Limits and credentials of `agentflow serve-llm`: ``AGENTFLOW_LLM_<FIELD>`` or the matching flag."""

    max_tokens: int = setting(2048, "largest max_tokens a request may ask for (a larger one is refused: 400)")
    default_max_tokens: int = setting(256, "max_tokens of a request that names none")
    max_prompt_tokens: int = setting(8192, "longest prompt in tokens, after the chat template (longer: 400)")
    max_messages: int = setting(512, "most messages in one request")
    max_body_bytes: int = setting(4 * 1024 * 1024, "largest request body in bytes (larger: 413)")
    request_timeout_s: float = setting(300.0, "deadline of a chat request, in seconds (past it: 504; a request's "
                                              "own 'timeout' field may only shorten it)")
    api_token: str = setting("", "bearer token the chat routes (/v1/...) require; empty: they are open",
                             repr=False)
    admin_token: str = setting("", "bearer token the admin API requires; empty: the admin API is off",
                               repr=False)
    allowed_model_uris: str = setting("", "comma-separated folders and URI prefixes (s3://bucket/models/) that "
                                          "version URIs may come from, beside --model's folder and the model "
                                          "stores", repr=False)
    model_stores: str = setting("", "comma-separated model store roots (the trainer's --model-store) whose "
                                    "versions may be loaded")

    def __post_init__(self):
        positive = {"max_tokens": self.max_tokens, "default_max_tokens": self.default_max_tokens,
                    "max_prompt_tokens": self.max_prompt_tokens, "max_messages": self.max_messages,
                    "max_body_bytes": self.max_body_bytes, "request_timeout_s": self.request_timeout_s}
        for name, value in positive.items():
            if not (value > 0 and math.isfinite(value)):
                raise InvalidInput(f"AGENTFLOW_LLM_{name.upper()} must be positive, got {value}")
        if self.default_max_tokens > self.max_tokens:
            raise InvalidInput(f"default_max_tokens ({self.default_max_tokens}) is over max_tokens "
                               f"({self.max_tokens})")


class RequestError(Exception):
    """A request the server refuses: its HTTP status and, for a bad field, the field's name (OpenAI's ``param``);
    ``kind``: the error body's ``type`` where it is not the one the status implies (vLLM's names on its routes)."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None):
        super().__init__(message)
        self.status = status
        self.param = param
        self.kind = kind


class ClientGone(Exception):
    """The client closed its connection while its completion was being generated."""


@dataclass(frozen=True)
class ChatRequest:
    """A checked chat request: what the engine gets, and what the response should carry."""

    messages: list
    sampling: Sampling
    json_schema: dict | None
    timeout_s: float
    logprobs: bool
    return_token_ids: bool


def parse_chat(body: dict, model_name: str, settings: ServerSettings) -> ChatRequest:
    """Check every field the server uses (types, ranges, sizes); ``RequestError`` names the first bad one."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages must be a non-empty list of {role, content} objects", "messages")
    if len(messages) > settings.max_messages:
        raise RequestError(400, f"at most {settings.max_messages} messages, got {len(messages)}", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise RequestError(400, f"messages[{i}] must be {{role, content}} with role one of {', '.join(ROLES)} "
                                    "and content a string", "messages")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(400, "model must be a string", "model")
    if model and model != model_name:
        raise RequestError(404, f"model {model!r} is not served here; this server serves {model_name!r}", "model")
    if _integer(body, "n", 1, 1, 1) != 1:
        raise RequestError(400, "only n=1 is supported", "n")
    if body.get("stream"):
        raise RequestError(400, "stream is not supported", "stream")
    max_tokens = body.get("max_tokens")
    field = "max_tokens" if max_tokens is not None else "max_completion_tokens"
    max_tokens = _integer(body, field, settings.default_max_tokens, 1, settings.max_tokens)
    sampling = Sampling(temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True), max_tokens=max_tokens,
                        seed=_integer(body, "seed", None, 0, MAX_SEED), stop=_stops(body.get("stop")))
    timeout = _number(body, "timeout", settings.request_timeout_s, 0.0, math.inf, low_open=True)
    return ChatRequest([{"role": m["role"], "content": m["content"]} for m in messages], sampling,
                       _json_schema(body.get("response_format")), min(timeout, settings.request_timeout_s),
                       _flag(body, "logprobs"), _flag(body, "return_token_ids"))


def _number(body: dict, name: str, default, low: float, high: float, *, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < low or (low_open and value == low) or value > high:
        side = "(" if low_open else "["
        raise RequestError(400, f"{name} must be a number in {side}{low:g}, {high:g}], got {value!r}", name)
    return float(value)


def _integer(body: dict, name: str, default, low: int, high: int):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(400, f"{name} must be an integer from {low} to {high}, got {value!r}", name)
    return value


def _flag(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise RequestError(400, f"{name} must be true or false, got {value!r}", name)
    return bool(value)


def _stops(stop) -> tuple[str, ...]:
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(
            isinstance(s, str) and 0 < len(s) <= 256 for s in stops):
        raise RequestError(400, f"stop must be a string or a list of at most {MAX_STOPS} non-empty strings of at "
                                "most 256 characters", "stop")
    return tuple(stops)


def _json_schema(response_format) -> dict | None:
    """The schema a ``response_format`` asks for (None for text); flat string/enum schemas are decoded by the
    engine, and every other JSON object schema is accepted and answered as free text (as before)."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict) or response_format.get("type") not in ("text", "json_object",
                                                                                      "json_schema"):
        raise RequestError(400, "response_format must be {type: text | json_object | json_schema}", "response_format")
    if response_format["type"] != "json_schema":
        return None
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise RequestError(400, "response_format.json_schema.schema must be a JSON object", "response_format")
    properties = schema.get("properties")
    if properties is not None and not isinstance(properties, dict):
        raise RequestError(400, "the schema's properties must be an object", "response_format")
    for name, spec in (properties or {}).items():
        enum = spec.get("enum") if isinstance(spec, dict) else None
        if enum is not None and (not isinstance(enum, list) or not enum or not all(
                isinstance(e, str) for e in enum)):
            raise RequestError(400, f"the schema's {name!r} enum must be a non-empty list of strings",
                               "response_format")
    return schema


def chat_completion(engine: Engine, model_name: str, body: dict, settings: ServerSettings | None = None,
                    *, wait=None) -> tuple[dict, Completion]:
    """The OpenAI-style response to one chat request (``RequestError`` for a bad one), and the engine's completion.
    ``wait(pending, timeout)`` waits on an engine that can ``submit`` (the server's: it cancels the request when the
    client goes away)."""
    settings = settings or ServerSettings()
    request = parse_chat(body, model_name, settings)
    if wait is not None and hasattr(engine, "submit"):
        pending = engine.submit(request.messages, request.sampling, timeout=request.timeout_s,
                                json_schema=request.json_schema, max_prompt_tokens=settings.max_prompt_tokens)
        completion = wait(pending, request.timeout_s)
    else:
        completion = engine.complete(request.messages, request.sampling, timeout=request.timeout_s,
                                     json_schema=request.json_schema)
    choice = {"index": 0, "message": {"role": "assistant", "content": completion.text},
              "finish_reason": completion.finish_reason or "stop"}
    response = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": model_name, "choices": [choice],
                "usage": {"prompt_tokens": len(completion.prompt_token_ids),
                          "completion_tokens": len(completion.token_ids),
                          "total_tokens": len(completion.prompt_token_ids) + len(completion.token_ids)}}
    if request.logprobs:
        choice["logprobs"] = {"content": [{"token": str(t), "logprob": lp}
                                          for t, lp in zip(completion.token_ids, completion.logprobs)]}
    if request.return_token_ids:
        response["prompt_token_ids"] = completion.prompt_token_ids
        choice["token_ids"] = completion.token_ids
    return response, completion


def load_lora(versions: Versions, served_name: str, body: dict) -> str:
    """``POST /v1/load_lora_adapter``: load ``lora_path`` as version ``lora_name`` with weight 0 (like ``POST
    /admin/versions``: the server's loader applies the URI allow-list). vLLM's answers: 200 with a text body; 400
    ``InvalidUserInput`` for a missing field, a name ``check_version_name`` refuses, the served name, or a name
    loaded already. A checkpoint that cannot (or may not) be loaded is a 400 ``BadRequestError`` with the reason,
    where vLLM answers 404 (no adapter at the path) or 500 (an adapter its engine refuses)."""
    name, path = body.get("lora_name"), body.get("lora_path")
    if not (isinstance(name, str) and name and isinstance(path, str) and path):
        raise RequestError(400, "Both 'lora_name' and 'lora_path' must be provided.", kind="InvalidUserInput")
    try:
        check_version_name(name)
    except InvalidInput as e:
        raise RequestError(400, str(e), "lora_name", kind="InvalidUserInput") from None
    if name == served_name:
        raise RequestError(400, f"The lora adapter '{name}' conflicts with a served base model.",
                           kind="InvalidUserInput")
    if body.get("load_inplace"):
        raise RequestError(400, "load_inplace is not supported: load changed weights under a new name",
                           "load_inplace", kind="InvalidUserInput")
    try:
        versions.add(name, path)
    except VersionError as e:
        if e.status == 409:
            raise RequestError(400, f"The lora adapter '{name}' has already been loaded.",
                               kind="InvalidUserInput") from None
        raise RequestError(400, str(e), kind="BadRequestError") from None
    return f"Success: LoRA adapter '{name}' added successfully."


def unload_lora(versions: Versions, served_name: str, body: dict) -> str:
    """``POST /v1/unload_lora_adapter``: unload version ``lora_name``. vLLM's answers: 200 with a text body; 400
    ``InvalidUserInput`` without a name; 404 ``NotFoundError`` for a name that is not loaded or is the served name
    (the base model, never unloaded). A version that still has weight (``PUT /admin/weights``) is a 409
    ``ConflictError`` (vLLM has no weights)."""
    name = body.get("lora_name")
    if not isinstance(name, str) or not name:
        raise RequestError(400, "'lora_name' needs to be provided to unload a LoRA adapter.", kind="InvalidUserInput")
    missing = RequestError(404, f"The lora adapter '{name}' cannot be found.", kind="NotFoundError")
    if name == served_name:
        raise missing
    try:
        versions.remove(name)
    except VersionError as e:
        if e.status == 404:
            raise missing from None
        raise RequestError(e.status, str(e), kind="ConflictError" if e.status == 409 else None) from None
    return f"Success: LoRA adapter '{name}' removed successfully."


def list_models(versions: Versions, served_name: str) -> dict:
    """``GET /v1/models`` as vLLM answers it: the served name first (``parent`` null; ``root`` the URI of the
    version of that name, if one is loaded), then every other version as an adapter of it."""
    now = int(time.time())
    described = versions.describe()
    uris = {v["name"]: v["uri"] for v in described}
    base = {"id": served_name, "object": "model", "created": now, "owned_by": ",".join(uris),
            "root": uris.get(served_name) or None, "parent": None}
    return {"object": "list", "data": [base, *(
        {"id": v["name"], "object": "model", "created": now, "owned_by": "agentflow", "root": v["uri"] or None,
         "parent": served_name} for v in described if v["name"] != served_name)]}


def make_server(engine: Engine | Versions, model_name: str, version: str = "", host: str = "127.0.0.1",
                port: int = 0, *, admin_token: str = "", settings: ServerSettings | None = None) -> ThreadingHTTPServer:
    """The HTTP server over one engine (served as ``version``) or a set of ``Versions`` (with the admin API).
    ``admin_token`` overrides ``settings.admin_token``."""
    settings = settings or ServerSettings()
    if admin_token:
        settings = replace(settings, admin_token=admin_token)
    if isinstance(engine, Versions):
        versions = engine
    else:
        versions = Versions(_fixed_engine)
        versions.add(version or getattr(engine, "version", "") or "default", "", engine=engine)
    metrics = server_metrics()
    metrics.served.add(versions)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out as two writes: Nagle + delayed ACK cost ~40 ms a call
        timeout = READ_TIMEOUT_S

        def log_message(self, fmt, *args):
            log.debug("%s " + fmt, self.address_string(), *args)

        def do_GET(self):
            path = self.path.rstrip("/")
            if path == "/health":
                health = versions.health()
                ok = bool(health) and all(health.values())
                self._send(200 if ok else 503, {"status": "ok" if ok else "unavailable", "versions": sorted(health),
                                                "unhealthy": [n for n, good in health.items() if not good]})
            elif path in MODEL_ROUTES:
                self._guarded(lambda: self._send(200, list_models(versions, model_name)), admin_too=True)
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
                return self._admin(lambda body: versions.add(_field(body, "name"), _field(body, "uri")), 201)
            if path in (LOAD_LORA, UNLOAD_LORA):
                return self._lora(load_lora if path == LOAD_LORA else unload_lora)
            if path not in CHAT_ROUTES:
                return self._error(404, f"no route {self.path}")
            started, self._served, self._status, self._completion = time.perf_counter(), "", 0, None
            self._guarded(self._chat)
            metrics.observe(self._served or "none", self._status or 499, time.perf_counter() - started,
                            self._completion)

        def _chat(self):
            body = self._body()
            model = body.get("model")
            if isinstance(model, str) and model and model != model_name:
                if model not in versions.names():
                    raise RequestError(404, f"model {model!r} is not served here; this server serves "
                                            f"{', '.join([model_name, *versions.names()])}", "model")
                name, chosen = versions.route(pin=model)  # a version by its own name, as vLLM serves an adapter
                answered_as = name
            else:
                name, chosen = versions.route(self.headers.get("x-trajectory-id", ""),
                                              pin=self.headers.get("x-model-version-pin", ""))
                answered_as = model_name
            self._served = name
            response, self._completion = chat_completion(chosen, answered_as, body, settings, wait=self._wait)
            self._send(200, response, name)

        def _guarded(self, handle, *, admin_too: bool = False):
            """Answer a chat-side route: the API token first (``admin_too``: or the admin token, which may read what
            is served, as the LoRA routes' caller does), then every failure as its status (never a dropped
            connection, never an exception out of the handler)."""
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

        def do_PUT(self):
            if self.path.rstrip("/") != ADMIN + "/weights":
                return self._error(404, f"no route {self.path}")
            self._admin(lambda body: versions.set_weights(body.get("weights")), 200)

        def do_DELETE(self):
            prefix = ADMIN + "/versions/"
            if not self.path.startswith(prefix):
                return self._error(404, f"no route {self.path}")
            name = self.path[len(prefix):].rstrip("/")
            self._admin(lambda: versions.remove(name), 200, read_body=False)

        def _admin(self, change, status: int, read_body: bool = True):
            """Apply an admin change and answer with the versions; a bad change answers its error status and leaves
            the serving versions as they were. Always behind the admin token (none configured: the API is off)."""
            try:
                self._authorize_admin()
                change(self._body()) if read_body else change()
                self._send(status, {"versions": versions.describe()})
            except (RequestError, VersionError) as e:
                self._error(e.status, str(e), getattr(e, "param", None))

        def _lora(self, change):
            """vLLM's runtime LoRA routes: behind the admin token like the admin API; 200 with vLLM's text body."""
            try:
                self._authorize_admin()
                self._send(200, change(versions, model_name, self._body()))
            except (RequestError, VersionError) as e:
                self._error(e.status, str(e), getattr(e, "param", None), getattr(e, "kind", None))

        def _authorize_admin(self) -> None:
            if not settings.admin_token:
                raise RequestError(403, "the admin API is off: start serve-llm with --admin-token (or "
                                        "AGENTFLOW_LLM_ADMIN_TOKEN)")
            self._authorize(settings.admin_token, "the admin API")

        def _authorize(self, token: str, what: str) -> None:
            if token and not self._bearer_is(token):
                raise RequestError(401, f"{what} needs 'Authorization: Bearer <token>'")

        def _bearer_is(self, token: str) -> bool:
            given = self.headers.get("Authorization", "")
            return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

        def _body(self) -> dict:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                raise RequestError(400, "Content-Length is not a number") from None
            if self.headers.get("Transfer-Encoding"):
                raise RequestError(411, "send the body with a Content-Length (no Transfer-Encoding)")
            if length < 0 or length > settings.max_body_bytes:
                self.close_connection = True  # the body is left unread
                raise RequestError(413, f"the request body must be 0 to {settings.max_body_bytes} bytes, "
                                        f"got {length}")
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except (ValueError, RecursionError):  # bad JSON, bad UTF-8, nesting too deep
                raise RequestError(400, "request body is not JSON") from None
            if not isinstance(body, dict):
                raise RequestError(400, "request body must be a JSON object")
            return body

        def _error(self, status: int, message: str, param: str | None = None, kind: str | None = None):
            kind = kind or {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                            504: "timeout_error"}.get(status, "invalid_request_error" if status < 500 else
                                                      "server_error")
            self.close_connection = True  # the body may be unread: the connection cannot carry another request
            self._send(status, {"error": {"message": message, "type": kind, "param": param, "code": status}})

        def _send(self, status: int, payload: dict | str, served: str = "", content_type: str = ""):
            """A JSON answer, or a text one (vLLM's LoRA routes answer success as text)."""
            httpd.send(self, status, payload, content_type=content_type,
                       headers={"x-model-version": served} if served else None)

    server = httpd.listen("the LLM server", host, port, Handler)
    server.daemon_threads = True
    server.versions = versions
    return server


def _fixed_engine(name: str, uri: str) -> Engine:
    raise VersionError("this server was started with one engine; it cannot load versions")


def _field(body: dict, name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise RequestError(400, f"{name!r} must be a non-empty string")
    return value


def serve_in_background(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="llm-server", daemon=True)
    thread.start()
    return thread
