"""A model store: planner checkpoints as increasing versions under a root, a local directory or any fsspec URI.

Layout::

    <root>/v000000/   config.json, model.safetensors, generation_config.json, tokenizer files, agentflow.json
    <root>/v000001/   ...

``agentflow.json`` is the metadata: ``version``, ``parent`` (the version it was trained from, None for the base),
``created_at_unix``, ``metrics`` (of the step that produced it) and anything the caller adds (``extra``: the
profile, the GRPO settings, the base model...). A trainer may add files: ``resume/`` (its optimizer state) and
``feedback-ledger.json`` (``agentflow train``'s ratings). A folder is a version only once it has
``agentflow.json``, so a reader (or a crash) never sees half a checkpoint; versions are ``latest + 1``, so the
sequence has no gaps or repeats. Every folder loads with ``AutoModelForCausalLM.from_pretrained`` /
``AutoTokenizer``, so the LLM server, vLLM and the embedded engine read them as they are.

A local root (a path or file://...) gets each version written under a temporary name and renamed into place. A
remote root (s3://bucket/models, or any fsspec URI) has no atomic rename: a version is written into the local cache
(``agentflow.storage``), uploaded file by file, ``agentflow.json`` last (the commit marker), and a folder left
without it by a crash is overwritten by the next save. Reading a remote version downloads it into the cache.
"""

from __future__ import annotations

import json
import posixpath
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

from agentflow import storage
from agentflow.errors import InvalidInput
from agentflow.versions import CHECKPOINT_METADATA as METADATA
from agentflow.versions import version_name

_NAME = re.compile(r"^v(\d{6,})$")  # version_name's folders


@dataclass(frozen=True)
class Checkpoint:
    version: int
    uri: str  # the version's folder: a remote URI, or the absolute local path
    metadata: dict
    fetch: Callable[[], Path] = field(repr=False, compare=False)  # the local folder (downloads a remote one)

    @cached_property
    def path(self) -> Path:
        """The folder on this machine; a remote version is downloaded into the cache on first use."""
        return self.fetch()


