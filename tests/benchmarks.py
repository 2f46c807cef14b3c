"""Where the benchmark test sets are (they live outside the repository: ../shared/benchmarks, or
$AGENTFLOW_BENCHMARKS). A test that needs them skips locally without them; under CI that is a failure, as a
missing helm or vLLM is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

BENCHMARKS = Path(os.environ.get("AGENTFLOW_BENCHMARKS", Path(__file__).resolve().parents[2] / "shared" / "benchmarks"))


def benchmark_files(*names: str) -> Path:
    """The benchmark folder, once every file in ``names`` is in it."""
    missing = [name for name in names if not (BENCHMARKS / name).is_file()]
    if missing:
        why = f"benchmark files not found in {BENCHMARKS}: {', '.join(missing)} (set AGENTFLOW_BENCHMARKS)"
        if os.environ.get("CI"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    return BENCHMARKS
