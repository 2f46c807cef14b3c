"""The plugin loaded into a vLLM server for full-weight versions in place (agentflow/llm/vllm_plugin/agentflow_vllm.py):
its admin-token middleware and its worker extension, against stand-ins for the ASGI app and the vLLM worker. The real
server: tests/integration/test_vllm_fleet.py."""

from __future__ import annotations

import asyncio
import importlib.util
from types import SimpleNamespace

import pytest

from agentflow.llm.vllm_server import PLUGIN_DIR, WEIGHTS_ARGS, weights_env

spec = importlib.util.spec_from_file_location("agentflow_vllm", PLUGIN_DIR / "agentflow_vllm.py")
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)


def call(path: str, token: str | None, *, server_token: str, monkeypatch) -> int:
    """The status a request to ``path`` gets through the middleware (200: it reached the app)."""
    monkeypatch.setenv(plugin.TOKEN_ENV, server_token)
    sent = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message):
        sent.append(message)

    headers = [(b"authorization", f"Bearer {token}".encode())] if token is not None else []
    asyncio.run(plugin.AdminTokenMiddleware(app)({"type": "http", "path": path, "headers": headers}, None, send))
    return sent[0]["status"]


@pytest.mark.parametrize("path", ["/collective_rpc", "/pause", "/resume", "/reset_prefix_cache", "/sleep",
                                  "/update_weights", "/", "/v1"])
def test_every_admin_route_needs_the_token(path, monkeypatch):
    assert call(path, None, server_token="s3cret", monkeypatch=monkeypatch) == 401
    assert call(path, "guess", server_token="s3cret", monkeypatch=monkeypatch) == 401
    assert call(path, "s3cret", server_token="s3cret", monkeypatch=monkeypatch) == 200
    assert call(path, "", server_token="", monkeypatch=monkeypatch) == 403  # no token set: no admin routes at all


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/health", "/metrics", "/version"])
def test_the_openai_routes_health_and_metrics_stay_open(path, monkeypatch):
    assert call(path, None, server_token="s3cret", monkeypatch=monkeypatch) == 200  # vLLM's --api-key guards /v1


class Worker(plugin.WeightsFromFolder):
    """A vLLM worker's surface: reload_weights, the model runner, the model config."""

    def __init__(self):
        self.reloaded, self.repacked = [], []
        head = SimpleNamespace(quant_method=SimpleNamespace(process_weights_after_loading=self.repacked.append))
        self.model_runner = SimpleNamespace(get_model=lambda: SimpleNamespace(lm_head=head))
        self.model_config = SimpleNamespace(served_model_name=["planner-fleet"], model="/models/base")

    def reload_weights(self, weights_path):
        self.reloaded.append(weights_path)


def test_the_worker_loads_a_model_folder_and_repacks_a_tied_head(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    worker = Worker()
    assert worker.loaded_version() == {"version": "", "model": "planner-fleet"}
    assert worker.load_weights_from(str(tmp_path), "v000007") == "v000007"
    assert worker.reloaded == [str(tmp_path)] and len(worker.repacked) == 1
    assert worker.loaded_version() == {"version": "v000007", "model": "planner-fleet"}


@pytest.mark.parametrize("what", ["relative", "no config", "no safetensors"])
def test_the_worker_refuses_a_folder_before_touching_its_weights(tmp_path, what):
    (tmp_path / "config.json").write_text("{}") if what != "no config" else None
    (tmp_path / "model.safetensors").write_bytes(b"") if what != "no safetensors" else None
    worker = Worker()
    with pytest.raises(ValueError, match="safetensors model folder"):
        worker.load_weights_from("models/v1" if what == "relative" else str(tmp_path), "v000001")
    assert worker.reloaded == [] and worker.loaded_version()["version"] == ""
    assert worker.is_model_folder("models/v1" if what == "relative" else str(tmp_path)) == {"model_folder": False}


def test_the_version_it_started_from_counts_as_loaded_and_a_mirrored_folder_is_found(tmp_path, monkeypatch):
    worker = Worker()
    monkeypatch.setenv(plugin.START_VERSION_ENV, "v000000")  # the chart starts it from the base's folder
    assert worker.loaded_version()["version"] == "v000000"
    assert worker.is_model_folder(str(tmp_path / "v000003")) == {"model_folder": False}  # not mirrored yet
    (tmp_path / "v000003").mkdir()
    (tmp_path / "v000003" / "config.json").write_text("{}")
    (tmp_path / "v000003" / "model.safetensors").write_bytes(b"")
    assert worker.is_model_folder(str(tmp_path / "v000003")) == {"model_folder": True}
    worker.load_weights_from(str(tmp_path / "v000003"), "v000003")
    assert worker.loaded_version()["version"] == "v000003"


def test_start_vllm_loads_the_plugin_only_with_a_token():
    assert "agentflow_vllm.WeightsFromFolder" in WEIGHTS_ARGS and "agentflow_vllm.AdminTokenMiddleware" in WEIGHTS_ARGS
    env = weights_env("t0k")
    assert env["PYTHONPATH"] == str(PLUGIN_DIR) and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env[plugin.TOKEN_ENV] == "t0k"
