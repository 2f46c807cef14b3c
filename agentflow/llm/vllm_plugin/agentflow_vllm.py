"""Loaded into a vLLM server (not into AgentFlow): full-weight versions replaced in place, behind a token.

``start_vllm(..., weights_token=...)`` (agentflow/llm/vllm_server.py) puts this folder on the server's PYTHONPATH
and starts it with::

    VLLM_SERVER_DEV_MODE=1 AGENTFLOW_VLLM_ADMIN_TOKEN=<token>
    --worker-extension-cls agentflow_vllm.WeightsFromFolder --middleware agentflow_vllm.AdminTokenMiddleware

The rollout fleet's ``vllm`` kind (agentflow/rollout/vllm_fleet.py) then swaps the weights of a running server:
``POST /pause?mode=wait``, ``POST /collective_rpc {"method": "load_weights_from", "args": [folder, version]}``,
``POST /reset_prefix_cache``, ``POST /resume``. vLLM's development routes answer anyone who reaches the port
(``--api-key`` guards only the OpenAI routes): ``AdminTokenMiddleware`` refuses every route but the OpenAI ones,
health and metrics without the bearer token, and all of them when no token is set.

Only the standard library and vLLM: the server's virtual environment has no AgentFlow.
"""

from __future__ import annotations

import glob
import hmac
import json
import os

TOKEN_ENV = "AGENTFLOW_VLLM_ADMIN_TOKEN"
#: The version whose folder the server was started with (--model), so that it counts as loaded from the start.
START_VERSION_ENV = "AGENTFLOW_VLLM_START_VERSION"
#: What callers reach without the admin token (vLLM's own --api-key still guards /v1).
OPEN_PREFIXES = ("/v1/", "/health", "/ping", "/metrics", "/version", "/tokenize", "/detokenize")


class WeightsFromFolder:
    """A vLLM worker extension: its methods run in every worker through ``/collective_rpc``."""

    def is_model_folder(self, folder: str) -> dict:
        """``{"model_folder"}``: whether ``folder`` is an absolute path to a safetensors model folder (a mirrored
        version has arrived). A dict: ``/collective_rpc`` answers other results as their text."""
        return {"model_folder": _is_model_folder(folder)}

    def load_weights_from(self, folder: str, version: str) -> str:
        """Replace every weight with those of the safetensors model ``folder`` (same architecture), and remember
        ``version`` as what is loaded. The folder is checked first: a reload that fails half way leaves the model
        without weights and the engine dead."""
        if not _is_model_folder(folder):
            raise ValueError(f"not an absolute path to a safetensors model folder: {folder!r}")
        self.reload_weights(weights_path=folder)
        head = getattr(self.model_runner.get_model(), "lm_head", None)
        method = getattr(head, "quant_method", None)
        if hasattr(method, "process_weights_after_loading"):
            # a head tied to the embeddings has no weights of its own in the folder, so the reload skips it; on CPU
            # it multiplies through a packed copy of the old embeddings until that copy is rebuilt
            method.process_weights_after_loading(head)
        self.agentflow_version = version
        return version

    def loaded_version(self) -> dict:
        """``{"version"}``: the one ``load_weights_from`` loaded last, else the version the server started with
        (``$AGENTFLOW_VLLM_START_VERSION``, "" when unset); ``{"model"}``: the name it is served under."""
        names = self.model_config.served_model_name
        model = names[0] if isinstance(names, (list, tuple)) else names
        version = getattr(self, "agentflow_version", "") or os.environ.get(START_VERSION_ENV, "")
        return {"version": version, "model": str(model or self.model_config.model)}


def _is_model_folder(folder: str) -> bool:
    return bool(os.path.isabs(folder) and os.path.isfile(os.path.join(folder, "config.json"))
                and glob.glob(os.path.join(folder, "*.safetensors")))


class AdminTokenMiddleware:
    """ASGI middleware: routes outside ``OPEN_PREFIXES`` need ``Authorization: Bearer $AGENTFLOW_VLLM_ADMIN_TOKEN``
    (401 without it; 403 for every one of them when the variable is unset)."""

    def __init__(self, app):
        self.app = app
        self.token = os.environ.get(TOKEN_ENV, "").encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].startswith(OPEN_PREFIXES):
            return await self.app(scope, receive, send)
        if not self.token:
            return await _refuse(send, 403, f"admin routes are off: {TOKEN_ENV} is not set")
        given = dict(scope.get("headers") or ()).get(b"authorization", b"")
        if not hmac.compare_digest(given, b"Bearer " + self.token):
            return await _refuse(send, 401, "admin routes need the admin bearer token")
        return await self.app(scope, receive, send)


async def _refuse(send, status: int, message: str) -> None:
    body = json.dumps({"error": {"message": message, "code": status}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
