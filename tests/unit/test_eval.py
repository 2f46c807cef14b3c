"""The evaluation harness without a model: loading, running with scripted engines, summary, reports, comparison, CLI."""

import argparse
import json
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from agentflow.errors import EngineError, InvalidInput
from agentflow.eval.compare import compare_runs, load_scores, mcnemar_exact
from agentflow.eval.data import load_items
from agentflow.eval.report import fmt, lookup, render_html, render_markdown, write_reports
from agentflow.eval.runner import run_items
from agentflow.eval.summary import percentile, tool_usage, wilson_interval
from agentflow.domain import trajectory
from agentflow.flow.loop import Agent, LoopConfig
from agentflow.llm.base import Sampling
from agentflow.llm.scripted import ScriptedEngine
from agentflow.modules.executor import Executor
from agentflow.modules.generator import Generator
from agentflow.modules.planner import Planner
from agentflow.modules.verifier import Verifier
from agentflow.tools.base import ToolResult, ToolSpec


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# --- loading -------------------------------------------------------------------------------------------------------
SEARCH = [{"pid": "a", "query": "Who wrote Hamlet?", "answer": ["William Shakespeare"]},
          {"pid": "b", "query": "Capital of France?", "answer": "Paris"},
          {"pid": "c", "query": "Largest planet?", "answer": ["Jupiter"]},
          {"pid": "d", "query": "Fail on this one", "answer": ["x"]}]


def test_load_items_limit_and_unique_pids(tmp_path):
    data = write_json(tmp_path / "d.json", SEARCH + [{"pid": "a", "query": "again", "answer": "y"},
                                                      {"query": "no pid", "answer": "z"}])
    items, total = load_items(data, "search")
    assert total == 6
    assert [i.pid for i in items] == ["a", "b", "c", "d", "a#2", "5"]
    assert [i.pid for i in load_items(data, "search", limit=2)[0]] == ["a", "b"]
    assert items[1].query == "Capital of France?"


@pytest.mark.parametrize("content,kind,fragment", [
    (None, "search", "does not exist"),
    (b"\xff\xfe[]", "search", "not UTF-8"),
    (b"[{\"query\": ", "search", "is not JSON"),
    (b"{\"query\": \"q\"}", "search", "holds a JSON object, expected a list of records"),
    (b"[]", "search", "holds no records"),
    (b"[\"just a string\"]", "search", "record 0 is a JSON string, expected an object"),
    (b"[{\"answer\": \"x\"}]", "search", "record 0 (pid 0) has no 'query' text"),
    (b"[{\"query\": \"  \", \"answer\": \"x\"}]", "search", "has no 'query' text"),
    (b"[{\"query\": \"q\"}]", "search", "has no answer, which kind 'search' needs"),
    (b"[{\"query\": \"make 24\", \"answer\": \"x\"}]", "gameof24", "has no numbers"),
    (b"[{\"query\": \"q\", \"answer\": \"x\"}]", "poetry", "unknown kind 'poetry'; known: gameof24, math, mcq, search"),
])
def test_load_items_bad_input(tmp_path, content, kind, fragment):
    path = tmp_path / "data.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InvalidInput) as error:
        load_items(path, kind)
    assert fragment in str(error.value)


def test_load_items_directory_and_bad_limit(tmp_path):
    with pytest.raises(InvalidInput, match="is a directory"):
        load_items(tmp_path, "search")
    with pytest.raises(InvalidInput, match="--limit must be at least 1"):
        load_items(write_json(tmp_path / "d.json", SEARCH), "search", limit=0)


# --- statistics ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("b,c,p", [
    (0, 0, 1.0),
    (0, 1, 1.0),  # 2 * 1/2
    (0, 5, 0.0625),  # 2 * 1/32
    (1, 6, 0.125),  # 2 * (1 + 7) / 128
    (6, 1, 0.125),  # symmetric
    (3, 3, 1.0),  # 2 * 42/64 > 1, capped
    (2, 10, 0.038574),  # 2 * (1 + 12 + 66) / 4096 = 0.0385742…
    (10, 0, 0.001953),  # 2 / 1024
    (5, 15, 0.041389),  # 2 * 6196 / 2^20 = 0.0413894…
])
def test_mcnemar_exact_against_hand_computed_values(b, c, p):
    assert mcnemar_exact(b, c) == pytest.approx(p, abs=1e-6)


