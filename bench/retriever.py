"""The dense retriever: index build time, size on disk, and the HTTP service's throughput and latency; prints JSON
(progress on stderr, the last line the summary).

  .venv/bin/python bench/retriever.py [--repeats 3] [--embed-sample 2000] [--synthetic 100000] [--clients 4]
                                      [--requests 200] [--batch 32]

Two corpora:

* ``bundled``: agentflow/data/corpus.jsonl, embedded with all-MiniLM-L6-v2 for real (``build_index``); queries are
  the recall questions of ``agentflow.eval.recall``;
* ``synthetic``: ``--synthetic`` passages of seeded random sentences from a word list. Embedding them all with MiniLM
  on a small CPU takes long, so the embedding **rate** is measured on the first ``--embed-sample`` of them (and the
  full embedding time extrapolated from it), while the index is built from **random unit vectors** of dimension 384
  in place of their embeddings (``vectors: random_unit``): build time, size and search latency do not depend on
  what the vectors mean, recall does (it is not measured here). Flat and HNSW are both built; the service serves
  the ``auto`` kind (HNSW above 50,000 passages). Service queries are still embedded by MiniLM, as in production.

Service numbers: single ``GET /search`` from ``--clients`` threads in a closed loop (``--requests`` in all), and
``POST /search`` batches of ``--batch`` queries from one client; queries/s, p50 and p99 latency of a request. Each
figure is the median over ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agentflow.retrieval.index import DenseIndex, build_index, make_faiss_index, resolve_kind, write_index  # noqa: E402
from agentflow.retrieval.passages import Passage  # noqa: E402
from agentflow.eval.recall import recall_pairs  # noqa: E402
from agentflow.retrieval.server import make_server, serve_in_background, server_url  # noqa: E402
from agentflow.tools.search import DEFAULT_CORPUS  # noqa: E402

WORDS = ("river mountain city harbour island festival council bridge forest market engine river valley lantern "
         "orchard railway castle museum library garden treaty colony glacier canyon desert volcano lighthouse "
         "merchant sailor farmer painter poet king queen admiral bishop scholar built founded crossed painted "
         "signed discovered measured traded ancient northern eastern famous quiet rapid golden silver wooden "
         "century winter harvest storm trade copper salt amber cedar wool grain").split()


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def synthetic_passages(n: int, seed: int = 0) -> list[Passage]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))).capitalize() + "."
                     for _ in range(rng.randint(2, 4))]
        out.append(Passage(f"Synthetic {i}", " ".join(sentences)))
    return out


def random_unit(n: int, dim: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, dim), dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def drive_single(url: str, queries: list[str], clients: int, requests: int) -> dict:
    """Closed-loop GETs from ``clients`` threads: queries/s and request latency."""
    latencies, lock, counter = [], threading.Lock(), iter(range(requests))

    def client() -> None:
        with httpx.Client(timeout=60) as http:
            while True:
                with lock:
                    n = next(counter, None)
                if n is None:
                    return
                t = time.perf_counter()
                http.get(url, params={"q": queries[n % len(queries)], "limit": 3}).raise_for_status()
                with lock:
                    latencies.append(time.perf_counter() - t)

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(lambda _: client(), range(clients)))
    wall = time.perf_counter() - started
    return {"qps": requests / wall, "p50_ms": 1000 * percentile(latencies, 50),
            "p99_ms": 1000 * percentile(latencies, 99)}


def drive_batch(url: str, queries: list[str], batch: int, requests: int) -> dict:
    """Sequential POSTs of ``batch`` queries: queries/s and latency of one batch request."""
    latencies = []
    with httpx.Client(timeout=120) as http:
        for n in range(max(1, requests // batch)):
            chunk = [queries[(n * batch + i) % len(queries)] for i in range(batch)]
            t = time.perf_counter()
            http.post(url, json={"queries": chunk, "limit": 3}).raise_for_status()
            latencies.append(time.perf_counter() - t)
    return {"qps": batch * len(latencies) / sum(latencies), "p50_ms": 1000 * percentile(latencies, 50),
            "p99_ms": 1000 * percentile(latencies, 99)}


def serve_numbers(index, queries: list[str], args) -> dict:
    server = make_server(index, "127.0.0.1", 0)
    serve_in_background(server)
    url = server_url(server)
    try:
        httpx.get(url, params={"q": queries[0]}).raise_for_status()  # warm up
        return {"single": drive_single(url, queries, args.clients, args.requests),
                "batch": drive_batch(url, queries, args.batch, args.requests)}
    finally:
        server.shutdown()
        server.server_close()


def vector_search_ms(index, queries: np.ndarray) -> float:
    """Median milliseconds of one faiss search of one query vector (embedding excluded)."""
    times = []
    for q in queries:
        t = time.perf_counter()
        index.search(q[None, :], 3)
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def bench_bundled(embedder, queries: list[str], tmp: Path, args) -> dict:
    out = tmp / "bundled"
    meta = build_index(DEFAULT_CORPUS, out, embedder=embedder)
    index = DenseIndex.load(out, embedder=embedder)
    return {"passages": meta["count"], "kind": meta["kind"], "embed_s": meta["embed_seconds"],
            "index_s": round(meta["build_seconds"] - meta["embed_seconds"], 4), "disk_bytes": folder_bytes(out),
            "service": serve_numbers(index, queries, args)}


def bench_synthetic(embedder, queries: list[str], tmp: Path, args) -> dict:
    passages = synthetic_passages(args.synthetic)
    sample = passages[:args.embed_sample]
    t, cpu = time.perf_counter(), time.process_time()
    embedder.encode([f"{p.title}. {p.text}" for p in sample])
    rate = len(sample) / (time.perf_counter() - t)
    cpu_rate = len(sample) / (time.process_time() - cpu)  # steadier than wall time on a shared machine
    vectors = random_unit(len(passages), embedder.dim)
    query_vectors = random_unit(200, embedder.dim, seed=1)
    built = {}
    for kind in ("flat", "hnsw"):
        t = time.perf_counter()
        built[kind] = make_faiss_index(vectors, kind)
        built[kind + "_s"] = time.perf_counter() - t
    kind = resolve_kind("auto", len(passages))
    meta = {"format_version": 1, "model": embedder.name, "dim": embedder.dim, "count": len(passages), "kind": kind,
            "corpus_sha256": "", "vectors": "random_unit"}
    out = tmp / "synthetic"
    write_index(out, built[kind], passages, meta)
    served = DenseIndex.load(out, embedder=embedder)
    return {"passages": len(passages), "vectors": "random_unit (not embeddings; see the docstring)",
            "embed_sample": len(sample), "embed_passages_per_s": rate,
            "embed_passages_per_cpu_s": cpu_rate,
            "embed_s_estimated_full": len(passages) / rate,
            "flat": {"index_s": built["flat_s"], "vector_search_ms": vector_search_ms(built["flat"], query_vectors)},
            "hnsw": {"index_s": built["hnsw_s"], "vector_search_ms": vector_search_ms(built["hnsw"], query_vectors)},
            "served_kind": kind, "disk_bytes": folder_bytes(out),
            "disk_bytes_index_faiss": (out / "index.faiss").stat().st_size,
            "service": serve_numbers(served, queries, args)}


def median_of(runs: list[dict]):
    """The element-wise median of a list of equally shaped dicts of numbers (other values from the first run)."""
    first = runs[0]
    if isinstance(first, dict):
        return {k: median_of([r[k] for r in runs]) for k in first}
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        value = statistics.median(runs)
        return round(value, 4) if isinstance(value, float) else value
    return first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each measurement; the median is reported")
    parser.add_argument("--embed-sample", type=int, default=2000,
                        help="synthetic passages actually embedded, for the rate")
    parser.add_argument("--synthetic", type=int, default=100_000,
                        help="size of the synthetic index (random unit vectors)")
    parser.add_argument("--clients", type=int, default=4, help="client threads sending single queries")
    parser.add_argument("--requests", type=int, default=200, help="requests per service measurement")
    parser.add_argument("--batch", type=int, default=32, help="queries per POST in the batched measurement")
    args = parser.parse_args()

    from agentflow.retrieval.embedder import shared_embedder

    t = time.perf_counter()
    embedder = shared_embedder()
    load_s = time.perf_counter() - t
    queries = [q for q, _ in recall_pairs(DEFAULT_CORPUS)]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            run = {"bundled": bench_bundled(embedder, queries, Path(tmp) / str(r), args),
                   "synthetic": bench_synthetic(embedder, queries, Path(tmp) / str(r), args)}
            log(f"repeat {r}: {json.dumps(median_of([run]))}")
            runs.append(run)
    print(json.dumps({"bench": "retriever", "model": embedder.name, "model_load_s": round(load_s, 1),
                      "repeats": args.repeats, "clients": args.clients, "requests": args.requests,
                      "batch": args.batch, **median_of(runs)}))


if __name__ == "__main__":
    main()
