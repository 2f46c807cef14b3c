"""Resuming an interrupted eval (`agentflow eval --resume DIR`) and the data hash that `eval compare` checks, with the
real CLI and a scripted engine in place of the model."""

import functools
import json
import time

import pytest

from agentflow.errors import InvalidInput
from agentflow.eval import cli as eval_cli
from agentflow.eval import runner
from agentflow.eval.compare import compare_runs
from agentflow.eval.data import data_hash, load_items
from agentflow.llm.scripted import ScriptedEngine
from tests.unit.test_eval import SEARCH, assert_one_line_error, eval_main, write_json

DATA = [{"pid": f"p{i}", "query": f"What is item {i}?", "answer": f"answer {i}"} for i in range(8)]


def respond(messages) -> str:
    """Every module's reply: one generalist call, then STOP; the answer is right for even items. An item takes some
    50 ms, so that an interrupted run leaves items to resume."""
    time.sleep(0.01)
    content = messages[-1]["content"]
    if "Choose the next step" in content:
        return "Context: none\nSub-Goal: ask\nTool Name: generalist"
    if "Write the input" in content:
        return "```\nWhat is it?\n```"
    if "Is this enough" in content:
        return "Analysis: enough\nConclusion: STOP"
    if "Answer the question" in content:
        number = next(i for i in range(len(DATA)) if f"What is item {i}?" in content)
        return f"Answer: answer {number if number % 2 == 0 else 'wrong'}"
    return "Some notes."


@pytest.fixture
def scripted(monkeypatch):
    """`agentflow eval` builds a scripted engine instead of loading a model; the list holds each one built."""
    built = []

    def build_engine(settings, bus=None):
        built.append(ScriptedEngine(respond))
        return built[-1]

    monkeypatch.setattr("agentflow.llm.build_engine", build_engine)
    return built


def eval_args(data, out, *extra) -> list[str]:
    return ["eval", "--data", str(data), "--kind", "search", "--out", str(out), "--tools", "generalist",
            "--concurrency", "2", "--max-steps", "2", "--no-progress", "--json", *extra]


def interrupt_after(monkeypatch, rows: int) -> None:
    """The next `run_items` stops as Ctrl-C does once ``rows`` items have finished."""
    finished = []

    def on_row(row):
        finished.append(row)
        if len(finished) == rows:
            raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_items", functools.partial(runner.run_items, on_row=on_row))


def pids(folder) -> list[str]:
    return [json.loads(line)["pid"] for line in (folder / "results.jsonl").read_text().splitlines()]


