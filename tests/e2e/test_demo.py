"""`agentflow demo --inject-bad-version` end to end: every process real (broker, LLM server, six services, trainer,
driver, rollout controller). A trained version is canaried and promoted on measured reward, the injected degraded
version is rolled back automatically, and no production query fails during either switch."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1300)]


def test_demo_promotes_a_trained_version_and_rolls_back_a_bad_one(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "agentflow.cli", "demo", "--no-dashboard", "--inject-bad-version",
                           "--duration", "900", "--out", str(out)],
                          capture_output=True, text=True, timeout=1200, env={**os.environ})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    done = json.loads(proc.stdout.strip().splitlines()[-1])
    report = json.loads((out / "report.json").read_text())
    decisions = report["decisions"]
    assert done["promoted"] >= 1 and done["failed_production_queries"] == 0, done
    rollbacks = [d for d in decisions if d["version"] == "injected-bad" and d["action"] == "rollback"]
    assert rollbacks, decisions
    assert not rollbacks[0]["reason"].startswith("no decision"), rollbacks[0]  # on measured reward, not a timeout
    assert done["heldout_after"] >= 0.8 > done["heldout_before"], done
    assert report["traffic"]["answered"] > 0 and (out / "report.html").is_file()
    assert list((out / "traces").glob("traces-*.jsonl")), "no trace file written"
