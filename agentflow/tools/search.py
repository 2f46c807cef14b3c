"""The ``search`` tool: BM25 (``bm25s``) over a local JSONL corpus, one ``{"title", "text"}`` object per line.

The default corpus ships with the package (``agentflow/data/corpus.jsonl``): short general-knowledge passages
plus a few about the fictional island nation of Veloria that only this corpus knows. An index is built once per
corpus file (path, size and modification time) on first use and shared by every tool instance.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import bm25s

from agentflow.config import setting
from agentflow.errors import InvalidInput, ToolFailure
from agentflow.tools.base import ToolResult, ToolSpec

DEFAULT_CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus.jsonl"


@dataclass(frozen=True)
class SearchConfig:
    corpus_path: str = setting(str(DEFAULT_CORPUS), "JSONL file with title and text per line")
    top_k: int = setting(3, "passages returned per query")

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise InvalidInput(f"search tool setting top_k must be at least 1, got {self.top_k!r}")


@dataclass(frozen=True)
class Passage:
    title: str
    text: str


def _fold_plurals(word: str) -> str:
    """A tiny stemmer: 'rivers' and 'river' index alike."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def _fold_all(words: list[str]) -> list[str]:
    return [_fold_plurals(w) for w in words]


def _tokenize(texts: list[str]) -> list[list[str]]:
    return bm25s.tokenize(texts, stopwords="en", stemmer=_fold_all, return_ids=False, show_progress=False)


def load_corpus(path: Path) -> list[Passage]:
    """Read a JSONL corpus; raises ToolFailure naming the file and line of the first problem."""
    if not path.is_file():
        raise ToolFailure(f"corpus file not found: {path}")
    passages = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                passages.append(_parse_line(path, number, line))
    if not passages:
        raise ToolFailure(f"corpus file {path} has no passages")
    return passages


def _parse_line(path: Path, number: int, line: str) -> Passage:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ToolFailure(f"{path} line {number}: not valid JSON ({exc.msg})") from exc
    if not isinstance(item, dict):
        raise ToolFailure(f"{path} line {number}: expected an object with 'title' and 'text'")
    for key in ("title", "text"):
        if not isinstance(item.get(key), str) or not item[key].strip():
            raise ToolFailure(f"{path} line {number}: missing or empty '{key}'")
    return Passage(item["title"].strip(), item["text"].strip())


class _Index:
    def __init__(self, passages: list[Passage]):
        self.passages = passages
        self.bm25 = bm25s.BM25()
        self.bm25.index(_tokenize([f"{p.title}. {p.text}" for p in passages]), show_progress=False)

    def search(self, query: str, k: int) -> list[tuple[Passage, float]]:
        tokens = _tokenize([query])
        if not tokens[0]:
            return []
        ids, scores = self.bm25.retrieve(tokens, k=min(k, len(self.passages)), show_progress=False)
        return [(self.passages[i], float(s)) for i, s in zip(ids[0], scores[0]) if s > 0]


_indexes: dict[tuple, _Index] = {}
_indexes_lock = threading.Lock()


def _index_for(path: Path) -> _Index:
    """The cached index of ``path``, built on first use (and again if the file changes)."""
    stat = path.stat() if path.is_file() else None
    key = (str(path), stat.st_size if stat else None, stat.st_mtime_ns if stat else None)
    with _indexes_lock:
        if key not in _indexes:
            _indexes[key] = _Index(load_corpus(path))
        return _indexes[key]


class SearchTool:
    """Keyword search over a local corpus of short passages."""

    def __init__(self, config: SearchConfig | None = None):
        self.config = config or SearchConfig()
        self.corpus_path = Path(self.config.corpus_path).expanduser().resolve()
        self.spec = ToolSpec(
            name="search",
            description="Searches a local encyclopedia of short passages and returns the best matches with titles.",
            input_format="a few keywords or a short question, e.g. 'capital of Veloria'",
            examples=("highest mountain Nepal", "Veloria founding year"),
            limitations=f"only what the local corpus contains; returns at most {self.config.top_k} passages",
        )

    def run(self, command: str, timeout: float) -> ToolResult:
        started = time.monotonic()
        query = command.strip()
        if not query:
            return ToolResult(error="invalid_input: empty search query")
        try:
            hits = _index_for(self.corpus_path).search(query, self.config.top_k)
        except ToolFailure as exc:
            return ToolResult(error=f"bad_corpus: {exc}", duration_s=time.monotonic() - started)
        meta = {"hits": len(hits), "titles": [p.title for p, _ in hits]}
        return ToolResult(output=_format(query, hits), duration_s=time.monotonic() - started, meta=meta)


def _format(query: str, hits: list[tuple[Passage, float]]) -> str:
    if not hits:
        return f"No passages matched {query!r}."
    return "\n\n".join(f"[{n}] {p.title}\n{p.text}" for n, (p, _) in enumerate(hits, start=1))
