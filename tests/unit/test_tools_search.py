import json

import pytest

from agentflow.errors import InvalidInput
from agentflow.tools.search import DEFAULT_CORPUS, SearchConfig, SearchTool, load_corpus


def test_default_corpus_ships_with_the_package():
    passages = load_corpus(DEFAULT_CORPUS)
    assert len(passages) >= 45
    assert sum("Veloria" in p.title for p in passages) >= 10


@pytest.mark.parametrize("query, title, fact", [
    ("What is the capital of Veloria?", "Veloria: capital", "Port Isen"),
    ("longest river of Veloria", "Veloria: rivers", "Marrow"),
    ("Veloria population", "Veloria: population", "412,000"),
    ("year Veloria was founded", "Veloria", "1743"),
    ("Mount Everest first ascent", "Mount Everest", "1953"),
])
def test_finds_the_right_passage(query, title, fact):
    result = SearchTool().run(query, timeout=5)
    assert result.ok, result.error
    assert result.meta["titles"][0] == title
    assert fact in result.output.split("\n\n")[0]


def test_returns_top_k_passages_with_titles():
    result = SearchTool(SearchConfig(top_k=2)).run("Veloria", timeout=5)
    assert result.meta["hits"] == 2
    assert result.output.startswith("[1] Veloria")
    assert "\n\n[2] " in result.output


def test_no_match_is_not_an_error():
    result = SearchTool().run("qwxzzy", timeout=5)
    assert result.ok and "No passages matched" in result.output


def test_empty_query_is_an_error():
    assert SearchTool().run("   ", timeout=5).error.startswith("invalid_input:")


def test_missing_corpus_names_the_file(tmp_path):
    path = tmp_path / "nope.jsonl"
    result = SearchTool(SearchConfig(corpus_path=str(path))).run("anything", timeout=5)
    assert result.error.startswith("bad_corpus:") and str(path) in result.error


@pytest.mark.parametrize("bad_line, problem", [
    ("{not json", "not valid JSON"),
    ('{"title": "x"}', "'text'"),
    ('["a", "b"]', "expected an object"),
])
def test_malformed_corpus_names_file_and_line(tmp_path, bad_line, problem):
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"title": "ok", "text": "fine"}) + "\n\n" + bad_line + "\n")
    result = SearchTool(SearchConfig(corpus_path=str(path))).run("fine", timeout=5)
    assert f"{path} line 3" in result.error and problem in result.error


def test_index_is_rebuilt_when_the_corpus_changes(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"title": "Alpha", "text": "apples grow here"}) + "\n")
    tool = SearchTool(SearchConfig(corpus_path=str(path)))
    assert tool.run("apples", timeout=5).meta["titles"] == ["Alpha"]
    path.write_text(json.dumps({"title": "Beta", "text": "bananas and apples grow there too"}) + "\n")
    assert tool.run("bananas", timeout=5).meta["titles"] == ["Beta"]


def test_top_k_must_be_positive():
    with pytest.raises(InvalidInput):
        SearchConfig(top_k=0)
