"""Dense retrieval: a sentence-embedding model loaded from its packaged files (``embedder``), text split into
passages (``passages``), a vector index over a corpus stored as files on any fsspec URI (``index``), and the HTTP
retriever service that the ``search`` tool reads (``server``). docs/retrieval.md."""

from pathlib import Path

#: The corpus that ships with the package: the ``search`` tool's default, indexed densely on first use.
BUNDLED_CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus.jsonl"
