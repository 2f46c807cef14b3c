"""Passages of fetched documents ranked against a query by sentence-embedding cosine similarity."""

from __future__ import annotations

from itertools import chain, zip_longest
from typing import Protocol

import numpy as np

from agentflow.retrieval.passages import Passage, split_passages

MAX_PASSAGES = 200  # embedded per call: about 2-4 s of MiniLM on two CPU cores


class Encoder(Protocol):
    def encode(self, texts: list[str]) -> np.ndarray: ...


def top_passages(query: str, documents: list[tuple[str, str, str]], k: int, *, embedder: Encoder,
                 max_passages: int = MAX_PASSAGES) -> list[tuple[float, Passage]]:
    """The ``k`` passages of ``documents`` (title, text, url) closest to ``query``, best first, with their cosine
    scores. Past ``max_passages`` passages, each document keeps its first ones, in turn (no document crowds out
    the others)."""
    passages = _interleaved([split_passages(title, text, url=url) for title, text, url in documents])[:max_passages]
    if not passages or k < 1:
        return []
    vectors = embedder.encode([query] + [f"{p.title}. {p.text}" for p in passages])
    scores = vectors[1:] @ vectors[0]
    order = np.argsort(-scores, kind="stable")[:k]
    return [(float(scores[i]), passages[i]) for i in order]


def _interleaved(groups: list[list[Passage]]) -> list[Passage]:
    """First passage of each document, then the second of each, and so on."""
    return [p for p in chain.from_iterable(zip_longest(*groups)) if p is not None]
