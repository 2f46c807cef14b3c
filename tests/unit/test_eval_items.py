"""The per-item view of an eval run: table rows and trajectories from results.jsonl, the report's item table, the
plain progress lines off a terminal, and `agentflow trace show`."""

import io
import json
from html.parser import HTMLParser

import pytest

from agentflow import cli
from agentflow.errors import InvalidInput
from agentflow.eval import items_report
from agentflow.eval.data import load_items
from agentflow.eval.items import STEP_TEXT_LIMIT, TABLE_TEXT_LIMIT, clip, item_rows, read_results, trajectory_steps
from agentflow.eval.progress import BarProgress, LineProgress, Progress, make_progress
from agentflow.eval.report import render_html, write_reports
from agentflow.eval.runner import run_items
from agentflow.eval.trace_cli import RUNS_DIR, save_run
from tests.unit.test_eval import SEARCH, scripted_agent, write_json

LONG_OUTPUT = "x" * 5000
HOSTILE = "<script>alert('owned')</script> & friends?"


def turn(step, tool, command="", result="", tool_error="", verdict="CONTINUE", parse_error=""):
    return {"step": step, "decision": {"sub_goal": f"goal {step}", "tool": tool, "context": "ctx"},
            "parse_error": parse_error, "command": command, "result": result, "tool_error": tool_error,
            "verdict": verdict, "verifier_analysis": f"analysis {step}",
            "timings": {"plan_s": 0.1, "execute_s": 0.2, "verify_s": 0.1, "total_s": 0.4}}


def record(tid, query, turns, answer, status) -> dict:
    return {"trajectory_id": tid, "query": query, "analysis": "think", "answer": answer, "status": status,
            "error": "", "turns": turns,
            "totals": {"turns": len(turns), "prompt_tokens": 3, "completion_tokens": 2, "latency_s": 1.5}}


def synthetic_rows() -> list[dict]:
    """Three result rows in completion order (2, 0, 1): a hostile question, a long tool output, a crash without
    record."""
    return [
        {"index": 2, "pid": "p2", "query": HOSTILE, "answer": "yes", "prediction": "yes", "correct": True,
         "status": "answered", "error": "", "latency_s": 0.25, "score": {"value": 1.0, "source": "rule"},
         "record": record("run-p2", HOSTILE, [turn(0, "search", "q", "found", verdict="STOP")], "yes", "answered")},
        {"index": 0, "pid": "p0", "query": "What is 2+2?", "answer": ["4", "four"], "prediction": "5",
         "correct": False, "status": "max_steps", "error": "", "latency_s": 3.5,
         "score": {"value": 0.0, "source": "rule", "detail": "search: exact=0"},
         "record": record("run-p0", "What is 2+2?", [turn(0, "python", "print(2+2)", LONG_OUTPUT),
                                     turn(1, "", parse_error="no tool named 'teleport'"),
                                     turn(2, "search", tool_error="timeout: ran past 3 s"),
                                     turn(3, "python", "print(5)", "5", verdict="")], "5", "max_steps")},
        {"index": 1, "pid": "p1", "query": "Q" * 400, "answer": "x", "prediction": "", "correct": False,
         "status": "error", "error": "internal: RuntimeError: bug", "latency_s": 0.01, "score": {"value": 0.0},
         "record": None},
    ]


@pytest.fixture
def results_file(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows()), encoding="utf-8")
    return path


# --- table rows and trajectories -----------------------------------------------------------------------------------
def test_item_rows_of_a_results_file(results_file):
    rows = item_rows(read_results(results_file))
    assert [r["index"] for r in rows] == [0, 1, 2]
    assert rows[0] == {"index": 0, "pid": "p0", "trajectory_id": "run-p0", "question": "What is 2+2?",
                       "gold": "4 | four", "prediction": "5", "correct": False, "status": "max_steps", "turns": 4,
                       "tools": ["python", "search"], "error": "", "latency_s": 3.5}
    crashed = rows[1]
    assert crashed["turns"] == 0 and crashed["tools"] == [] and crashed["trajectory_id"] == ""
    assert crashed["question"] == "Q" * TABLE_TEXT_LIMIT + " … [100 more characters]"
    assert crashed["error"] == "internal: RuntimeError: bug" and crashed["status"] == "error"
    assert rows[2]["question"] == HOSTILE and rows[2]["correct"] is True


def test_trajectory_steps_clip_long_outputs(results_file):
    steps = trajectory_steps(read_results(results_file)[1]["record"])
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert steps[0]["result"] == "x" * STEP_TEXT_LIMIT + f" … [{5000 - STEP_TEXT_LIMIT:,} more characters]"
    assert steps[1]["parse_error"] == "no tool named 'teleport'"
    assert steps[2]["tool_error"] == "timeout: ran past 3 s" and steps[3]["verdict"] == ""
    assert steps[0]["sub_goal"] == "goal 0" and steps[0]["command"] == "print(2+2)" and steps[0]["seconds"] == 0.4
    assert trajectory_steps(None) == []
    assert clip(None, 3) == "" and clip("abcd", 4) == "abcd"


