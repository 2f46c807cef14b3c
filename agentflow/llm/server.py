"""A local OpenAI-compatible endpoint over any Engine: ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``. What `agentflow up` starts when no LLM URL is given.

It speaks the subset the project's OpenAIEngine uses, with vLLM's extensions: ``return_token_ids`` (prompt ids at the
top level, response ids in the choice), ``logprobs`` (per-token, raw), ``response_format`` json_schema, and the
serving version in an ``x-model-version`` header. Concurrent requests reach the engine concurrently, so the
embedded engine batches them.

It can hold several versions of the model (``agentflow.llm.versions.Versions``) and split traffic between them by
weight, sticky by the ``x-trajectory-id`` request header. The admin API changes the set while serving:
``GET /admin/versions``; ``POST /admin/versions`` ``{"name", "uri"}`` (201; 409 if loaded; 400 if it cannot load);
``PUT /admin/weights`` ``{"weights": {name: percent}}`` (400 unless known names summing to 100);
``DELETE /admin/versions/NAME`` (404 unknown; 409 while it has weight). With an admin token, these need
``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agentflow.errors import AgentFlowError, EngineTimeout
from agentflow.llm.base import Engine, Sampling
from agentflow.llm.versions import Versions, VersionError

log = logging.getLogger(__name__)
MAX_BODY = 4 * 1024 * 1024
ADMIN = "/admin"  # the version admin API (docs/serving.md)


class RequestError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def chat_completion(engine: Engine, model_name: str, body: dict) -> dict:
    """The OpenAI-style response to one chat request (``RequestError`` for a bad one)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in messages):
        raise RequestError(400, "messages must be a non-empty list of {role, content} objects")
    if body.get("n", 1) != 1:
        raise RequestError(400, "only n=1 is supported")
    if body.get("model") and body["model"] != model_name:
        raise RequestError(404, f"model {body['model']!r} is not served here; this server serves {model_name!r}")
    try:
        stop = body.get("stop") or ()
        sampling = Sampling(temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
                            max_tokens=int(body.get("max_tokens") or 256), seed=body.get("seed"),
                            stop=(stop,) if isinstance(stop, str) else tuple(stop))
    except (TypeError, ValueError) as e:
        raise RequestError(400, f"bad sampling settings: {e}") from None
    schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema")
    completion = engine.complete(messages, sampling, timeout=float(body.get("timeout", 600)), json_schema=schema)
    choice = {"index": 0, "message": {"role": "assistant", "content": completion.text},
              "finish_reason": completion.finish_reason or "stop"}
    response = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": model_name, "choices": [choice],
                "usage": {"prompt_tokens": len(completion.prompt_token_ids),
                          "completion_tokens": len(completion.token_ids),
                          "total_tokens": len(completion.prompt_token_ids) + len(completion.token_ids)}}
    if body.get("logprobs"):
        choice["logprobs"] = {"content": [{"token": str(t), "logprob": lp}
                                          for t, lp in zip(completion.token_ids, completion.logprobs)]}
    if body.get("return_token_ids"):
        response["prompt_token_ids"] = completion.prompt_token_ids
        choice["token_ids"] = completion.token_ids
    return response


def make_server(engine: Engine | Versions, model_name: str, version: str = "", host: str = "127.0.0.1",
                port: int = 0, *, admin_token: str = "") -> ThreadingHTTPServer:
    """The HTTP server over one engine (served as ``version``) or a set of ``Versions`` (with the admin API)."""
    if isinstance(engine, Versions):
        versions = engine
    else:
        versions = Versions(_fixed_engine)
        versions.add(version or getattr(engine, "version", "") or "default", "", engine=engine)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out as two writes: Nagle + delayed ACK cost ~40 ms a call

        def log_message(self, fmt, *args):
            log.debug("%s " + fmt, self.address_string(), *args)

        def do_GET(self):
            path = self.path.rstrip("/")
            if path in ("/v1/models", "/models"):
                self._send(200, {"object": "list", "data": [{"id": model_name, "object": "model",
                                                             "owned_by": ",".join(versions.names())}]})
            elif path == "/health":
                self._send(200, {"status": "ok", "versions": versions.names()})
            elif path == ADMIN + "/versions":
                self._admin(lambda: None, 200, read_body=False)
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):
            path = self.path.rstrip("/")
            if path == ADMIN + "/versions":
                return self._admin(lambda body: versions.add(_field(body, "name"), _field(body, "uri")), 201)
            if path not in ("/v1/chat/completions", "/chat/completions"):
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            try:
                name, chosen = versions.route(self.headers.get("x-trajectory-id", ""),
                                              pin=self.headers.get("x-model-version-pin", ""))
                self._send(200, chat_completion(chosen, model_name, self._body()), name)
            except RequestError as e:
                self._send(e.status, {"error": {"message": str(e), "code": e.status}})
            except VersionError as e:
                self._send(e.status, {"error": {"message": str(e), "code": e.status}})
            except EngineTimeout as e:
                self._send(504, {"error": {"message": str(e), "code": 504}})
            except AgentFlowError as e:
                self._send(503, {"error": {"message": str(e), "code": 503}})

        def do_PUT(self):
            if self.path.rstrip("/") != ADMIN + "/weights":
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            self._admin(lambda body: versions.set_weights(body.get("weights")), 200)

        def do_DELETE(self):
            prefix = ADMIN + "/versions/"
            if not self.path.startswith(prefix):
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            name = self.path[len(prefix):].rstrip("/")
            self._admin(lambda: versions.remove(name), 200, read_body=False)

        def _admin(self, change, status: int, read_body: bool = True):
            """Apply an admin change and answer with the versions; a bad change answers its error status and leaves
            the serving versions as they were."""
            try:
                if admin_token and self.headers.get("Authorization", "") != f"Bearer {admin_token}":
                    raise RequestError(401, "the admin API needs 'Authorization: Bearer <token>'")
                change(self._body()) if read_body else change()
                self._send(status, {"versions": versions.describe()})
            except (RequestError, VersionError) as e:
                self._send(e.status, {"error": {"message": str(e), "code": e.status}})

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                raise RequestError(413, f"request body over {MAX_BODY} bytes")
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                raise RequestError(400, "request body is not JSON") from None
            if not isinstance(body, dict):
                raise RequestError(400, "request body must be a JSON object")
            return body

        def _send(self, status: int, payload: dict, served: str = ""):
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if served:
                self.send_header("x-model-version", served)
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer((host, port), Handler)
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
