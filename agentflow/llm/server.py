"""A local OpenAI-compatible endpoint over any Engine: ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``. What `agentflow up` starts when no LLM URL is given.

It speaks the subset the project's OpenAIEngine uses, with vLLM's extensions: ``return_token_ids`` (prompt ids at the
top level, response ids in the choice), ``logprobs`` (per-token, raw), ``response_format`` json_schema, and the
serving version in an ``x-model-version`` header. Concurrent requests reach the engine concurrently, so the
embedded engine batches them. One model, one version: splitting traffic between versions is the rollout issue's.
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

log = logging.getLogger(__name__)
MAX_BODY = 4 * 1024 * 1024


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


def make_server(engine: Engine, model_name: str, version: str, host: str = "127.0.0.1",
                port: int = 0) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out as two writes: Nagle + delayed ACK cost ~40 ms a call

        def log_message(self, fmt, *args):
            log.debug("%s " + fmt, self.address_string(), *args)

        def do_GET(self):
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                self._send(200, {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": version}]})
            elif self.path == "/health":
                self._send(200, {"status": "ok"})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    raise RequestError(413, f"request body over {MAX_BODY} bytes")
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    raise RequestError(400, "request body is not JSON") from None
                if not isinstance(body, dict):
                    raise RequestError(400, "request body must be a JSON object")
                self._send(200, chat_completion(engine, model_name, body))
            except RequestError as e:
                self._send(e.status, {"error": {"message": str(e), "code": e.status}})
            except EngineTimeout as e:
                self._send(504, {"error": {"message": str(e), "code": 504}})
            except AgentFlowError as e:
                self._send(503, {"error": {"message": str(e), "code": 503}})

        def _send(self, status: int, payload: dict):
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("x-model-version", version)
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve_in_background(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="llm-server", daemon=True)
    thread.start()
    return thread
