"""The whole eval pipeline with a real (tiny, random) model: 3 items of every benchmark file through `agentflow eval`,
its JSONL, summary, Markdown and HTML, and the HTML page rendered by a headless Chromium.

The benchmark files live outside the repository (../shared/benchmarks, or $AGENTFLOW_BENCHMARKS); without them the
tests skip. Chromium is the Debian `chromium` package (scripts/install.sh); without it the browser check skips
locally and fails under CI.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agentflow.eval.report import fmt, lookup
from agentflow.domain import trajectory
from tests.benchmarks import benchmark_files

KINDS = {"bamboogle": "search", "2wiki": "search", "hotpotqa": "search", "aime24": "math", "gameof24": "gameof24",
         "medqa": "mcq"}
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def eval_command() -> list[str]:
    """The eval command as a process: `agentflow eval` once agentflow.cli registers it, else the standalone entry."""
    from agentflow import cli

    commands = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction))
    module = "agentflow.cli" if "eval" in commands.choices else "agentflow.eval.cli"
    return [sys.executable, "-m", module, "eval"]


@pytest.fixture(scope="module")
def benchmarks() -> Path:
    return benchmark_files(*(f"{name}.json" for name in KINDS))


@pytest.fixture(scope="module")
def runs(benchmarks, tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    """One eval run of 3 items per benchmark file with the tiny model: the first as a user runs it (its own
    process), the others through the same command in-process (one torch import keeps the test fast)."""
    from agentflow.eval import cli as eval_cli

    out = tmp_path_factory.mktemp("eval")
    folders = {}
    for n, (name, kind) in enumerate(KINDS.items()):
        folder = out / name
        args = ["--data", str(benchmarks / f"{name}.json"), "--kind", kind, "--limit", "3", "--concurrency", "3",
                "--max-steps", "2", "--max-time", "40", "--model", str(tiny_model_dir), "--out", str(folder),
                "--no-progress"]
        if n == 0:
            proc = subprocess.run([*eval_command(), *args], capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert "accuracy" in proc.stdout and str(folder / "report.html") in proc.stdout
        else:
            assert eval_cli.main(["eval", *args]) == 0
        folders[name] = folder
    return folders


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_benchmark_produces_every_output(runs, name):
    folder = runs[name]
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    assert sorted(r["index"] for r in rows) == [0, 1, 2]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["items"]["finished"] == 3 and summary["run"]["kind"] == KINDS[name]
    assert set(summary["scores"]) == {r["pid"] for r in rows}
    assert summary["accuracy"] == sum(r["score"]["value"] for r in rows) / 3
    for row in rows:
        assert row["status"] in ("answered", "max_steps", "timeout"), row["error"]
        trajectory.validate(row["record"])
        assert row["record"]["rewards"] == [row["score"]] and row["score"]["source"] == "rule"
        assert 1 <= len(row["record"]["turns"]) <= 2
    tokens = sum(r["record"]["totals"]["prompt_tokens"] + r["record"]["totals"]["completion_tokens"] for r in rows)
    assert summary["tokens"]["total"] == tokens > 0
    assert summary["turns"]["total"] == sum(len(r["record"]["turns"]) for r in rows)
    assert (folder / "report.md").read_text().startswith(f"# Evaluation: {name}.json")
    assert all((folder / "plots" / f"{p}.png").stat().st_size > 1000 for p in ("outcomes", "turns", "tools", "latency"))


def test_compare_two_runs_of_the_same_items(runs, capsys):
    from agentflow.eval.compare import compare_runs

    result = compare_runs(runs["bamboogle"] / "summary.json", runs["bamboogle"] / "results.jsonl")
    assert result["paired_items"] == 3 and result["difference"] == 0.0 and result["mcnemar_p"] == 1.0


# --- the HTML report in a real browser -----------------------------------------------------------------------------
def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed; CI installs the Debian 'chromium' package", pytrace=False)
    pytest.skip("chromium is not installed (apt-get install -y chromium)")


class Rendered(HTMLParser):
    def __init__(self):
        super().__init__()
        self.metrics, self.body, self._open = [], {}, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "body":
            self.body = attrs
        if "data-metric" in attrs:
            self._open = [attrs["data-metric"], attrs["data-value"], ""]

    def handle_data(self, data):
        if self._open is not None:
            self._open[2] += data

    def handle_endtag(self, tag):
        if self._open is not None:
            self.metrics.append(tuple(self._open))
            self._open = None


@pytest.mark.parametrize("name", ["gameof24", "medqa"])
def test_report_renders_in_headless_chromium_with_the_summarys_numbers(runs, name, tmp_path):
    browser = chromium()
    page = (runs[name] / "report.html").resolve()
    summary = json.loads((runs[name] / "summary.json").read_text())

    def run_browser(*args):
        profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
        return subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
                              capture_output=True, text=True, timeout=120)

    dom = run_browser("--virtual-time-budget=5000", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    rendered = Rendered()
    rendered.feed(dom.stdout)
    assert rendered.body.get("data-plots-loaded") == "4/4"  # set by the page's script once every plot decoded
    assert len(rendered.metrics) > 20
    for path, value, text in rendered.metrics:
        expected = lookup(summary, path)
        assert json.loads(value) == expected, path
        assert text.strip() in {fmt(expected, k) for k in ("pct", "s", "int", "num")}, (path, text)
    shown = {path: json.loads(value) for path, value, _ in rendered.metrics}
    for key in ("accuracy", "correct", "items.finished", "turns.mean", "latency_s.p50", "latency_s.p95",
                "tokens.prompt", "tools.calls", "tools.error_rate", "parse_errors.planner_rate"):
        assert shown[key] == lookup(summary, key)

    shot = tmp_path / "shot.png"
    proc = run_browser("--window-size=1200,1800", f"--screenshot={shot}")
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 1800)
    colours = image.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50  # text, tables and plots, not a blank page


# --- the LLM judge on a configured endpoint ------------------------------------------------------------------------
class FakeServer(BaseHTTPRequestHandler):
    """An OpenAI-compatible server that keeps the prompts it saw: it serves the agent (a vague reply, never right by
    rule) and the judge (a CORRECT verdict to every judge prompt: it rescues them). The agent must not get the verdict
    too: an answer that is a verdict addresses the judge, and the judge's guard refuses it (docs/judge.md)."""

    prompts: list[str] = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        FakeServer.prompts.append(prompt)
        text = ('{"analysis": "close enough", "verdict": "CORRECT"}' if "<proposed_answer>" in prompt
                else "the one who wrote it")
        reply = {"model": body.get("model", ""), "choices": [{"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant", "content": text}}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_judge_endpoint_rescores_rule_failures(benchmarks, tmp_path):
    from agentflow.eval import cli as eval_cli

    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        code = eval_cli.main(["eval", "--data", str(benchmarks / "hotpotqa.json"), "--kind", "search", "--limit", "2",
                              "--max-steps", "1", "--max-time", "30", "--engine", "openai", "--endpoint", url,
                              "--model", "agent", "--judge-endpoint", url, "--judge-model", "judge",
                              "--out", str(tmp_path / "run"), "--no-progress"])
    finally:
        server.shutdown()
    assert code == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert summary["items"]["judged"] == 2 and summary["accuracy"] == 1.0
    for row in rows:
        assert row["score"]["source"] == "judge" and "rule said: search: exact=0" in row["score"]["detail"]
    judge_prompts = [p for p in FakeServer.prompts if "<accepted_answer>" in p]
    assert len(judge_prompts) == 2 and any("<accepted_answer>\nPrussian" in p for p in judge_prompts)
    assert summary["run"]["judge"] == f"llm-judge @ {url}" and summary["run"]["engine"] == "openai"
