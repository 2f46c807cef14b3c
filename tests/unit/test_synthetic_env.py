"""The synthetic environment: deterministic by seed, ground truth computed and consistent with the corpus,
train / held-out disjoint, and the search tool really finds every fact."""

import ast
import json
import operator
import re

import pytest

from agentflow.envs.synthetic import ATTRIBUTES, CYCLE, EXPECTED_TOOLS, KINDS, EnvConfig, SyntheticEnv
from agentflow.errors import InvalidInput
from agentflow.tools.search import SearchTool

SMALL = EnvConfig(seed=7, towns=12, train_size=60, heldout_size=12)


@pytest.fixture(scope="module")
def env():
    return SyntheticEnv(SMALL)


def test_same_seed_same_world_and_tasks():
    a, b = SyntheticEnv(SMALL), SyntheticEnv(SMALL)
    assert a.passages() == b.passages()
    assert [t.as_dict() for t in a.train + a.heldout] == [t.as_dict() for t in b.train + b.heldout]


def test_other_seed_other_world():
    a, b = SyntheticEnv(SMALL), SyntheticEnv(EnvConfig(seed=8, towns=12, train_size=60, heldout_size=12))
    assert [t.query for t in a.train] != [t.query for t in b.train]
    assert a.passages()[:12] != b.passages()[:12]


def test_split_is_disjoint(env):
    assert not {t.query for t in env.train} & {t.query for t in env.heldout}
    assert not set(env.train_facts) & set(env.heldout_facts)
    assert len(env.train_facts) + len(env.heldout_facts) == len(env.towns) * len(ATTRIBUTES)
    heldout_towns_asked = {town for t in env.heldout if t.kind != "arithmetic" for town in _towns_in(env, t.query)}
    assert heldout_towns_asked  # held-out questions are about held-out facts only:
    for task in env.heldout:
        if task.kind != "arithmetic":
            assert _fact_of(env, task.query) in env.heldout_facts
    for task in env.train:
        if task.kind != "arithmetic":
            assert _fact_of(env, task.query) in env.train_facts


def test_kinds_follow_the_cycle_and_tools_recorded(env):
    for tasks in (env.train, env.heldout):
        assert [t.kind for t in tasks] == [CYCLE[i % len(CYCLE)] for i in range(len(tasks))]
        assert set(t.kind for t in tasks) == set(CYCLE) == set(KINDS) - {"three_hop"}
        assert all(t.tools == EXPECTED_TOOLS[t.kind] for t in tasks)
        assert len({t.id for t in tasks}) == len(tasks)
    # each first tool is right for a third of the tasks: no fixed tool sequence can do better than that
    firsts = [t.tools[0] for t in env.train]
    assert {tool: firsts.count(tool) for tool in set(firsts)} == {"python": 20, "search": 20, "generalist": 20}


def test_town_names_are_new_and_distinct(env):
    names = [t.name for t in env.towns]
    assert len(set(names)) == len(names)
    bundled = " ".join(p["text"] + " " + p["title"] for p in env.passages()[len(names):]).lower()
    assert not any(n.lower() in bundled for n in names)


# --- ground truth, checked independently of how the generator computed it ----------------------------------------

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _safe_eval(expression: str) -> int:
    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise ValueError(f"unexpected {ast.dump(node)}")

    return walk(ast.parse(expression, mode="eval"))


def _expression(query: str) -> str:
    text = query.replace("times", "*").replace("plus", "+").replace("minus", "-")
    return re.sub(r"[^0-9+\-*() ]", "", text).strip()


def _towns_in(env, query: str) -> list[str]:
    return [t.name for t in env.towns if re.search(rf"\b{t.name}\b", query)]


def _corpus_value(env, town: str, attribute: str) -> int:
    """The number the corpus passage (or, for history, the generalist's knowledge) states for (town, attribute),
    read from the text alone."""
    keyword = {"bridges": "bridges", "population": "population", "founded": "founded", "elevation": "elevation"}
    if attribute == "founded":
        sentences = [k for k in env.knowledge() if re.search(rf"\b{town}\b", k)]
    else:
        passage = next(p for p in env.passages() if p["title"] == town)
        sentences = re.split(r"(?<=\.) ", passage["text"])
    sentence = next(s for s in sentences if keyword[attribute] in s)
    return int(re.findall(r"\d+", sentence)[0])


_QUESTION_WORDS = {"bridges": "bridges", "population": ("population", "people"), "founded": ("founded", "founding"),
                   "elevation": ("elevation", "metres")}


def _fact_of(env, query: str) -> tuple[str, str]:
    (town,) = _towns_in(env, query)
    for attribute, words in _QUESTION_WORDS.items():
        if any(w in query for w in ((words,) if isinstance(words, str) else words)):
            return town, attribute
    raise AssertionError(f"no attribute in {query!r}")


def test_arithmetic_ground_truth(env):
    tasks = [t for t in env.train + env.heldout if t.kind == "arithmetic"]
    assert tasks
    for task in tasks:
        assert int(task.answer) == _safe_eval(_expression(task.query)), task.query
        assert all(int(n) % 10 for n in re.findall(r"\d+", task.query))  # no round operands to estimate with
        assert int(task.answer) > 10_000  # large enough that guessing fails


def test_lookup_ground_truth_is_what_the_corpus_says(env):
    tasks = [t for t in env.train + env.heldout if t.kind in ("lookup", "history")]
    assert {t.kind for t in tasks} == {"lookup", "history"}
    for task in tasks:
        town, attribute = _fact_of(env, task.query)
        assert (attribute == "founded") == (task.kind == "history")
        assert int(task.answer) == _corpus_value(env, town, attribute), task.query


def test_history_is_known_to_the_generalist_only(env):
    knowledge = env.knowledge()
    assert len(knowledge) == len(env.towns) and all("founded" in k for k in knowledge)
    assert not any("founded" in p["text"] for p in env.passages()[: len(env.towns)])


def test_two_hop_ground_truth_uses_the_corpus_value(env):
    tasks = [t for t in env.train + env.heldout if t.kind == "two_hop"]
    for task in tasks:
        town, attribute = _fact_of(env, task.query)
        value = _corpus_value(env, town, attribute)
        k = int(re.findall(r"\d+", task.query)[-1])
        op = re.search(r"\b(times|plus|minus)\b", task.query).group(1)
        assert int(task.answer) == {"times": value * k, "plus": value + k, "minus": value - k}[op], task.query


def test_corpus_file_and_search_find_every_fact(env, tmp_path):
    path = env.corpus_path(tmp_path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == env.passages()
    assert env.corpus_path(tmp_path) == path  # same content, same file
    config = env.tools_config(tmp_path)
    assert config.search.corpus_path == str(path)
    search = SearchTool(config.search)
    for town in env.towns:
        for attribute in (a for a in ATTRIBUTES if a.source == "corpus"):
            question = attribute.questions[0].format(town=town.name)
            result = search.run(question, timeout=10)
            assert result.ok and result.meta["titles"][0] == town.name, (question, result.meta)


def test_bad_config_is_refused():
    with pytest.raises(InvalidInput, match="env.towns"):
        EnvConfig(towns=2)
    with pytest.raises(InvalidInput, match="heldout_fraction"):
        EnvConfig(heldout_fraction=1.0)
    with pytest.raises(InvalidInput, match="could not make"):
        SyntheticEnv(EnvConfig(towns=4, train_size=3000, heldout_size=6))
