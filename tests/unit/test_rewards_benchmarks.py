"""The reward rules on every record of the published benchmark files: each gold answer scores 1, a wrong one 0.

The files live outside the repository (../shared/benchmarks, or $AGENTFLOW_BENCHMARKS); the tests skip without them
(under CI they fail).
"""

import json

import pytest

from agentflow.eval.data import load_items
from agentflow.rewards import as_answers, gold_letter, options_of, score
from tests.benchmarks import benchmark_files

KINDS = {"bamboogle": "search", "2wiki": "search", "hotpotqa": "search", "aime24": "math", "gameof24": "gameof24",
         "medqa": "mcq"}


def records(name: str) -> list[dict]:
    return json.loads((benchmark_files(f"{name}.json") / f"{name}.json").read_text(encoding="utf-8"))


def wrong_answer(kind: str, record: dict) -> str:
    if kind == "math":
        return str(int(as_answers(record["answer"])[0]) + 1)
    if kind == "mcq":
        options = options_of(record)
        gold = gold_letter(record["answer"], options)
        return next(letter for letter in options if letter != gold)
    if kind == "gameof24":
        return "+".join(str(n) for n in record["question"])  # uses each number once, but rarely makes 24
    return "zzz not an answer"


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_record_loads_and_its_gold_answer_scores_one(name):
    kind = KINDS[name]
    data = records(name)
    items, total = load_items(benchmark_files(f"{name}.json") / f"{name}.json", kind)
    assert total == len(items) == len(data)
    assert len({item.pid for item in items}) == len(items)
    for record in data:
        golds = record["answer"] if kind == "gameof24" else as_answers(record["answer"])
        assert golds, record["pid"]
        for gold in golds:
            reward = score(kind, gold, record)
            assert reward["value"] == 1.0, (record["pid"], gold, reward)
            assert score(kind, f"<answer>{gold}</answer>", record)["value"] == 1.0


@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_wrong_answer_scores_zero_on_every_record(name):
    kind = KINDS[name]
    for record in records(name):
        wrong = wrong_answer(kind, record)
        if kind == "gameof24" and sum(record["question"]) == 24:
            continue
        assert score(kind, wrong, record)["value"] == 0.0, (record["pid"], wrong)
