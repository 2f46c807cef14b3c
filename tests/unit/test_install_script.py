"""scripts/install.sh's modes: --help and a wrong option answer before anything is installed."""

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install.sh"


def install(*args: str, tmp_path) -> subprocess.CompletedProcess:
    # VIRTUAL_ENV points nowhere: had the script gone on to install, it would fail, not touch .venv
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "VIRTUAL_ENV": str(tmp_path / "no-venv")}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=30)


def test_help_lists_the_modes(tmp_path):
    done = install("--help", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    for option in ("--client", "--browser", "--no-browser", "AGENTFLOW_SKIP_VLLM"):
        assert option in done.stdout


def test_an_unknown_option_is_refused(tmp_path):
    done = install("--clinet", tmp_path=tmp_path)
    assert done.returncode == 2
    assert "unknown option --clinet" in done.stderr
    assert list(tmp_path.iterdir()) == []