def test_an_interrupted_run_resumes_where_it_stopped(tmp_path, scripted, monkeypatch, capsys):
    data, out = write_json(tmp_path / "d.json", DATA), tmp_path / "run"
    with monkeypatch.context() as patch:
        interrupt_after(patch, 3)
        assert eval_main(eval_args(data, out, "--limit", "7")) == 130
    captured = capsys.readouterr()
    first = json.loads(captured.out)
    assert first["run"]["interrupted"] and 3 <= first["items"]["finished"] < 7
    assert f"(agentflow eval --resume {out} runs the rest)" in captured.err
    done_before = pids(out)

    monkeypatch.chdir(tmp_path / "run")  # the stored data path is absolute: any working folder will do
    assert eval_main(["eval", "--resume", str(out), "--no-progress", "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert f"{len(done_before)} of 7 items done, {7 - len(done_before)} to run" in captured.err
    assert sorted(pids(out)) == [f"p{i}" for i in range(7)]  # every item exactly once
    assert pids(out)[:len(done_before)] == done_before  # appended after the first session's rows
    assert summary["items"] == {**summary["items"], "selected": 7, "finished": 7, "not_run": 0}
    assert summary["run"]["run_id"] == first["run"]["run_id"] and not summary["run"]["interrupted"]
    assert summary["run"]["data_sha256"] == data_hash(load_items(data, "search", 7)[0])
    assert summary["run"]["max_steps"] == 2 and summary["run"]["tools"] == "generalist"  # the stored settings
    assert summary["correct"] == 4 and set(summary["scores"]) == {f"p{i}" for i in range(7)}
    assert summary["run"]["wall_s"] >= first["run"]["wall_s"]
    page = (out / "report.html").read_text()
    assert all(f'data-pid="p{i}"' in page for i in range(7))


def test_a_killed_run_resumes_past_its_torn_last_line(tmp_path, scripted, monkeypatch, capsys):
    data, out = write_json(tmp_path / "d.json", DATA), tmp_path / "run"
    with monkeypatch.context() as patch:
        interrupt_after(patch, 2)
        assert eval_main(eval_args(data, out)) == 130
    (out / "summary.json").unlink()  # killed: no summary, and half a row
    with (out / "results.jsonl").open("a") as f:
        f.write('{"index": 7, "pid": "p7", "query": "What is it')
    assert eval_main(["eval", "run", "--resume", str(out), "--no-progress"]) == 0
    assert sorted(pids(out)) == [f"p{i}" for i in range(8)]
    assert json.loads((out / "summary.json").read_text())["items"]["finished"] == 8


def test_a_finished_run_resumed_only_rewrites_its_reports(tmp_path, scripted, capsys):
    data, out = write_json(tmp_path / "d.json", DATA[:3]), tmp_path / "run"
    assert eval_main(eval_args(data, out)) == 0
    (out / "report.html").unlink()
    assert eval_main(["eval", "--resume", str(out), "--no-progress"]) == 0
    assert len(scripted) == 1  # no engine was built the second time
    assert "3 of 3 items done, 0 to run" in capsys.readouterr().err
    assert (out / "report.html").is_file() and sorted(pids(out)) == ["p0", "p1", "p2"]


@pytest.mark.parametrize("change,args,fragment", [
    ("data", [], "the data file"),
    (None, ["--kind", "math"], "--kind math differs from its 'search'"),
    (None, ["--max-steps", "4"], "--max-steps 4 differs from its 2"),
    (None, ["--out", "elsewhere"], "writes into"),
    ("run.json", [], "not a resumable eval run (no run.json"),
    ("folder", [], "no such folder"),
])
def test_resume_refusals_are_one_line_errors(tmp_path, scripted, capsys, change, args, fragment):
    data, out = write_json(tmp_path / "d.json", DATA[:3]), tmp_path / "run"
    assert eval_main(eval_args(data, out)) == 0
    capsys.readouterr()
    if change == "data":
        write_json(data, [{**DATA[0], "answer": "another"}] + DATA[1:3])
    elif change == "run.json":
        (out / "run.json").unlink()
    elif change == "folder":
        out = tmp_path / "absent"
    argv = ["eval", "--resume", str(out), "--no-progress", *args]
    assert_one_line_error(capsys, eval_main(argv), fragment)


def test_the_same_settings_given_again_are_accepted(tmp_path, scripted, capsys):
    data, out = write_json(tmp_path / "d.json", DATA[:2]), tmp_path / "run"
    assert eval_main(eval_args(data, out)) == 0
    assert eval_main(["eval", "--resume", str(out), "--data", str(data), "--max-steps", "2", "--no-progress"]) == 0


def test_a_new_run_refuses_a_folder_holding_a_run_file(tmp_path, scripted, capsys):
    data, out = write_json(tmp_path / "d.json", DATA[:2]), tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text("{}")
    assert_one_line_error(capsys, eval_main(eval_args(data, out)), "already holds a run (run.json)")


# --- the data hash and `eval compare` -------------------------------------------------------------------------------
def test_the_data_hash_covers_pids_queries_and_answers(tmp_path):
    items = load_items(write_json(tmp_path / "a.json", DATA), "search")[0]
    same = load_items(write_json(tmp_path / "b.json", [{**r, "extra": 1} for r in DATA]), "search")[0]
    assert data_hash(items) == data_hash(same) and len(data_hash(items)) == 64
    for field, value in (("pid", "other"), ("query", "Other?"), ("answer", "other")):
        changed = load_items(write_json(tmp_path / "c.json", [{**DATA[0], field: value}] + DATA[1:]), "search")[0]
        assert data_hash(changed) != data_hash(items), field
    assert data_hash(items[:3]) != data_hash(items)


def scripted_run(tmp_path, name: str, records: list[dict]):
    """A run folder (results.jsonl, summary.json) of ``records`` by the runner with a scripted agent."""
    from tests.unit.test_eval import scripted_agent

    items = load_items(write_json(tmp_path / f"{name}.json", records), "search")[0]
    answers = {r["query"]: f"Answer: {r['answer']}" for r in records}
    outcome = runner.run_items(scripted_agent(answers), items, "search", tmp_path / name, run={"run_id": name},
                               progress=False)
    assert outcome.summary["run"]["data_sha256"] == data_hash(items)
    return tmp_path / name


def test_compare_refuses_runs_over_different_data_unless_forced(tmp_path, capsys):
    a = scripted_run(tmp_path, "a", SEARCH[:3])
    b = scripted_run(tmp_path, "b", [SEARCH[0], {**SEARCH[1], "query": "Capital of Italy?"}, SEARCH[2]])
    assert_one_line_error(capsys, eval_main(["eval", "compare", str(a), str(b)]),
                          "were run on different data (data_sha256")
    assert eval_main(["eval", "compare", str(a), str(b), "--force", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["paired_items"] == 2 and result["query_differs"] == 1 and result["only_in_a"] == 0
    assert "paired 2 items whose pid and query match, dropped 1 whose query differs" in result["warning"]
    assert eval_main(["eval", "compare", str(a), str(b), "--force"]) == 0
    assert "dropped 1 whose query differs" in " ".join(capsys.readouterr().out.split())  # rich wraps lines
    assert compare_runs(a, a / "results.jsonl")["paired_items"] == 3  # same data: no warning, no refusal
    assert "warning" not in compare_runs(a, a)


def legacy(folder):
    """``folder``'s run as written before the data hash existed."""
    summary = json.loads((folder / "summary.json").read_text())
    del summary["run"]["data_sha256"]
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_compare_falls_back_to_queries_for_runs_without_a_hash(tmp_path, capsys):
    a = legacy(scripted_run(tmp_path, "a", SEARCH[:3]))
    same = scripted_run(tmp_path, "same", SEARCH[:3])  # a new run over the same items pairs with an old one
    assert compare_runs(a, same)["paired_items"] == 3 and "warning" not in compare_runs(a, same)
    other = legacy(scripted_run(tmp_path, "other", [{**r, "query": r["query"] + " (2)"} for r in SEARCH[:3]]))
    with pytest.raises(InvalidInput, match="hold different queries under 3 shared pids"):
        compare_runs(a, other / "summary.json")
    with pytest.raises(InvalidInput, match="no items in common"):  # forced, nothing is left to pair
        compare_runs(a, other, force=True)
    longer = legacy(scripted_run(tmp_path, "longer", SEARCH))  # more items, the shared ones alike: fine
    assert compare_runs(a, longer)["paired_items"] == 3


def test_compare_without_hash_or_queries_warns_that_it_could_not_check(tmp_path):
    a = write_json(tmp_path / "a.json", {"run": {"data": "x.json"}, "scores": {"1": 1, "2": 0}})
    b = write_json(tmp_path / "b.json", {"run": {"data": "y.json"}, "scores": {"1": 1, "2": 1}})
    assert "not checked" in compare_runs(a, b)["warning"]
