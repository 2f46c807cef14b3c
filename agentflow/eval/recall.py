"""Recall@k of a retriever on (question, gold title) pairs built mechanically from a corpus: no LLM, no labels.

How a question is made from a passage (``question_from``), for every sentence of the passage:

1. lower-case the sentence and keep its words (letters, digits, apostrophes);
2. drop stop words (a fixed list of ~120 function words) and numbers (numbers are what a question usually asks for);
3. drop every word of the passage's title (so a title match alone cannot find it);
4. drop the last remaining content word (in an English statement the object: "... the capital is Port *Isen*",
   "... fuses hydrogen into *helium*"), the part a question leaves out;
5. keep at most ``max_words`` of the rest, in order, and phrase it as ``"what <words>?"``.

A sentence with fewer than two words left gives no question. The result shares words with its passage but is not a
copy of it: no title, no numbers, no function words, no final word, word forms left as they are. That still favours a
lexical retriever (BM25 sees exact words), so the comparison is conservative for a dense one. Every step is
deterministic; the pairs depend only on the corpus."""

from __future__ import annotations

import re
from pathlib import Path

STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below between both but
by can could did do does doing down during each few for from further had has have having he her here hers him his how
i if in into is it its itself just me more most my no nor not now of off on once only or other our out over own same she
should so some such than that the their them then there these they this those through to too under until up very was
we were what when where which while who whom why will with would you your one two three four five six seven eight nine
ten many much among around near often called known made later within without every whose either per
""".split())
_WORD = re.compile(r"[a-z0-9']+")
_SENTENCE = re.compile(r"(?<=[.!?;])\s+")


def _words(text: str) -> list[str]:
    return [w.strip("'") for w in _WORD.findall(text.lower()) if w.strip("'")]


def question_from(sentence: str, title: str, max_words: int = 6) -> str | None:
    """The question made from one sentence of a passage titled ``title`` (steps in the module docstring)."""
    title_words = set(_words(title))
    content = [w for w in _words(sentence)
               if w not in STOPWORDS and not any(c.isdigit() for c in w) and w not in title_words]
    content = content[:-1][:max_words]
    return f"what {' '.join(content)}?" if len(content) >= 2 else None


def recall_pairs(corpus, max_words: int = 6) -> list[tuple[str, str]]:
    """``(question, gold title)`` for every sentence of every passage that yields a question. ``corpus``: passages
    (anything with ``title`` and ``text``) or a JSONL path. Duplicate questions are kept once (the first)."""
    if isinstance(corpus, (str, Path)):
        from agentflow.tools.search import load_corpus

        corpus = load_corpus(Path(corpus))
    pairs, seen = [], set()
    for p in corpus:
        for sentence in _SENTENCE.split(p.text):
            question = question_from(sentence, p.title, max_words)
            if question and question not in seen:
                seen.add(question)
                pairs.append((question, p.title))
    return pairs


def recall_at_k(search_fn, pairs: list[tuple[str, str]], k: int = 3) -> float:
    """The share of pairs whose gold title is among the first ``k`` titles ``search_fn(question, k)`` returns."""
    if not pairs:
        raise ValueError("recall needs at least one pair")
    hits = sum(gold in list(search_fn(q, k))[:k] for q, gold in pairs)
    return hits / len(pairs)


def dense_titles(index):
    """A ``search_fn`` over a ``DenseIndex``: the titles of its hits (all questions are embedded in one batch on
    the first call of a new question list, through ``prefetch``)."""
    cache: dict[tuple[str, int], list[str]] = {}

    def search(question: str, k: int) -> list[str]:
        if (question, k) not in cache:
            cache[(question, k)] = [p.title for _, p in index.search(question, k)]
        return cache[(question, k)]

    def prefetch(questions: list[str], k: int) -> None:
        for start in range(0, len(questions), 64):
            chunk = questions[start:start + 64]
            for q, hits in zip(chunk, index.search_many(chunk, k)):
                cache[(q, k)] = [p.title for _, p in hits]

    search.prefetch = prefetch
    return search


def bm25_titles(corpus_path: str | Path):
    """A ``search_fn`` over the ``search`` tool's BM25 index of ``corpus_path``."""
    from agentflow.tools.search import _index_for

    index = _index_for(Path(corpus_path).expanduser().resolve())
    return lambda question, k: [p.title for p, _ in index.search(question, k)]


def compare(index, corpus_path: str | Path, k: int = 3, max_words: int = 6) -> dict:
    """Recall@k of the dense index and of BM25 on the pairs of ``corpus_path``."""
    pairs = recall_pairs(corpus_path, max_words)
    dense = dense_titles(index)
    dense.prefetch([q for q, _ in pairs], k)
    return {"pairs": len(pairs), "k": k, "max_words": max_words,
            "dense": round(recall_at_k(dense, pairs, k), 3),
            "bm25": round(recall_at_k(bm25_titles(corpus_path), pairs, k), 3)}
