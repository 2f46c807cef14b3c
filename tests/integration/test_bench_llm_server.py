"""bench/llm_server.py end to end at toy size: a real `agentflow serve-llm` subprocess on the tiny random model,
no vLLM, one repeat, a few tokens. Checks the summary's shape, not its numbers (a random model and a busy CI box
say nothing about throughput)."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_prints_a_summary_with_the_speedups(tiny_model_dir):
    cmd = [sys.executable, str(REPO / "bench" / "llm_server.py"), "--model", str(tiny_model_dir), "--no-vllm",
           "--repeats", "1", "--max-tokens", "4", "--concurrency", "1,8,32"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("speedup_1", "speedup_8", "speedup_32", "serve_llm_tokens_per_s_1", "serve_llm_tokens_per_s_8",
                "serve_llm_tokens_per_s_32", "generate_tokens_per_s", "tokens_per_s", "generated_tokens"):
        assert key in summary, key
    assert summary["vllm_skipped"] == "--no-vllm" and "vs_vllm_8" not in summary
    assert all(summary[f"speedup_{c}"] > 0 for c in (1, 8, 32))
    assert summary["requests"] == {"1": 8, "8": 32, "32": 128} and summary["baseline_requests"] == 16
    # a 4-token budget: every request is counted, none beyond its budget
    tokens = summary["generated_tokens"]
    assert 0 < tokens["generate_sequential"] <= 16 * 4
    assert 0 < tokens["serve_llm_1"] <= 8 * 4 and 0 < tokens["serve_llm_8"] <= 32 * 4
    assert 0 < tokens["serve_llm_32"] <= 128 * 4
    progress = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert {p.get("system") for p in progress} >= {"generate_sequential", "serve_llm"}


def test_a_bench_killed_mid_run_leaves_no_server_behind(tiny_model_dir):
    """What a timeout does to a bench: SIGKILLed while its serve-llm serves, the bench takes the server with it
    (agentflow.children; SIGTERM and grandchildren: tests/unit/test_children.py). Untied, the server outlives it."""
    sys.path.insert(0, str(REPO / "bench"))
    from _proc import descendants

    cmd = [sys.executable, str(REPO / "bench" / "llm_server.py"), "--model", str(tiny_model_dir), "--no-vllm",
           "--repeats", "50", "--max-tokens", "4", "--concurrency", "8"]
    bench = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
    left: list[int] = []
    try:
        for line in bench.stderr:  # progress lines; "ready" once the server has answered
            if line.startswith("{") and json.loads(line).get("event") == "ready":
                break
        servers = [pid for pid, _ in descendants(bench.pid) if "serve-llm" in _cmdline(pid)]
        assert servers, f"no serve-llm under the running bench (exit code {bench.poll()})"
        bench.kill()
        bench.wait(30)
        deadline = time.monotonic() + 30
        while (left := [pid for pid in servers if _cmdline(pid)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert left == [], f"serve-llm {left} outlived the bench"
    finally:
        for pid in [bench.pid, *left]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> str:
    """The command line of a live process, "" once it has ended (zombies included)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
