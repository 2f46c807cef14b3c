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
removes one, with vLLM's status codes and error bodies (``served_models``). ``GET /v1/models`` lists the served name
(``parent`` null) and every other version (``parent`` the served name, ``root`` its URI), and a chat request whose
``model`` names a loaded version goes to that version (the pin header is then ignored, as vLLM knows none) and answers
with that name as ``model``; the served name routes by weight as before.

Every request field is checked before the engine sees it (``protocol.parse_chat``: a 400 with an OpenAI-style error
body names the field); ``max_tokens``, the prompt's length, the body's size and the request's time are capped; a
client that disconnects while its completion is generated gets its engine row cancelled (``EmbeddedEngine.submit``).

The parts, after vLLM's protocol/serving/router split: ``protocol`` (a chat request checked, its response built; no
HTTP), ``served_models`` (``/v1/models`` and the LoRA API over ``Versions``), ``handler`` (the HTTP routes, reading
``server.state``), and here the settings and ``make_server``.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from http.server import ThreadingHTTPServer

from agentflow import httpd
from agentflow.llm.base import Engine
from agentflow.llm.handler import Handler, ServerState
from agentflow.llm.metrics import server_metrics
from agentflow.llm.protocol import ServerSettings
from agentflow.llm.versions import VersionError, Versions


def make_server(engine: Engine | Versions, model_name: str, version: str = "", host: str = "127.0.0.1",
                port: int = 0, *, admin_token: str = "", settings: ServerSettings | None = None) -> ThreadingHTTPServer:
    """The HTTP server over one engine (served as ``version``) or a set of ``Versions`` (with the admin API).
    ``admin_token`` overrides ``settings.admin_token``."""
    settings = settings or ServerSettings()
    if admin_token:
        settings = replace(settings, admin_token=admin_token)
    versions = engine if isinstance(engine, Versions) else _one_version(engine, version)
    metrics = server_metrics()
    metrics.served.add(versions)
    server = httpd.listen("the LLM server", host, port, Handler)
    server.daemon_threads = True
    server.state = ServerState(versions, model_name, settings, metrics)
    server.versions = versions
    return server


def _one_version(engine: Engine, version: str) -> Versions:
    """``engine`` as the only version, named ``version`` (or the engine's own version, or "default")."""
    versions = Versions(_fixed_engine)
    versions.add(version or getattr(engine, "version", "") or "default", "", engine=engine)
    return versions


def _fixed_engine(name: str, uri: str) -> Engine:
    raise VersionError("this server was started with one engine; it cannot load versions")


def serve_in_background(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="llm-server", daemon=True)
    thread.start()
    return thread