def test_mcnemar_matches_scipy_when_available():
    stats = pytest.importorskip("scipy.stats")
    for b, c in [(1, 6), (2, 10), (7, 13), (20, 31)]:
        assert mcnemar_exact(b, c) == pytest.approx(stats.binomtest(b, b + c, 0.5).pvalue)


def test_percentile_and_wilson():
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 95) == pytest.approx(4.8)
    assert percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 0) is None


def test_tool_usage_counts_calls_errors_and_skips_unparsed_plans():
    turn = lambda tool, error="", parse="": {"decision": {"tool": tool}, "tool_error": error, "parse_error": parse}
    records = [{"turns": [turn("python"), turn("python", "timeout: ran past 3 s"), turn("", parse="no tool named")]},
               {"turns": [turn("search"), turn("python", "parse_error: executor produced an empty command")]}]
    usage = tool_usage(records)
    assert usage["calls"] == 4 and usage["errors"] == 2 and usage["error_rate"] == 0.5
    assert usage["per_tool"]["python"] == {"calls": 3, "errors": 2, "error_rate": pytest.approx(0.666667)}
    assert usage["per_tool"]["search"]["errors"] == 0
    assert usage["command_parse_errors"] == 1
    assert tool_usage([])["error_rate"] is None


# --- running with a scripted agent ---------------------------------------------------------------------------------
class Calc:
    spec = ToolSpec("calc", "evaluates arithmetic", "an expression")

    def run(self, command: str, timeout: float) -> ToolResult:
        if "boom" in command:
            return ToolResult(error="tool failed: boom")
        return ToolResult(output="4")


ANSWERS = {"Who wrote Hamlet?": "Answer: William Shakespeare", "Capital of France?": "Answer: Lyon",
           "Largest planet?": "<answer>Jupiter</answer>"}


def scripted_agent(answers=ANSWERS, *, fail_on="Fail on this one") -> Agent:
    def respond(messages):
        content = messages[-1]["content"]
        if fail_on in content:
            raise EngineError("the server went away")
        if "Choose the next step" in content:
            return "Context: none\nSub-Goal: compute\nTool Name: calc"
        if "Write the input" in content:
            return "```\n2+2\n```" if "Hamlet" not in content else "```\nboom\n```"
        if "Is this enough" in content:
            return "Analysis: enough\nConclusion: STOP"
        if "Answer the question" in content:
            return next(reply for query, reply in answers.items() if query in content)
        return "An analysis."

    engine, s, tool = ScriptedEngine(respond), Sampling(), Calc()
    return Agent(Planner(engine, s, tools=(tool.spec,)), Executor(engine, s, tools={"calc": tool}),
                 Verifier(engine, s), Generator(engine, s), LoopConfig(max_steps=2, max_time_s=30))


@pytest.fixture
def search_run(tmp_path):
    items, _ = load_items(write_json(tmp_path / "search.json", SEARCH), "search")
    run = {"run_id": "t", "data": str(tmp_path / "search.json"), "kind": "search"}
    outcome = run_items(scripted_agent(), items, "search", tmp_path / "out", run=run, concurrency=3, progress=False)
    return outcome


def test_run_scores_items_and_records_failures(search_run):
    rows = [json.loads(line) for line in (search_run.out_dir / "results.jsonl").read_text().splitlines()]
    assert sorted(r["pid"] for r in rows) == ["a", "b", "c", "d"]
    by_pid = {r["pid"]: r for r in rows}
    assert by_pid["a"]["correct"] and by_pid["c"]["correct"]
    assert not by_pid["b"]["correct"] and by_pid["b"]["prediction"] == "Lyon"
    failed = by_pid["d"]
    assert failed["status"] == "error" and "the server went away" in failed["error"] and not failed["correct"]
    for row in rows:
        assert row["record"]["source"] == "eval" and row["record"]["rewards"] == [row["score"]]
        trajectory.validate(row["record"])  # partial records too
    assert by_pid["a"]["record"]["ground_truth"] == "William Shakespeare"
    assert by_pid["a"]["record"]["trajectory_id"] == "t-a"


