"""A newcomer's first hour, as a script: every ``agentflow`` command the README shows runs, as a real process,
somewhere in the tests, and ``WHERE_IT_RUNS`` says where. A README command that no test runs, or a test named here
that is gone, fails. (``scripts/install.sh`` and ``pytest`` are what CI itself runs; the bad inputs a newcomer types
are the table in test_newcomer_inputs.py.)

The commands that are quick on small inputs run here, in the README's order, in a scratch folder: the tools and the
set-up, a tiny model, one query and its saved record, an API key, a dense index served and searched, two evals over
it and their comparison. The README's own query on SmolLM2 and the minutes-long commands (the demo, the ring, the
trainer) run in the tests named below."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from agentflow.children import spawn_tied, stop_group

ROOT = Path(__file__).resolve().parents[2]
HERE = "tests/e2e/test_readme.py::test_a_newcomers_first_hour"
DEMO = "tests/e2e/test_demo.py::test_demo_promotes_a_trained_version_and_rolls_back_a_bad_one"
UNLABELED_DEMO = "tests/e2e/test_demo.py::test_unlabeled_traffic_trains_the_planner_and_promotes_on_feedback"
WHERE_IT_RUNS = {  # the README command (its subcommand) -> the tests that run it as a process
    "demo": [DEMO, UNLABELED_DEMO],
    "run": [HERE, "tests/e2e/test_cli.py::test_default_smollm2_run_respects_max_time"],
    "trace show": [HERE],
    "up": ["tests/integration/test_service_lifecycle.py::test_up_starts_everything_and_ctrl_c_stops_it"],
    "ask": ["tests/integration/test_service_lifecycle.py::test_up_starts_everything_and_ctrl_c_stops_it",
            "tests/integration/test_ring.py::test_ask_cli_prints_the_record_and_streams_steps"],
    "serve NAME": ["tests/integration/test_service_lifecycle.py::test_sigterm_drains_and_exits_cleanly"],
    "feedback": ["tests/integration/test_production_traffic.py::"
                 "test_feedback_cli_rates_an_answer_and_names_what_went_wrong"],
    "serve judge": ["tests/integration/test_judge_service.py::"
                    "test_serve_judge_publishes_only_the_verdicts_of_a_judge_that_passed_calibration"],
    "drive": [DEMO, UNLABELED_DEMO],  # the demo starts `drive` (`--from-traffic true` when unlabeled)
    "eval": [HERE],
    "eval compare": [HERE],
    "index build": [HERE],
    "serve retriever": [HERE],
    "train": ["tests/integration/test_trainer_service.py::test_trainer_steps_announces_and_resumes_after_kill", DEMO],
    "torchrun train": ["tests/integration/test_trainer_service.py::"
                       "test_torchrun_ranks_train_together_and_restart_after_a_rank_is_killed"],
    "keys new": [HERE],
    "serve-llm": ["tests/integration/test_trainer_service.py::test_follow_versions_serves_the_newest", DEMO],
    "rollout": ["tests/integration/test_feedback_canary.py::"
                "test_a_canary_users_rate_worse_is_rolled_back_on_their_ratings", DEMO],
    "tools": [HERE],
    "env": [HERE],
    "model tiny": [HERE],
    "model smollm2": [HERE],
    "status": ["tests/integration/test_chart_run.py::test_the_rendered_profile_turns_the_loop"],
}
NESTED = {"model", "eval", "index", "keys", "trace", "serve"}  # commands whose second word names a subcommand


def command_key(line: str) -> str | None:
    """The subcommand an ``agentflow …`` command line runs (``eval compare``, ``serve NAME``), or None."""
    found = re.search(r"(?:^|[\s/`])agentflow\s+(.*)", line)
    if not found:
        return None
    words = found.group(1).split("#")[0].split()
    if not words or not re.fullmatch(r"[a-z][\w-]*", words[0]):  # not an option, nor "agentflow run: error"
        return None
    key = words[0]
    if key in NESTED and len(words) > 1 and re.fullmatch(r"[a-zA-Z][\w-]*", words[1]):
        key = f"{key} {words[1]}"
    return f"torchrun {key}" if line.lstrip().startswith("torchrun") else key


def readme_commands(text: str) -> set[str]:
    """Every ``agentflow`` command in the README's shell blocks and inline code."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    lines = [line for block in blocks for line in block.splitlines()]
    lines += re.findall(r"`(agentflow [^`]+)`", text)
    return {key for key in map(command_key, lines) if key}


def test_readme_commands_are_read_as_a_newcomer_types_them():
    assert command_key(".venv/bin/agentflow eval compare a b   # note") == "eval compare"
    assert command_key("torchrun --standalone --no-python agentflow train ... --lora-rank 64") == "torchrun train"
    assert command_key("agentflow serve NAME --bootstrap HOST:PORT") == "serve NAME"
    assert command_key(".venv/bin/agentflow eval --data x.json") == "eval"
    assert command_key("bash scripts/install.sh") is None
    assert command_key("agentflow run: error: argument --max-steps") is None