def test_read_results_skips_a_torn_last_line_and_refuses_garbage(tmp_path, results_file):
    torn = tmp_path / "torn.jsonl"
    torn.write_text(results_file.read_text() + '{"index": 3, "pid"')
    assert len(read_results(torn)) == 3
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n" + results_file.read_text())
    with pytest.raises(InvalidInput, match="line 1 is not JSON"):
        read_results(bad)
    with pytest.raises(InvalidInput, match="does not exist"):
        read_results(tmp_path / "missing.jsonl")


# --- the HTML item table -------------------------------------------------------------------------------------------
class ItemTable(HTMLParser):
    """Rows of #items (their data-* attributes and cell texts), trajectory articles and script bodies."""

    def __init__(self):
        super().__init__()
        self.rows, self.articles, self.scripts, self.steps = [], [], [], 0
        self._cell = self._script = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and attrs.get("class") == "item":
            self.rows.append({"attrs": attrs, "cells": {}})
        elif tag == "td" and "data-col" in attrs and self.rows:
            self._cell = attrs["data-col"]
            self.rows[-1]["cells"][self._cell] = ""
        elif tag == "article":
            self.articles.append(attrs["id"])
        elif tag == "li" and attrs.get("class") == "step":
            self.steps += 1
        elif tag == "script":
            self._script = ""

    def handle_endtag(self, tag):
        if tag == "td":
            self._cell = None
        elif tag == "script":
            self.scripts.append(self._script)
            self._script = None

    def handle_data(self, data):
        if self._cell:
            self.rows[-1]["cells"][self._cell] += data
        if self._script is not None:
            self._script += data


def parse(page: str) -> ItemTable:
    table = ItemTable()
    table.feed(page)
    return table


def test_the_table_holds_every_row_escaped(results_file):
    rows = read_results(results_file)
    page = items_report.render_items(rows)
    table = parse(page)
    assert [r["attrs"]["data-pid"] for r in table.rows] == ["p0", "p1", "p2"]
    assert [r["attrs"]["data-correct"] for r in table.rows] == ["false", "false", "true"]
    assert [r["attrs"]["data-status"] for r in table.rows] == ["max_steps", "error", "answered"]
    assert [r["cells"]["correct"] for r in table.rows] == ["no", "no", "yes"]
    assert table.rows[0]["cells"]["tools"] == "python, search" and table.rows[0]["cells"]["latency_s"] == "3.50"
    assert table.rows[2]["cells"]["question"] == HOSTILE  # the text, once unescaped by the parser
    assert "<script>alert" not in page and "&lt;script&gt;alert(&#x27;owned&#x27;)&lt;/script&gt; &amp;" in page
    assert table.scripts == []  # the section itself holds no script; the report adds the page's one
    assert table.articles == ["traj-0", "traj-1", "traj-2"] and table.steps == 5
    assert "[3,000 more characters]" in page and LONG_OUTPUT not in page
    assert f"{TABLE_TEXT_LIMIT:,} characters in the table and {STEP_TEXT_LIMIT:,} in a trajectory" in page


def test_embedded_trajectories_are_capped(results_file, monkeypatch):
    monkeypatch.setattr(items_report, "TRAJECTORY_ITEMS_LIMIT", 2)
    page = items_report.render_items(read_results(results_file))
    table = parse(page)
    assert len(table.rows) == 3 and table.articles == ["traj-0", "traj-1"]
    assert "Only the first 2 of 3 trajectories are embedded." in page
    assert page.count('class="view"') == 2


def test_the_report_reads_results_jsonl_beside_it(tmp_path):
    items, _ = load_items(write_json(tmp_path / "d.json", SEARCH), "search")
    outcome = run_items(scripted_agent(), items, "search", tmp_path / "run", run={"run_id": "u"}, progress=False)
    page = write_reports(outcome.summary, outcome.out_dir)["html"].read_text()
    table = parse(page)
    rows = {r["pid"]: r for r in read_results(outcome.out_dir / "results.jsonl")}
    assert len(table.rows) == len(rows) == 4
    for shown in table.rows:
        row = rows[shown["attrs"]["data-pid"]]
        assert shown["attrs"]["data-correct"] == str(row["correct"]).lower()
        assert shown["attrs"]["data-status"] == row["status"]
    assert len(table.scripts) == 1 and "item-filter" in table.scripts[0]
    assert 'id="items"' not in render_html(outcome.summary, {})  # no rows, no table