class ModelStore:
    """Versioned checkpoints under ``root``: a local directory, file://..., or an fsspec URI (s3://bucket/models)."""

    def __init__(self, root: str | Path):
        local = storage.local_path(root)
        if local is not None:  # a local store is its own cache: versions are written (and pruned) in place
            self.root, self.fs, self.cache = local, None, local
            self.root.mkdir(parents=True, exist_ok=True)
        else:
            self.fs, path = storage.filesystem(str(root))
            self.root = path.rstrip("/")  # the path inside ``fs``
            self.cache = storage.cache_for(self.fs, self.root)

    @property
    def uri(self) -> str:
        return str(self.root) if self.fs is None else self.fs.unstrip_protocol(self.root)

    def versions(self) -> list[int]:
        return sorted(int(m.group(1)) for m in map(_NAME.match, self._committed()) if m)

    def latest(self) -> Checkpoint | None:
        versions = self.versions()
        return self.get(versions[-1]) if versions else None

    def get(self, version: int) -> Checkpoint:
        metadata = self._metadata(version)
        if metadata is None:
            raise InvalidInput(f"model store {self.uri} has no version {version}")
        if self.fs is None:
            path = self.root / version_name(version)
            return Checkpoint(version, str(path.resolve()), metadata, lambda: path)
        uri = self._uri(version)
        return Checkpoint(version, uri, metadata, lambda: storage.local_copy(uri, marker=METADATA))

    def save(self, model, tokenizer, *, parent: int | None, metrics: dict | None = None,
             extra: dict | None = None, version: int | None = None,
             write_extra: Callable[[Path], None] | None = None, state_dict: dict | None = None,
             files: dict[str, bytes] | None = None) -> Checkpoint:
        """Write ``model`` (safetensors, through its ``save_pretrained``: a peft model writes its adapter) and
        ``tokenizer`` as the next version (or ``version``, which must be the next one) and return it.
        ``state_dict`` replaces the model's own weights (gathered shards, merged adapters). ``write_extra(folder)``
        may add files (e.g. optimizer state) before the folder becomes visible; ``files`` are written into it by
        name (e.g. the feedback ledger)."""
        latest = self.versions()
        expected = latest[-1] + 1 if latest else 0
        if version is None:
            version = expected
        if version != expected:
            raise InvalidInput(f"model store {self.uri}: next version is {expected}, not {version}")
        metadata = {"version": version, "parent": parent, "created_at_unix": round(time.time(), 3),
                    "metrics": metrics or {}, **(extra or {})}
        self.cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.cache, prefix=f".{version_name(version)}-"))
        folder = self.cache / version_name(version)
        try:
            model.save_pretrained(tmp, safe_serialization=True,
                                  **({"state_dict": state_dict} if state_dict is not None else {}))
            tokenizer.save_pretrained(tmp)
            if write_extra is not None:
                write_extra(tmp)
            for name, data in (files or {}).items():
                (tmp / name).write_bytes(data)
            (tmp / METADATA).write_text(json.dumps(metadata, indent=1, sort_keys=True, default=_jsonable))
            if self.fs is None:
                tmp.rename(folder)
            else:
                storage.upload(tmp, self.fs, self._path(version), last=METADATA)
                storage.replace_folder(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        uri = str(folder.resolve()) if self.fs is None else self._uri(version)
        return Checkpoint(version, uri, metadata, lambda: folder)

    def download(self, version: int, target: Path) -> None:
        """Copy a committed version of a remote store into the folder ``target`` (renamed into place whole)."""
        if self.fs is None:
            raise InvalidInput(f"model store {self.uri} is a local folder: read its versions where they are")
        if self._metadata(version) is None:
            raise InvalidInput(f"model store {self.uri} has no version {version}")
        storage.download(self.fs, self._path(version), target)

    def prune(self, keep_last: int, keep: tuple[int, ...] = (0,)) -> list[int]:
        """Delete all but the newest ``keep_last`` versions (and those in ``keep``); returns what was deleted."""
        versions = self.versions()
        doomed = [v for v in versions[:-keep_last] if v not in keep] if keep_last > 0 else []
        for v in doomed:
            if self.fs is not None:
                self.fs.rm(posixpath.join(self._path(v), METADATA))  # no longer a version, then gone
                self.fs.rm(self._path(v), recursive=True)
            shutil.rmtree(self.cache / version_name(v), ignore_errors=True)
        return doomed

    def drop_folder(self, name: str, keep_newest: int) -> list[int]:
        """Delete the subfolder ``name`` (a trainer's ``resume/`` state) of every version but the newest
        ``keep_newest``, in the store and in the cache; returns the versions that had it. The versions stay."""
        dropped = []
        for v in self.versions()[:-keep_newest] if keep_newest > 0 else []:
            cached, remote = self.cache / version_name(v) / name, posixpath.join(self._path(v), name)
            had = cached.is_dir() if self.fs is None else self.fs.exists(remote)  # a local store is its cache
            if had and self.fs is not None:
                self.fs.rm(remote, recursive=True)
            shutil.rmtree(cached, ignore_errors=True)
            if had:
                dropped.append(v)
        return dropped

    def _committed(self) -> list[str]:
        """Names of the folders under the root that have their metadata."""
        if self.fs is None:
            return [c.name for c in self.root.iterdir() if (c / METADATA).is_file()]
        # every cached listing, not only the root's: a version folder listed mid-upload (no metadata yet) would stay
        # uncommitted for good (s3fs drops a path's parents from its cache, never its children)
        self.fs.invalidate_cache()
        return [posixpath.basename(posixpath.dirname(p)) for p in self.fs.glob(f"{self.root}/v*/{METADATA}")]

    def _metadata(self, version: int) -> dict | None:
        if self.fs is None:
            meta = self.root / version_name(version) / METADATA
            return json.loads(meta.read_text()) if meta.is_file() else None
        try:
            return json.loads(self.fs.cat_file(posixpath.join(self._path(version), METADATA)))
        except FileNotFoundError:
            return None

    def _path(self, version: int) -> str:
        return posixpath.join(self.root, version_name(version))

    def _uri(self, version: int) -> str:
        return self.fs.unstrip_protocol(self._path(version))


def load(checkpoint: Checkpoint | str | Path, *, dtype: str = "float32"):
    """``(model, tokenizer, metadata)`` of a checkpoint folder."""
    from transformers import AutoTokenizer

    from agentflow.llm.models import load_causal_lm

    path = checkpoint.path if isinstance(checkpoint, Checkpoint) else Path(checkpoint)
    model = load_causal_lm(path, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(path)
    meta = path / METADATA
    return model, tokenizer, (json.loads(meta.read_text()) if meta.is_file() else {})


def _jsonable(value):
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "__dict__"):
        return vars(value)
    return str(value)
