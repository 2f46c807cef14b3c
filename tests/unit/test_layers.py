"""The import contracts of pyproject.toml ([tool.importlinter]) hold, and a planted violation breaks them.

import-linter reads the package from the file system, and services/ and trainer/ are mapped into the `agentflow`
namespace only by the installer, so the check runs on a copy assembled the way the wheel lays the package out.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


@pytest.fixture
def package(tmp_path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "agentflow", tmp_path / "agentflow", ignore=ignore)
    for folder in ("services", "trainer"):
        shutil.copytree(REPO / folder, tmp_path / "agentflow" / folder, ignore=ignore)
    return tmp_path


def lint(root: Path) -> subprocess.CompletedProcess:
    # from the copy's folder: import-linter puts the working directory first on sys.path
    return subprocess.run([str(LINT), "--no-cache", "--no-logo", "--config", str(REPO / "pyproject.toml")], cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=120)


def test_the_layers_hold(package):
    result = lint(package)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


@pytest.mark.parametrize("lower, upper", [
    ("domain/memory.py", "agentflow.services.memory"),  # the domain reaching into a deployable
    ("llm/follow.py", "agentflow.trainer.batch"),  # the llm <-> trainer cycle that was
    ("modules/planner.py", "agentflow.flow.stages"),  # the flow <-> modules cycle that was
    ("storage.py", "agentflow.llm.models"),  # the llm <-> storage cycle that was
    ("versions.py", "agentflow.storage"),  # independent siblings
])
def test_a_planted_violation_is_caught(package, lower, upper):
    with open(package / "agentflow" / lower, "a") as f:
        f.write(f"\n\ndef _planted():\n    import {upper}  # noqa\n")
    result = lint(package)
    assert result.returncode != 0
    assert f"agentflow.{lower[:-3].replace('/', '.')} -> {upper}" in result.stdout, result.stdout