def defined_names(path: Path) -> set[str]:
    return {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)}


def test_every_readme_command_runs_in_a_named_test():
    commands = readme_commands((ROOT / "README.md").read_text())
    assert commands - WHERE_IT_RUNS.keys() == set(), "README commands that no test runs"
    assert WHERE_IT_RUNS.keys() - commands == set(), "commands the README no longer shows"
    for command, targets in WHERE_IT_RUNS.items():
        for target in targets:
            path, name = target.split("::")
            source = (ROOT / path).read_text()
            assert name in defined_names(ROOT / path), f"{command}: {target} is gone"
            word = "serve" if command == "serve NAME" else command.split()[-1]
            started_by_demo = target in (DEMO, UNLABELED_DEMO)  # the demo starts train, drive, rollout, serve-llm
            assert f'"{word}"' in source or started_by_demo, f"{target} does not run {command}"


# the scratch data: three passages and two questions the passages answer
PASSAGES = [{"title": "Ostrand", "text": "Ostrand is a river port founded in 1702 by fishermen."},
            {"title": "Kelmere", "text": "Kelmere is a lake town known for its glass."},
            {"title": "Brindle", "text": "Brindle is a hill village where the wool market meets."}]
QUESTIONS = [{"query": "When was Ostrand founded?", "answer": "1702"},
             {"query": "What is Kelmere known for?", "answer": "glass"}]


@pytest.fixture
def scratch(tmp_path, monkeypatch) -> Path:
    """A newcomer's working folder, with no AGENTFLOW_* settings of this machine around."""
    for name in [n for n in os.environ if n.startswith("AGENTFLOW_")]:
        monkeypatch.delenv(name)
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    (tmp_path / "questions.json").write_text(json.dumps(QUESTIONS))
    return tmp_path


def agentflow(scratch: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """One README command, as typed, from the scratch folder; it must succeed without a traceback."""
    proc = subprocess.run([sys.executable, "-m", "agentflow.cli", *args], cwd=scratch, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr[-3000:])
    return proc


def search(url: str, query: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}?{urllib.parse.urlencode({'q': query, 'limit': 1})}", timeout=60) as reply:
        return json.loads(reply.read())["results"]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # about 40 s on 2 idle cores
def test_a_newcomers_first_hour(scratch):
    assert "python" in agentflow(scratch, "tools").stdout
    assert "version" in agentflow(scratch, "env").stdout
    agentflow(scratch, "model", "tiny", "--out", "tiny")
    assert Path(agentflow(scratch, "model", "smollm2").stdout.strip(), "config.json").is_file()

    # one query (the tiny model: the README's SmolLM2 run is test_cli's), kept and shown again by its id
    run = agentflow(scratch, "run", "What is 2468 * 1357?", "--model", "tiny", "--max-steps", "1")
    record_id = re.search(r"agentflow trace show (\w+)", " ".join((run.stdout + run.stderr).split())).group(1)
    record = json.loads((scratch / ".agentflow/runs" / f"{record_id}.json").read_text())
    assert record["query"] == "What is 2468 * 1357?"
    assert "What is 2468 * 1357?" in agentflow(scratch, "trace", "show", record_id).stdout

    key = json.loads(agentflow(scratch, "keys", "new", "driver", "--scopes", "solve,train").stdout)
    from agentflow.services.gateway.keys import KeyRing

    assert KeyRing([key["entry"]]).caller(key["key"]).scopes == {"solve", "train"}

    built = json.loads(agentflow(scratch, "index", "build", "--corpus", "corpus.jsonl", "--out", "index").stdout)
    assert built["count"] == len(PASSAGES)
    retriever = spawn_tied([sys.executable, "-m", "agentflow.cli", "serve", "retriever", "--index", "index",
                            "--port", "0"], cwd=scratch, stdout=subprocess.PIPE, text=True)
    try:
        url = re.search(r"http://\S+/search", retriever.stdout.readline()).group(0)
        assert search(url, "the glass town")[0]["title"] == "Kelmere"
        runs = []
        for out in ("A", "B"):
            agentflow(scratch, "eval", "--data", "questions.json", "--kind", "search", "--limit", "2", "--tools",
                      "search", "--retriever", url, "--model", "tiny", "--max-steps", "1", "--out", out)
            settings = json.loads((scratch / out / "run.json").read_text())["settings"]
            assert settings["retriever"] == url and settings["tools"] == "search"
            runs.append(json.loads((scratch / out / "summary.json").read_text())["items"])
    finally:
        stop_group(retriever)
    assert all(items["finished"] == len(QUESTIONS) and items["errors"] == 0 for items in runs), runs
    compared = agentflow(scratch, "eval", "compare", "A/summary.json", "B/summary.json")
    assert "McNemar" in compared.stdout and "2 items" in compared.stdout
