"""A dense passage index over a JSONL corpus, stored as three files in a folder on any fsspec URI:

* ``index.faiss``: the faiss index (``faiss.serialize_index``), inner product over unit vectors (= cosine);
* ``passages.jsonl``: one ``{"title", "text", "url"}`` per vector, in vector order (``"id"`` when the corpus had one);
* ``meta.json``: model, dim, count, kind, corpus sha256, build seconds, format version; written last, so a folder
  with a ``meta.json`` is a complete index.

``IndexFlatIP`` (exact) up to ``FLAT_LIMIT`` vectors, ``IndexHNSWFlat`` (approximate, M=32, efSearch 64) above, or as
``kind`` says. ``build_index`` writes one, ``DenseIndex.load`` reads and checks one, ``bundled_index`` builds the
bundled corpus's once into the cache and reuses it."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from agentflow.errors import InvalidInput
from agentflow.storage import cache_dir
from agentflow.retrieval.passages import Passage, corpus_record, split_passages
from agentflow.storage import filesystem, local_copy, local_path, replace_folder, upload

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
FILES = ("index.faiss", "passages.jsonl", "meta.json")
KINDS = ("auto", "flat", "hnsw")
FLAT_LIMIT = 50_000  # auto: exact search up to this many vectors
HNSW_M, HNSW_EF_SEARCH = 32, 64
EMBED_BATCH = 256  # passages per encode call (and per progress report)


# --- reading a corpus ---------------------------------------------------------------------------------------------

def read_corpus(uri: str | Path) -> tuple[list[Passage], list, str]:
    """``(passages, ids, sha256 of the file)``; long texts are split with ``split_passages``. ``InvalidInput``
    names the file and line of the first bad line."""
    data = _read_bytes(str(uri), "corpus file")
    passages, ids = [], []
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        if line.strip():
            title, text, url, doc = corpus_record(uri, number, line)
            for p in split_passages(title, text, url=url):
                passages.append(p)
                ids.append(doc)
    if not passages:
        raise InvalidInput(f"corpus file {uri} has no passages")
    return passages, ids, hashlib.sha256(data).hexdigest()


def _read_bytes(uri: str, what: str) -> bytes:
    fs, path = filesystem(uri)
    try:
        with fs.open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, IsADirectoryError):
        raise InvalidInput(f"{what} not found: {uri}") from None


# --- building -----------------------------------------------------------------------------------------------------

def embed_passages(passages: list[Passage], embedder, progress=None) -> np.ndarray:
    """Unit vectors of ``"title. text"`` for every passage, ``EMBED_BATCH`` at a time; ``progress(done, total)``
    after each batch."""
    total = len(passages)
    out = np.zeros((total, embedder.dim), dtype=np.float32)
    for start in range(0, total, EMBED_BATCH):
        batch = passages[start:start + EMBED_BATCH]
        out[start:start + len(batch)] = embedder.encode([f"{p.title}. {p.text}" for p in batch])
        if progress:
            progress(start + len(batch), total)
    return out


def resolve_kind(kind: str, count: int) -> str:
    if kind not in KINDS:
        raise InvalidInput(f"index kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return kind if kind != "auto" else ("flat" if count <= FLAT_LIMIT else "hnsw")


def make_faiss_index(vectors: np.ndarray, kind: str = "auto"):
    """A faiss inner-product index holding ``vectors`` (float32, unit rows)."""
    import faiss

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    dim = vectors.shape[1]
    if resolve_kind(kind, len(vectors)) == "flat":
        index = faiss.IndexFlatIP(dim)
    else:
        index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = HNSW_EF_SEARCH
    index.add(vectors)
    return index


def build_index(corpus_path_or_uri: str | Path, out_uri: str | Path, *, embedder=None, kind: str = "auto",
                progress=None) -> dict:
    """Read, split, embed and index a JSONL corpus and write the index folder to ``out_uri``; returns its meta."""
    resolve_kind(kind, 0)  # a bad kind fails before the (slow) embedding
    started = time.perf_counter()
    passages, ids, sha = read_corpus(corpus_path_or_uri)
    if embedder is None:
        from agentflow.retrieval.embedder import shared_embedder

        embedder = shared_embedder()
    vectors = embed_passages(passages, embedder, progress)
    embed_s = time.perf_counter() - started
    index = make_faiss_index(vectors, kind)
    meta = {"format_version": FORMAT_VERSION, "model": embedder.name, "dim": int(embedder.dim),
            "count": len(passages), "kind": resolve_kind(kind, len(passages)), "corpus_sha256": sha,
            "corpus": str(corpus_path_or_uri), "embed_seconds": round(embed_s, 3),
            "build_seconds": round(time.perf_counter() - started, 3)}
    write_index(out_uri, index, passages, meta, ids)
    return meta


def write_index(out_uri: str | Path, index, passages: list[Passage], meta: dict, ids: list | None = None) -> None:
    """Write the three files into a temporary folder, then move (local) or upload (remote) it to ``out_uri``,
    ``meta.json`` last. A target that exists and is not an index is refused rather than replaced."""
    import faiss

    out_uri = str(out_uri)
    _refuse_foreign_target(out_uri)
    local = local_path(out_uri)
    parent = local.parent if local is not None else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{local.name}-" if local else "agentflow-index-"))
    try:
        (tmp / "index.faiss").write_bytes(faiss.serialize_index(index).tobytes())
        with (tmp / "passages.jsonl").open("w", encoding="utf-8") as f:
            for n, p in enumerate(passages):
                row = {"title": p.title, "text": p.text, "url": p.url}
                if ids and ids[n] is not None:
                    row["id"] = ids[n]
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        if local is not None:
            replace_folder(tmp, local)
        else:
            fs, path = filesystem(out_uri)
            upload(tmp, fs, path, last="meta.json")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _refuse_foreign_target(out_uri: str) -> None:
    fs, path = filesystem(out_uri)
    if fs.isfile(path):
        raise InvalidInput(f"index output {out_uri} is a file, not a folder")
    if fs.isdir(path) and fs.ls(path) and not fs.exists(f"{path.rstrip('/')}/meta.json"):
        raise InvalidInput(f"index output {out_uri} is a non-empty folder that holds no index: refusing to replace "
                           "it (choose an empty or new folder)")


# --- loading and searching ----------------------------------------------------------------------------------------

class DenseIndex:
    """Passages and their faiss index; ``search`` and ``search_many`` are safe to call from many threads."""

    def __init__(self, index, passages: list[Passage], meta: dict, embedder=None, uri: str = ""):
        self.index, self.passages, self.meta, self.uri = index, passages, meta, uri
        self._embedder = embedder
        self._embedder_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.passages)

    @classmethod
    def load(cls, uri: str | Path, *, embedder=None) -> "DenseIndex":
        """Read and check an index folder (a remote one is downloaded into the cache once)."""
        folder = local_copy(str(uri), marker="meta.json")
        meta = _read_meta(folder, uri)
        index = _read_faiss(folder, uri)
        passages = _read_passages(folder, uri)
        _check_consistent(meta, index, passages, uri)
        return cls(index, passages, meta, embedder, str(uri))

    @property
    def embedder(self):
        with self._embedder_lock:
            if self._embedder is None:
                from agentflow.retrieval.embedder import shared_embedder

                self._embedder = shared_embedder()
            if self._embedder.dim != self.meta["dim"]:
                raise InvalidInput(f"index {self.uri} has {self.meta['dim']}-dimensional vectors but the embedder "
                                   f"gives {self._embedder.dim}")
            return self._embedder

    def search(self, query: str, k: int) -> list[tuple[float, Passage]]:
        """The ``k`` best passages for ``query``, best first, as ``(cosine, passage)``."""
        return self.search_many([query], k)[0]

    def search_many(self, queries: list[str], k: int) -> list[list[tuple[float, Passage]]]:
        """``search`` for several queries, embedded and searched as one batch."""
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise InvalidInput(f"k must be a positive integer, got {k!r}")
        if not queries or not all(isinstance(q, str) and q.strip() for q in queries):
            raise InvalidInput("every query must be a non-empty string")
        return self.search_vectors(self.embedder.encode([q.strip() for q in queries]), k)

    def search_vectors(self, vectors: np.ndarray, k: int) -> list[list[tuple[float, Passage]]]:
        scores, ids = self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), min(k, len(self)))
        return [[(float(s), self.passages[i]) for s, i in zip(row_s, row_i) if i >= 0]
                for row_s, row_i in zip(scores, ids)]


def _read_meta(folder: Path, uri) -> dict:
    path = folder / "meta.json"
    if not path.is_file():
        raise InvalidInput(f"{uri} is not a dense index: meta.json is missing (build one with `agentflow index build`)")
    try:
        meta = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput(f"{uri}: meta.json is not valid JSON") from None
    if not isinstance(meta, dict):
        raise InvalidInput(f"{uri}: meta.json is not a JSON object")
    if meta.get("format_version") != FORMAT_VERSION:
        raise InvalidInput(f"{uri}: meta.json has format_version {meta.get('format_version')!r}; this version of "
                           f"agentflow reads {FORMAT_VERSION}")
    for key in ("model", "dim", "count", "kind"):
        if key not in meta:
            raise InvalidInput(f"{uri}: meta.json lacks {key!r}")
    return meta


def _read_faiss(folder: Path, uri):
    import faiss

    path = folder / "index.faiss"
    if not path.is_file():
        raise InvalidInput(f"{uri}: index.faiss is missing")
    try:
        index = faiss.deserialize_index(np.frombuffer(path.read_bytes(), dtype=np.uint8))
    except Exception as exc:  # faiss raises RuntimeError with its C++ message
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise InvalidInput(f"{uri}: index.faiss is corrupt or not a faiss index ({first})") from None
    if isinstance(index, faiss.IndexHNSW):
        index.hnsw.efSearch = HNSW_EF_SEARCH
    return index


def _read_passages(folder: Path, uri) -> list[Passage]:
    path = folder / "passages.jsonl"
    if not path.is_file():
        raise InvalidInput(f"{uri}: passages.jsonl is missing")
    passages = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            try:
                row = json.loads(line)
                passages.append(Passage(row["title"], row["text"], row.get("url", "")))
            except (ValueError, KeyError, TypeError, AttributeError):
                raise InvalidInput(f"{uri}: passages.jsonl line {number} is not a passage") from None
    return passages


def _check_consistent(meta: dict, index, passages: list[Passage], uri) -> None:
    if index.d != meta["dim"]:
        raise InvalidInput(f"{uri}: index.faiss has dimension {index.d}, meta.json says {meta['dim']}")
    if not index.ntotal == len(passages) == meta["count"]:
        raise InvalidInput(f"{uri}: counts disagree: index.faiss holds {index.ntotal} vectors, passages.jsonl "
                           f"{len(passages)} passages, meta.json says {meta['count']}")


# --- the bundled corpus -------------------------------------------------------------------------------------------

_BUNDLED: dict[str, DenseIndex] = {}
_BUNDLED_LOCK = threading.Lock()


def bundled_index(*, embedder=None) -> DenseIndex:
    """The index of the bundled corpus (``agentflow/data/corpus.jsonl``): built on first use into
    ``<cache>/indexes/<corpus sha256, 16 hex>``, then loaded from there; one per process."""
    from agentflow.retrieval import BUNDLED_CORPUS as DEFAULT_CORPUS

    sha = hashlib.sha256(DEFAULT_CORPUS.read_bytes()).hexdigest()
    with _BUNDLED_LOCK:
        if sha not in _BUNDLED:
            folder = cache_dir() / "indexes" / sha[:16]
            if not (folder / "meta.json").is_file():
                log.info("building the dense index of %s into %s (once)", DEFAULT_CORPUS, folder)
                build_index(DEFAULT_CORPUS, folder, embedder=embedder)
            _BUNDLED[sha] = DenseIndex.load(folder, embedder=embedder)
        return _BUNDLED[sha]
