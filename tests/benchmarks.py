"""Where the benchmark test sets are. They live outside the repository: $AGENTFLOW_BENCHMARKS, else
``../shared/benchmarks`` beside this checkout or, for a clone of a local checkout (CI clones one into /tmp), beside
the checkout it was cloned from. A test that needs them skips locally without them; under CI that is a failure,
as a missing helm or vLLM is."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@functools.cache
def benchmarks_dir() -> Path:
    """The first folder of the candidates above that exists (the first candidate when none does)."""
    if os.environ.get("AGENTFLOW_BENCHMARKS"):
        return Path(os.environ["AGENTFLOW_BENCHMARKS"])
    candidates = [REPO.parent / "shared" / "benchmarks"]
    origin = subprocess.run(["git", "-C", str(REPO), "remote", "get-url", "origin"], capture_output=True,
                            text=True, timeout=30).stdout.strip()
    if origin and Path(origin).is_dir():
        candidates.append(Path(origin).resolve().parent / "shared" / "benchmarks")
    return next((c for c in candidates if c.is_dir()), candidates[0])


def benchmark_files(*names: str) -> Path:
    """The benchmark folder, once every file in ``names`` is in it."""
    folder = benchmarks_dir()
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        why = f"benchmark files not found in {folder}: {', '.join(missing)} (set AGENTFLOW_BENCHMARKS)"
        if os.environ.get("CI"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    return folder