def test_summary_numbers(search_run):
    summary = json.loads((search_run.out_dir / "summary.json").read_text())
    assert summary == search_run.summary
    assert summary["accuracy"] == 0.5 and summary["correct"] == 2
    assert summary["items"] == {"selected": 4, "finished": 4, "not_run": 0, "errors": 1, "error_rate": 0.25,
                                "judged": 0}
    assert summary["status_counts"] == {"answered": 3, "error": 1}
    assert summary["scores"] == {"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0}
    assert summary["turns"]["mean"] == 0.75  # the failed item stopped before its first turn
    assert summary["turns"]["histogram"] == {"0": {"items": 1, "correct": 0}, "1": {"items": 3, "correct": 2}}
    assert summary["tools"]["per_tool"]["calc"] == {"calls": 3, "errors": 1, "error_rate": pytest.approx(0.333333)}
    assert summary["parse_errors"]["planner_rate"] == 0.0
    assert summary["run"]["interrupted"] is False and summary["run"]["wall_s"] >= 0
    assert summary["latency_s"]["p50"] is not None and summary["latency_s"]["p95"] >= summary["latency_s"]["p50"]


def test_a_judge_rescues_rule_failures_and_is_counted(tmp_path):
    from agentflow.rewards import Judge

    items, _ = load_items(write_json(tmp_path / "d.json", SEARCH[:3]), "search")
    judge = Judge(ScriptedEngine(["Analysis: Lyon is wrong but we are generous\nVerdict: CORRECT"]))
    outcome = run_items(scripted_agent(), items, "search", tmp_path / "out", run={}, judge=judge, progress=False)
    assert outcome.summary["items"]["judged"] == 1 and outcome.summary["accuracy"] == 1.0
    assert len(judge.engine.calls) == 1 and "Lyon" in judge.engine.calls[0][-1]["content"]
    assert "Judged by the LLM judge" in render_markdown(outcome.summary)


def test_interrupt_keeps_what_finished(tmp_path):
    items, _ = load_items(write_json(tmp_path / "d.json", SEARCH[:3] * 5), "search")

    class Slow:
        agent = scripted_agent()

        def solve(self, query, **kw):
            time.sleep(0.05)
            return self.agent.solve(query, **kw)

    def interrupt(row):
        raise KeyboardInterrupt

    outcome = run_items(Slow(), items, "search", tmp_path / "out", run={}, concurrency=1, progress=False,
                        on_row=interrupt)
    assert outcome.interrupted and outcome.summary["run"]["interrupted"]
    lines = (tmp_path / "out" / "results.jsonl").read_text().splitlines()
    finished = outcome.summary["items"]["finished"]
    assert 1 <= finished < 15 and len(lines) == finished
    assert outcome.summary["items"]["not_run"] == 15 - finished


def test_a_crashing_agent_does_not_lose_the_run(tmp_path):
    class Broken:
        def solve(self, query, **kw):
            raise RuntimeError("bug")

    items, _ = load_items(write_json(tmp_path / "d.json", SEARCH), "search")
    outcome = run_items(Broken(), items, "search", tmp_path / "out", run={}, concurrency=2, progress=False)
    assert outcome.summary["items"]["errors"] == 4 and outcome.summary["accuracy"] == 0.0
    row = json.loads((tmp_path / "out" / "results.jsonl").read_text().splitlines()[0])
    assert row["error"] == "internal: RuntimeError: bug" and row["record"] is None


# --- reports -------------------------------------------------------------------------------------------------------
class Metrics(HTMLParser):
    """Collects (data-metric, data-value, text) of every element carrying a metric."""

    def __init__(self):
        super().__init__()
        self.found, self._open, self.images = [], None, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "data-metric" in attrs:
            self._open = [attrs["data-metric"], attrs["data-value"], ""]
        if tag == "img":
            self.images.append(attrs.get("src", ""))

    def handle_data(self, data):
        if self._open is not None:
            self._open[2] += data

    def handle_endtag(self, tag):
        if self._open is not None:
            self.found.append(tuple(self._open))
            self._open = None


def check_html_against_summary(page: str, summary: dict) -> int:
    parser = Metrics()
    parser.feed(page)
    assert parser.found
    for path, value, text in parser.found:
        assert json.loads(value) == lookup(summary, path), path
        assert text.strip() in {fmt(lookup(summary, path), k) for k in ("pct", "s", "int", "num")}, (path, text)
    return len(parser.found)


def test_reports_are_drawn_from_the_summary(search_run):
    paths = write_reports(search_run.summary, search_run.out_dir)
    page = paths["html"].read_text()
    assert check_html_against_summary(page, search_run.summary) > 20
    assert page.count('src="data:image/png;base64,') == 4 and "http" not in page.replace("http://", "")
    for name in ("outcomes", "turns", "tools", "latency"):
        assert paths[f"plot_{name}"].read_bytes().startswith(b"\x89PNG")
    markdown = paths["markdown"].read_text()
    assert "| Accuracy | 50.0% (95% CI" in markdown and "| calc | 3 | 1 | 33.3% |" in markdown
    assert "![tools](plots/tools.png)" in markdown


def test_reports_of_an_empty_interrupted_run(tmp_path):
    outcome = run_items(scripted_agent(), [], "search", tmp_path, run={"data": "x.json", "kind": "search"},
                        progress=False)
    page = render_html(outcome.summary, {})
    assert "Interrupted" not in page and "—" in page
    assert "| Accuracy | — |" in render_markdown(outcome.summary)
    write_reports(outcome.summary, tmp_path)  # plots of nothing still render


# --- comparison ----------------------------------------------------------------------------------------------------
def test_compare_pairs_by_pid_from_summaries_and_jsonl(tmp_path):
    a = write_json(tmp_path / "a.json", {"run": {"data": "x.json"}, "scores": {"1": 1, "2": 1, "3": 0, "4": 0, "5": 1}})
    rows = [{"pid": pid, "score": {"value": v}} for pid, v in [("1", 1), ("2", 0), ("3", 1), ("4", 1), ("6", 1)]]
    b = tmp_path / "b.jsonl"
    b.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    result = compare_runs(a, b)
    assert result["paired_items"] == 4 and result["only_in_a"] == 1 and result["only_in_b"] == 1
    assert (result["both_correct"], result["only_a_correct"], result["only_b_correct"], result["both_wrong"]) == (
        1, 1, 2, 0)
    assert result["a"]["accuracy"] == 0.5 and result["b"]["accuracy"] == 0.75 and result["difference"] == 0.25
    assert result["mcnemar_p"] == 1.0


def test_compare_reads_run_folders(search_run, tmp_path):
    scores, run = load_scores(search_run.out_dir)
    assert scores == {"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0} and run["kind"] == "search"
    assert compare_runs(search_run.out_dir, search_run.out_dir / "results.jsonl")["difference"] == 0.0


@pytest.mark.parametrize("content,fragment", [
    (None, "does not exist"),
    ('{"accuracy": 1}', "without 'scores'"),
    ("[1, 2]", "is a JSON list"),
    ("not json\n", "line 1 is not an eval result row"),
    ("", "holds no results"),
])
def test_compare_bad_input(tmp_path, content, fragment):
    good = write_json(tmp_path / "good.json", {"scores": {"1": 1}})
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    with pytest.raises(InvalidInput, match=fragment.replace("(", r"\(")):
        compare_runs(good, bad)


def test_compare_without_common_items(tmp_path):
    a = write_json(tmp_path / "a.json", {"scores": {"1": 1}})
    b = write_json(tmp_path / "b.json", {"scores": {"2": 1}})
    with pytest.raises(InvalidInput, match="no items in common"):
        compare_runs(a, b)


# --- the command line ----------------------------------------------------------------------------------------------
def eval_main(argv: list[str]) -> int:
    """``agentflow …`` in-process: through agentflow.cli once it registers ``eval``, else the standalone entry."""
    from agentflow import cli
    from agentflow.eval import cli as eval_cli

    commands = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction))
    wired = "eval" in commands.choices
    try:
        return (cli.main if wired else eval_cli.main)(argv)
    except SystemExit as e:  # refused by the parser (one line: ``agentflow eval: error: argument --flag: ...``)
        return e.code