# --- progress off a terminal ---------------------------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_plain_lines_every_n_items_or_s_seconds():
    out, clock = io.StringIO(), Clock()
    with LineProgress(10, "math", out, every=3, interval_s=30, workers=2, clock=clock) as progress:
        progress.start(0)
        progress.start(1)
        for n in range(4):  # items 0-3 finish 5 s apart, taking 5, 10, 10 and 10 s; the next starts at once
            clock.now += 5
            progress.advance({"index": n, "correct": n % 2 == 0, "status": "error" if n == 1 else "answered"})
            progress.start(n + 2)
        # at the third: mean 25/3 s, item 3 has run 5 s; (6 queued x 8.33 + 3.33 left) / 2 workers = 26.7 s
        assert out.getvalue().splitlines() == [
            "eval math: 3/10 done (30%) · 1 running · accuracy 0.667 · 1 error · elapsed 15s · ETA 27s"]
        clock.now += 24  # 29 s since the last line
        progress.tick()
        assert len(out.getvalue().splitlines()) == 1
        clock.now += 1  # 30 s since the last line, with no item finished since
        progress.tick()
        # items 4 and 5 have run 30 and 25 s, past the 8.75 s mean: as lower bounds they raise it to (35 + 55) / 6 =
        # 15 s; 4 queued x 15 s / 2 workers = 30 s, reached from 0 (27 s counted down) up to e^-4: 29 s
        assert out.getvalue().splitlines()[-1] == (
            "eval math: 4/10 done (40%) · 2 running · accuracy 0.500 · 1 error · elapsed 45s · ETA 29s")
    assert len(out.getvalue().splitlines()) == 2  # the end adds no line when the last one is current


def test_a_run_off_a_terminal_prints_plain_lines(tmp_path):
    items, _ = load_items(write_json(tmp_path / "d.json", SEARCH + SEARCH[:1]), "search")
    out = io.StringIO()
    run_items(scripted_agent(), items, "search", tmp_path / "run", run={}, concurrency=2, progress_stream=out,
              progress_every=2, progress_interval_s=0)
    lines = out.getvalue().splitlines()
    assert [line.split(" · ")[0] for line in lines] == [
        "eval search: 2/5 done (40%)", "eval search: 4/5 done (80%)", "eval search: 5/5 done (100%)"]
    assert all(" running · accuracy " in line and "elapsed " in line and "ETA " in line for line in lines)
    assert lines[-1].split(" · ")[1:4] == ["0 running", "accuracy 0.600", "1 error"]
    assert lines[-1].endswith("ETA 0s")


def test_a_terminal_gets_the_bar_and_no_progress_gets_nothing():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert isinstance(make_progress(3, "search", stream=Terminal()), BarProgress)
    assert isinstance(make_progress(3, "search", stream=io.StringIO()), LineProgress)
    quiet = make_progress(3, "search", enabled=False, stream=io.StringIO())
    assert type(quiet) is Progress


# --- agentflow trace show ------------------------------------------------------------------------------------------
def test_trace_show_prints_the_steps(results_file, capsys):
    assert cli.main(["trace", "show", "run-p0", "--results", str(results_file)]) == 0
    out = capsys.readouterr().out
    for text in ("What is 2+2?", "run-p0", "step 1", "print(2+2)", "unreadable: no tool named 'teleport'",
                 "timeout: ran past 3 s", "CONTINUE", "answer · max_steps", "gold: 4 | four",
                 "wrong, score 0.0 (rule: search: exact=0)"):
        assert text in out, text
    assert LONG_OUTPUT not in out  # tool outputs are clipped on the terminal too
    assert cli.main(["trace", "show", "run-p2", "--results", str(results_file.parent)]) == 0  # the run folder
    assert HOSTILE in capsys.readouterr().out


def test_trace_show_json_is_the_raw_record(results_file, capsys):
    assert cli.main(["trace", "show", "run-p0", "--results", str(results_file), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == synthetic_rows()[1]["record"]


def test_trace_show_finds_the_record_run_kept(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    record = synthetic_rows()[1]["record"]
    path = save_run(record)
    assert path == RUNS_DIR / f"{record['trajectory_id']}.json"
    assert cli.main(["trace", "show", record["trajectory_id"]]) == 0  # found by its id alone
    out = capsys.readouterr().out
    assert "What is 2+2?" in out and "step 1" in out and "print(2+2)" in out
    assert cli.main(["trace", "show", record["trajectory_id"], "--results", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == record  # `run --json` output is such a file too
    assert cli.main(["trace", "show", "other-id", "--results", str(path)]) == 2
    assert "holds trajectory 'run-p0', not 'other-id'" in capsys.readouterr().err


@pytest.mark.parametrize("args,fragment", [
    (["trace", "show", "run-nope", "--results", "RESULTS"], "no trajectory with id 'run-nope' in"),
    (["trace", "show", "", "--results", "RESULTS"], "argument ID: must be non-empty text"),
    (["trace", "show", "run-p0"], "give the file that holds the trajectory with --results"),
    (["trace", "show", "run-p0", "--results", "/nonexistent/results.jsonl"], "argument --results: no such file"),
])
def test_trace_show_mistakes_are_one_line_errors(results_file, capsys, monkeypatch, tmp_path, args, fragment):
    monkeypatch.chdir(tmp_path)  # no records kept by `agentflow run` here
    argv = [str(results_file) if a == "RESULTS" else a for a in args]
    try:
        code = cli.main(argv)
    except SystemExit as e:  # refused by the parser
        code = e.code
    assert code == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert captured.out == "" and len(err) == 1 and err[0].startswith("agentflow") and fragment in err[0]
