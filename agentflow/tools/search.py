"""The ``search`` tool: BM25 (``bm25s``) over a local JSONL corpus, one ``{"title", "text"}`` object per line, or,
when ``retriever_url`` (else ``$AGENTFLOW_RETRIEVER_URL``, read when the tool is built) is set, the dense retriever
service at that URL (`agentflow serve retriever`, docs/retrieval.md) with the typed errors of the HTTP tools
(``unavailable``, ``timeout``, ``bad_response``).

The default corpus ships with the package (``agentflow/data/corpus.jsonl``): short general-knowledge passages
plus a few about the fictional island nation of Veloria that only this corpus knows. An index is built once per
corpus file (path, size and modification time) on first use and shared by every tool instance.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import bm25s

from agentflow.config import setting
from agentflow.errors import InvalidInput, ToolFailure
from agentflow.retrieval import BUNDLED_CORPUS
from agentflow.retrieval.passages import corpus_record
from agentflow.tools.base import ToolResult, ToolSpec
from agentflow.tools.http_tools import HttpSearchTool, HttpToolConfig

RETRIEVER_ENV = "AGENTFLOW_RETRIEVER_URL"
RETRIEVER_TOKEN_ENV = "AGENTFLOW_RETRIEVER_TOKEN"  # the bearer token the retriever requires, if any
DEFAULT_CORPUS = BUNDLED_CORPUS


@dataclass(frozen=True)
class SearchConfig:
    corpus_path: str = setting(str(DEFAULT_CORPUS), "JSONL file with title and text per line")
    top_k: int = setting(3, "passages returned per query")
    retriever_url: str = setting("", f"dense retriever service (http://host:port/search); empty: ${RETRIEVER_ENV}, "
                                     "and when that is empty too, BM25 over corpus_path")
    retriever_timeout_s: float = setting(10.0, "limit of one retriever call in seconds (retry included)")

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise InvalidInput(f"search tool setting top_k must be at least 1, got {self.top_k!r}")
        if self.retriever_timeout_s <= 0:
            raise InvalidInput(f"search tool setting retriever_timeout_s must be positive, "
                               f"got {self.retriever_timeout_s!r}")


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
        title, text, _url, _id = corpus_record(path, number, line)
    except InvalidInput as exc:
        raise ToolFailure(str(exc)) from None
    return Passage(title, text)


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


def retriever_endpoint(url: str) -> str:
    """The retriever's search URL: a bare ``http://host:port`` gets ``/search``."""
    url = url.strip()
    if url and url.split("://", 1)[-1].rstrip("/").count("/") == 0:
        return url.rstrip("/") + "/search"
    return url


class SearchTool:
    """Search over a local corpus of short passages: BM25 in-process, or a dense retriever service over HTTP."""

    def __init__(self, config: SearchConfig | None = None):
        self.config = config or SearchConfig()
        self.corpus_path = Path(self.config.corpus_path).expanduser().resolve()
        self.retriever_url = retriever_endpoint(self.config.retriever_url or os.environ.get(RETRIEVER_ENV, ""))
        self.backend = "dense" if self.retriever_url else "bm25"
        # the BM25 card stays word for word what the prompts' worked examples show (prompts/examples.json)
        limits = (f"only what the retriever's corpus contains; returns at most {self.config.top_k} passages; backend: "
                  "dense retriever" if self.retriever_url else
                  f"only what the local corpus contains; returns at most {self.config.top_k} passages")
        self.spec = ToolSpec(
            name="search",
            description="Searches a local encyclopedia of short passages and returns the best matches with titles.",
            input_format="a few keywords or a short question, e.g. 'capital of Veloria'",
            examples=("highest mountain Nepal", "Veloria founding year"),
            limitations=limits,
        )
        self._http = HttpSearchTool(self.spec, RETRIEVER_ENV, HttpToolConfig(
            endpoint=self.retriever_url, timeout_s=self.config.retriever_timeout_s,
            top_k=self.config.top_k), token=os.environ.get(RETRIEVER_TOKEN_ENV, "")) if self.retriever_url else None

    def run(self, command: str, timeout: float) -> ToolResult:
        started = time.monotonic()
        query = command.strip()
        if not query:
            return ToolResult(error="invalid_input: empty search query")
        if self._http is not None:
            result = self._http.run(query, timeout)
            result.meta = {**result.meta, "backend": "dense"}
            return result
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
