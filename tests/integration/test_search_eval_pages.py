"""The search-eval pages (tests/fixtures/search_eval, bench/search_eval.py) cover their benchmark items: every item's
pages exist, a gold answer occurs in one of them, and the real ``wikipedia`` tool, reading the MediaWiki stand-in
that serves them, returns one of the item's pages in its top 3 for the item's question. No LLM.

The benchmark files live outside the repository (../shared/benchmarks, or $AGENTFLOW_BENCHMARKS); without them the
tests that need the questions and answers skip (under CI they fail).
"""

import json
import re
from pathlib import Path

import pytest

from agentflow.rewards.text import any_normalised_in
from tests.benchmarks import benchmark_files

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "search_eval"
FORMAT_INSTRUCTION = re.compile(r"\s*When ready, output the final answer.*\Z", re.S)


def _pages() -> dict[str, str]:
    with (FIXTURES / "pages.jsonl").open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {row["title"]: row["text"] for row in rows}


def _items() -> list[dict]:
    return json.loads((FIXTURES / "items.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def items() -> list[dict]:
    """The fixture's items joined with their benchmark records (question without its format line, answer)."""
    files = sorted({item["file"] for item in _items()})
    folder = benchmark_files(*files)
    records = {name: {str(r["pid"]): r for r in json.loads((folder / name).read_text(encoding="utf-8"))}
               for name in files}
    out = []
    for item in _items():
        record = records[item["file"]][str(item["pid"])]
        question = FORMAT_INSTRUCTION.sub("", record.get("question") or record["query"]).strip()
        out.append(dict(item, question=question, answer=record["answer"]))
    return out


def test_pages_are_well_formed_and_cover_every_item():
    pages = _pages()
    with (FIXTURES / "pages.jsonl").open(encoding="utf-8") as f:
        assert sum(1 for line in f if line.strip()) == len(pages), "duplicate page titles"
    for title, text in pages.items():
        assert title.strip() and 60 <= len(text.split()) <= 250, (title, len(text.split()))
    items = _items()
    assert {(i["file"], len([j for j in items if j["file"] == i["file"]])) for i in items} == \
        {("bamboogle.json", 20), ("hotpotqa.json", 20)}
    for item in items:
        assert set(item) == {"file", "pid", "pages"}  # no benchmark text copied into the fixture
        assert item["pages"] and all(p in pages for p in item["pages"]), item


def test_every_gold_answer_is_in_one_of_its_pages(items):
    pages = _pages()
    for item in items:
        assert any(any_normalised_in(pages[p], item["answer"]) for p in item["pages"]), (item["pid"], item["answer"])


def test_the_wikipedia_tool_finds_each_items_pages_on_the_standin(items, monkeypatch):
    from agentflow.tools.registry import build_tools
    from tests.standins.web import MediaWikiStandin

    pages = [{"title": t, "text": x} for t, x in _pages().items()]
    misses = []
    with MediaWikiStandin(pages) as wiki:
        monkeypatch.setenv("AGENTFLOW_WIKIPEDIA_URL", wiki.api_url)
        tool = build_tools(["wikipedia"])["wikipedia"]
        for item in items:
            result = tool.run(item["question"], 60.0)
            assert result.ok, (item["pid"], result.error)
            top = list(dict.fromkeys(list(result.meta.get("pages") or []) + list(result.meta.get("titles") or [])))[:3]
            if not set(item["pages"]) & set(top):
                misses.append((item["file"], item["pid"], item["pages"], top))
    assert not misses, misses