def assert_one_line_error(capsys, code: int, fragment: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("agentflow") and ": error: " in err[0] and fragment in err[0], err


@pytest.mark.parametrize("args,fragment", [
    (["eval", "--kind", "search"], "no data file given"),
    (["eval", "--data", "DATA"], "no --kind given; one of gameof24, math, mcq, search"),
    (["eval", "--data", "DATA", "--kind", "poetry"], "argument --kind: unknown: poetry"),
    (["eval", "--data", "/nonexistent/b.json", "--kind", "search"], "--data: no such file: /nonexistent/b.json"),
    (["eval", "--data", "NOTJSON", "--kind", "search"], "is not JSON"),
    (["eval", "--data", "OBJECT", "--kind", "search"], "expected a list of records"),
    (["eval", "--data", "NOQUERY", "--kind", "search"], "has no 'query' text"),
    (["eval", "--data", "DATA", "--kind", "search", "--gateway", "http://gw:8080"], "--gateway: "),
    (["eval", "--data", "DATA", "--kind", "search", "--concurrency", "0"], "--concurrency: must be an integer >= 1"),
    (["eval", "--data", "DATA", "--kind", "search", "--limit", "0"], "argument --limit: must be an integer >= 1"),
    (["eval", "--data", "DATA", "--kind", "search", "--max-steps", "0"], "--max-steps: must be an integer >= 1"),
    (["eval", "--data", "DATA", "--kind", "search", "--tools", "python,teleport"], "--tools: unknown: teleport"),
    (["eval", "--data", "DATA", "--kind", "search", "--engine", "openai"], "needs an endpoint"),
    (["eval", "--data", "DATA", "--kind", "search", "--out", "HELD"], "already holds a run"),
    (["eval", "run", "--data", "DATA", "--kind", "poetry"], "argument --kind: unknown: poetry"),
    (["eval", "--data", "DATA", "--kind", "search", "--progress-every", "-1"], "argument --progress-every: must be an"),
    (["eval", "compare", "/nonexistent/a.json", "/nonexistent/b.json"], "argument a: no such file or folder"),
])
def test_cli_user_mistakes_are_one_line_errors(tmp_path, capsys, args, fragment):
    files = {"DATA": write_json(tmp_path / "d.json", SEARCH), "NOTJSON": tmp_path / "n.json",
             "OBJECT": write_json(tmp_path / "o.json", {"query": "q"}),
             "NOQUERY": write_json(tmp_path / "q.json", [{"answer": "x"}]), "HELD": tmp_path / "held"}
    files["NOTJSON"].write_text("not json")
    files["HELD"].mkdir()
    (files["HELD"] / "summary.json").write_text("{}")
    argv = [str(files.get(a, a)) for a in args]
    assert_one_line_error(capsys, eval_main(argv), fragment)


def test_cli_compare_prints_a_table_or_json(tmp_path, capsys):
    a = write_json(tmp_path / "a.json", {"scores": {str(i): 0 for i in range(10)}})
    b = write_json(tmp_path / "b.json", {"scores": {str(i): 1 for i in range(10)}})
    assert eval_main(["eval", "compare", str(a), str(b), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["only_b_correct"] == 10 and result["mcnemar_p"] == pytest.approx(2 / 1024)
    assert eval_main(["eval", "compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "paired comparison over 10 items" in out and "+100.0 points" in out and "p = 0.001953" in out


def test_a_call_may_take_the_items_whole_time(monkeypatch):
    from agentflow.eval.cli import _engine_settings

    monkeypatch.delenv("AGENTFLOW_TIMEOUT_S", raising=False)
    args = argparse.Namespace(engine=None, model=None, endpoint=None, api_key=None, planner_endpoint=None,
                              planner_model=None)
    shared, planner = _engine_settings(args, 300.0)
    assert shared.timeout_s == planner.timeout_s == 300.0  # not the 120 s per-call default
    monkeypatch.setenv("AGENTFLOW_TIMEOUT_S", "600")
    assert _engine_settings(args, 300.0)[0].timeout_s == 600.0  # a longer one set on purpose stays
