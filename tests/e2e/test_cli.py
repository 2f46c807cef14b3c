"""`agentflow` as a user runs it: a real process, real engines, real tools."""

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agentflow.domain import trajectory

AGENTFLOW = [sys.executable, "-m", "agentflow.cli"]


def run(*args, timeout=300, env=None, **kw):
    return subprocess.run([*AGENTFLOW, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, **kw)


def assert_usage_error(proc, fragment: str):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentflow") and ": error: " in lines[0], proc.stderr
    assert fragment in lines[0] and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("args,fragment", [
    (["run", ""], "query is empty"),
    (["run", "   "], "query is empty"),
    (["run"], "no question given"),
    (["run", "hi", "--tools", "python,teleport"], "argument --tools: unknown: teleport"),
    (["run", "hi", "--max-steps", "0"], "argument --max-steps: must be an integer >= 1 (got 0)"),
    (["run", "hi", "--engine", "openai"], "needs an endpoint"),
    (["run", "--file", "/nonexistent/q.txt"], "argument --file: no such file: /nonexistent/q.txt"),
    (["run", "hi", "--file", "/nonexistent/q.txt"], "argument --file: no such file"),
    (["run", "hi", "--file", __file__], "not both"),
])
def test_user_mistakes_are_one_line_errors(args, fragment):
    assert_usage_error(run(*args, timeout=60), fragment)


def test_oversized_and_undecodable_files(tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("x" * (64 * 1024 + 1))
    assert_usage_error(run("run", "--file", str(big), timeout=60), "65537 bytes; the limit is 65536")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"what is \xff\xfe?")
    assert_usage_error(run("run", "--file", str(bad), timeout=60), "not UTF-8 text (byte 0xff at offset 8)")


def test_refused_endpoint_is_a_one_line_error():
    proc = run("run", "hi", "--engine", "openai", "--endpoint", "http://127.0.0.1:9/v1", timeout=60,
               env={"AGENTFLOW_RETRIES": "0"})
    assert_usage_error(proc, "cannot reach the server")


def test_endpoint_that_times_out_is_a_one_line_error():
    class Silent(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            time.sleep(5)

        do_POST = do_GET

    class Server(ThreadingHTTPServer):
        def handle_error(self, request, client_address):  # the client hanging up is the point of the test
            pass

    httpd = Server(("127.0.0.1", 0), Silent)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        started = time.monotonic()
        proc = run("run", "hi", "--engine", "openai", "--endpoint", url, "--model", "m", timeout=60,
                   env={"AGENTFLOW_TIMEOUT_S": "1", "AGENTFLOW_RETRIES": "0"})
        assert_usage_error(proc, "did not answer within")
        assert time.monotonic() - started < 30
    finally:
        httpd.shutdown()


def test_tiny_model_run_prints_steps_and_a_valid_record(tiny_model_dir):
    proc = run("run", "What is 2468 * 1357?", "--model", str(tiny_model_dir), "--max-steps", "2",
               "--max-time", "60", "--json")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    trajectory.validate(record)
    assert 1 <= len(record["turns"]) <= 2
    assert "step 1" in proc.stderr and "answer" in proc.stderr  # the readable trace went to stderr


@pytest.mark.timeout(1800)  # 10 processes: about 40 s on 2 idle cores, several times that on a loaded machine
def test_short_deadlines_exit_3_on_timeout_and_never_abort(tiny_model_dir):
    """10 runs whose deadline ends mid-generation, 0.05 s to 1.4 s: each exits 0 (answered) or 3 (timed out, record
    printed), never 134 (an engine thread inside torch while the interpreter finalizes), and none hangs (a process
    that does not end within its generous budget fails the test)."""
    from concurrent.futures import ThreadPoolExecutor

    deadlines = [0.05 + 0.15 * i for i in range(10)]

    def one(max_time):
        proc = run("run", "What is 2468 * 1357?", "--model", str(tiny_model_dir), "--max-steps", "2",
                   "--max-time", str(max_time), "--json", timeout=600)
        return max_time, proc

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, deadlines))
    codes = {}
    for max_time, proc in results:
        codes[proc.returncode] = codes.get(proc.returncode, 0) + 1
        assert proc.returncode in (0, 3), f"--max-time {max_time}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
        record = json.loads(proc.stdout)
        assert (record["status"] == "timeout") == (proc.returncode == 3), (max_time, record["status"])
    assert codes.get(3, 0) > 0, codes  # the short deadlines did cut runs off


@pytest.mark.slow
def test_default_smollm2_run_respects_max_time(smollm2_model_dir):
    """The acceptance run: default embedded SmolLM2, every step shown, --json valid, limits respected."""
    max_time = 45  # a step takes 10-20 s idle: the run answers or is cut off mid-step
    started = time.monotonic()
    proc = run("run", "What is 2468 * 1357?", "--max-time", str(max_time), "--json", timeout=600)
    elapsed = time.monotonic() - started
    record = json.loads(proc.stdout)
    assert proc.returncode == (3 if record["status"] == "timeout" else 0), proc.stderr[-3000:]
    trajectory.validate(record)
    assert record["totals"]["latency_s"] <= max_time + 1  # the loop's own clock (model loading excluded)
    assert elapsed < max_time + 120  # plus process start and model load
    assert len(record["turns"]) <= 5 and record["status"] in ("answered", "max_steps", "timeout")
    for turn in record["turns"]:
        assert f"step {turn['step'] + 1}" in proc.stderr
        if turn["planner"]:
            assert turn["planner"]["token_ids"] and len(turn["planner"]["token_ids"]) == len(turn["planner"]["logprobs"])
    Path(os.environ.get("AGENTFLOW_ARTIFACTS", "/tmp")).joinpath("smollm2_run.json").write_text(proc.stdout)
