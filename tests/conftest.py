"""Shared fixtures: model folders built or converted once per test session."""

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from agentflow.llm.models import build_tiny

    return build_tiny(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="session")
def smollm2_model_dir():
    from agentflow.llm.models import smollm2_dir

    return smollm2_dir()
