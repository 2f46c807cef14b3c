"""A newcomer's mistakes on the command line: each is refused with exit status 2 and one line on stderr that names
the flag as it was typed, before anything is loaded or started, and never with a traceback.

Each command line runs in-process through ``agentflow.cli.main`` (fast); a few also run as real processes, to show
the exit status and the single line end to end."""

import contextlib
import io
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentflow import cli

AGENTFLOW = Path(sys.executable).with_name("agentflow")
FAST_S = 5.0  # a refusal comes before any model, broker or server: it takes no longer than importing the parser

# (command line, what the one line must name); FILE is a text file, NOTJSONL a file that is not JSONL, CORPUS a
# JSONL corpus, DIR an empty folder
CASES = [
    ("run --temperature -1 hi", "--temperature"),
    ("run --temperature nan hi", "--temperature"),
    ("run --max-steps 0 hi", "--max-steps"),
    ("run --max-time -5 hi", "--max-time"),
    ("run --tools '' hi", "--tools"),
    ("run --tools python,teleport hi", "--tools"),
    ("run --corpus NOTJSONL hi", "--corpus"),
    ("run --file /nonexistent/q.txt", "--file"),
    ("run --endpoint localhost:8000 --engine openai hi", "--endpoint"),
    ("run hi --file FILE", "--file"),
    ("model tiny --out FILE", "--out"),
    ("model tiny --out DIR --seed -1", "--seed"),
    ("ask --timeout -1 hi", "--timeout"),
    ("ask --gateway nohost hi", "--gateway"),
    ("ask --max-time -1 hi", "--max-time"),
    ("feedback some-id --score 3", "--score"),
    ("feedback some-id --score 0.5 --up", "--up"),
    ("feedback some-id --up --gateway :50051", "--gateway"),
    ("keys new bob --scopes solve,fly", "--scopes"),
    ("serve gateway --port -2", "--port"),
    ("serve planner --concurrency 0", "--concurrency"),
    ("serve memory --bootstrap nohost", "--bootstrap"),
    ("serve executor --endpoint ftp://llm/v1", "--endpoint"),
    ("serve gateway --index DIR", "--index"),
    ("serve retriever --port 99999", "--port"),
    ("serve retriever --index /nonexistent/index", "--index"),
    ("serve retriever --tools python", "--tools"),
    ("serve-llm --port 70000", "--port"),
    ("serve-llm --model /nonexistent/model", "--model"),
    ("serve-llm --max-tokens 100", "--max-tokens"),
    ("up --llm-url notaurl", "--llm-url"),
    ("up --log-dir FILE", "--log-dir"),
    ("train --grpo-lr -1", "--grpo-lr"),
    ("train --grpo-group-size 5", "--grpo-group-size"),
    ("train --metrics-port 70000", "--metrics-port"),
    ("train --objective dpo", "--objective"),
    ("train --learning-rate nan", "--learning-rate"),
    ("drive --group-size 0", "--group-size"),
    ("drive --gateway nohost", "--gateway"),
    ("drive --dataset missing.jsonl", "--dataset"),
    ("rollout --canary-percent 100", "--canary-percent"),
    ("rollout --steps 50,10", "--steps"),
    ("rollout --alpha 0.7", "--alpha"),
    ("rollout --backend kserve", "--isvc"),
    ("eval --data FILE --kind search --concurrency 0", "--concurrency"),
    ("eval --data /nonexistent/b.json --kind search", "--data"),
    ("eval --data FILE --kind poetry", "--kind"),
    ("eval compare /nonexistent/a.json FILE", "argument a"),
    ("trace show some-id --results /nonexistent/results.jsonl", "--results"),
    ("demo --duration 10", "--duration"),
    ("demo --canary-percent 100", "--canary-percent"),
    ("demo --rating-noise 0.6", "--rating-noise"),
    ("demo --rating-noise 0.4 --hostile-raters 0.3", "--hostile-raters"),
    ("index build --corpus NOTJSONL --out DIR", "--corpus"),
    ("index build --corpus CORPUS --out FILE", "--out"),
]


@pytest.fixture(scope="module", autouse=True)
def imported():
    """The parser's modules imported once, so that each refusal below is timed (and captured) on its own."""
    cli._parser()


@pytest.fixture
def places(tmp_path, monkeypatch) -> dict[str, str]:
    """The files the command lines name, in a scratch working folder, with no AGENTFLOW_* settings around."""
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("AGENTFLOW_")]:
        monkeypatch.delenv(name)
    (tmp_path / "q.txt").write_text("What is 2+2?\n")
    (tmp_path / "notjsonl.txt").write_text("not json\n")
    (tmp_path / "corpus.jsonl").write_text('{"title": "t", "text": "x"}\n')
    (tmp_path / "dir").mkdir()
    return {"FILE": str(tmp_path / "q.txt"), "NOTJSONL": str(tmp_path / "notjsonl.txt"),
            "CORPUS": str(tmp_path / "corpus.jsonl"), "DIR": str(tmp_path / "dir")}


def argv_of(line: str, places: dict[str, str]) -> list[str]:
    return [places.get(word, word) for word in shlex.split(line)]


def children() -> set[str]:
    """The processes this one has started (every thread's children)."""
    tasks = Path(f"/proc/{os.getpid()}/task")
    return {pid for task in tasks.iterdir() for pid in (task / "children").read_text().split()}


def assert_one_line(code, out: str, err: str, flag: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert out == "" and len(lines) == 1 and lines[0].strip(), err
    assert flag in lines[0] and ": error: " in lines[0] and "Traceback" not in err, err


@pytest.mark.parametrize("line, flag", CASES)
def test_a_bad_flag_is_one_line_naming_it(line, flag, places, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"started something: {args[:1]}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr("agentflow.llm.build_engine", refuse)
    out, err = io.StringIO(), io.StringIO()  # only what main() writes (not a thread another test left behind)
    before, started = children(), time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv_of(line, places))
        except SystemExit as e:  # refused by the parser
            code = e.code
    assert_one_line(code, out.getvalue(), err.getvalue(), flag)
    assert time.monotonic() - started < FAST_S and children() <= before


@pytest.mark.parametrize("line, flag", [
    ("serve retriever --port 99999", "argument --port: must be an integer in [0, 65535]"),
    ("run --temperature -1 hi", "argument --temperature: must be a finite number >= 0 (got -1)"),
    ("model tiny --out FILE", "argument --out:"),
])
def test_as_a_real_process(line, flag, places):
    proc = subprocess.run([str(AGENTFLOW), *argv_of(line, places)], capture_output=True, text=True, timeout=60)
    assert_one_line(proc.returncode, proc.stdout, proc.stderr, flag)
    assert proc.stderr.startswith(f"agentflow {line.split()[0]}")


@pytest.mark.parametrize("command, flag", [("drive --gateway", "--gateway"),
                                           ("serve gateway --bootstrap", "--bootstrap")])
def test_nothing_to_connect_to_is_one_line_naming_the_address(command, flag, places):
    """The first connection at start-up gets one rule (agentflow.startup): a wait of 0 is a single try. A service
    has announced its gRPC port by then (its health says NOT_SERVING while it waits), and its log may say why it
    waits; the error itself is one line, last."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    proc = subprocess.run([str(AGENTFLOW), *command.split(), address], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "AGENTFLOW_CONNECT_WAIT_S": "0"})
    error = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert error.startswith("agentflow: error:") and address in error
    assert flag in error and "AGENTFLOW_CONNECT_WAIT_S" in error
