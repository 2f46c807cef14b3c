"""A model store: planner checkpoints as increasing versions in a directory.

Layout::

    <root>/v000000/   config.json, model.safetensors, generation_config.json, tokenizer files, agentflow.json
    <root>/v000001/   ...

``agentflow.json`` is the metadata: ``version``, ``parent`` (the version it was trained from, None for the base),
``created_at_unix``, ``metrics`` (of the step that produced it) and anything the caller adds (``extra``: the
profile, the GRPO settings, the base model...). A version folder is written under a temporary name and renamed
into place, so a reader (or a crash) never sees half a checkpoint; versions are ``latest + 1``, so the sequence has
no gaps or repeats. Every folder loads with ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer``, so the
LLM server, vLLM and the embedded engine read them as they are.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from agentflow.errors import InvalidInput

METADATA = "agentflow.json"
_NAME = re.compile(r"^v(\d{6,})$")


def version_name(version: int) -> str:
    return f"v{version:06d}"


@dataclass(frozen=True)
class Checkpoint:
    version: int
    path: Path
    metadata: dict


class ModelStore:
    """Versioned checkpoints under ``root`` (a local directory)."""

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser()
        self.root.mkdir(parents=True, exist_ok=True)

    def versions(self) -> list[int]:
        found = []
        for child in self.root.iterdir():
            match = _NAME.match(child.name)
            if match and (child / METADATA).is_file():
                found.append(int(match.group(1)))
        return sorted(found)

    def latest(self) -> Checkpoint | None:
        versions = self.versions()
        return self.get(versions[-1]) if versions else None

    def get(self, version: int) -> Checkpoint:
        path = self.root / version_name(version)
        meta = path / METADATA
        if not meta.is_file():
            raise InvalidInput(f"model store {self.root} has no version {version}")
        return Checkpoint(version, path, json.loads(meta.read_text()))

    def save(self, model, tokenizer, *, parent: int | None, metrics: dict | None = None,
             extra: dict | None = None, version: int | None = None,
             write_extra: Callable[[Path], None] | None = None) -> Checkpoint:
        """Write ``model`` (safetensors) and ``tokenizer`` as the next version (or ``version``, which must be the
        next one) and return it. ``write_extra(folder)`` may add files (e.g. optimizer state) before the folder
        becomes visible."""
        latest = self.versions()
        expected = latest[-1] + 1 if latest else 0
        if version is None:
            version = expected
        if version != expected:
            raise InvalidInput(f"model store {self.root}: next version is {expected}, not {version}")
        metadata = {"version": version, "parent": parent, "created_at_unix": round(time.time(), 3),
                    "metrics": metrics or {}, **(extra or {})}
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=f".{version_name(version)}-"))
        try:
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            if write_extra is not None:
                write_extra(tmp)
            (tmp / METADATA).write_text(json.dumps(metadata, indent=1, sort_keys=True, default=_jsonable))
            tmp.rename(self.root / version_name(version))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return Checkpoint(version, self.root / version_name(version), metadata)

    def prune(self, keep_last: int, keep: tuple[int, ...] = (0,)) -> list[int]:
        """Delete all but the newest ``keep_last`` versions (and those in ``keep``); returns what was deleted."""
        versions = self.versions()
        doomed = [v for v in versions[:-keep_last] if v not in keep] if keep_last > 0 else []
        for v in doomed:
            shutil.rmtree(self.root / version_name(v), ignore_errors=True)
        return doomed


def load(checkpoint: Checkpoint | str | Path, *, dtype: str = "float32"):
    """``(model, tokenizer, metadata)`` of a checkpoint folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = checkpoint.path if isinstance(checkpoint, Checkpoint) else Path(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    tokenizer = AutoTokenizer.from_pretrained(path)
    meta = path / METADATA
    return model, tokenizer, (json.loads(meta.read_text()) if meta.is_file() else {})


def _jsonable(value):
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "__dict__"):
        return vars(value)
    return str(value)
