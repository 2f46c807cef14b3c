"""Reading a benchmark file: a JSON list of records, each with a ``query`` and what its kind needs to be scored."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from agentflow.errors import InvalidInput
from agentflow.rewards import get_kind


@dataclass(frozen=True)
class Item:
    index: int  # position in the file
    pid: str  # the record's pid (or its index), unique within the file: a repeated pid gets "#2", "#3", …
    record: dict  # the benchmark record as read

    @property
    def query(self) -> str:
        return self.record["query"]


def load_items(path: str | Path, kind: str, limit: int | None = None) -> tuple[list[Item], int]:
    """The first ``limit`` items of ``path`` (all when None) and the number of records in the file.

    Raises InvalidInput, naming the file and the record, when the file is missing, unreadable, not UTF-8, not JSON,
    not a non-empty list of objects, or a record lacks a ``query`` text or what ``kind`` needs to be scored.
    """
    spec = get_kind(kind)  # an unknown kind fails before the file is read
    if limit is not None and limit < 1:
        raise InvalidInput(f"--limit must be at least 1, got {limit}")
    path = Path(path)
    if not path.exists():
        raise InvalidInput(f"data file {path} does not exist")
    if path.is_dir():
        raise InvalidInput(f"data file {path} is a directory, not a JSON file")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise InvalidInput(f"cannot read {path}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InvalidInput(f"{path} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidInput(f"{path} is not JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                           "expected a JSON list of records") from None
    if not isinstance(data, list):
        raise InvalidInput(f"{path} holds a JSON {_json_type(data)}, expected a list of records")
    if not data:
        raise InvalidInput(f"{path} holds no records")
    items, seen = [], {}
    for index, record in enumerate(data):
        if not isinstance(record, dict):
            raise InvalidInput(f"{path}: record {index} is a JSON {_json_type(record)}, expected an object")
        pid = str(record["pid"]) if record.get("pid") not in (None, "") else str(index)
        where = f"{path}: record {index} (pid {pid})"
        query = record.get("query")
        if not isinstance(query, str) or not query.strip():
            raise InvalidInput(f"{where} has no 'query' text")
        why = spec.check(record)
        if why:
            raise InvalidInput(f"{where} {why}, which kind '{kind}' needs")
        seen[pid] = seen.get(pid, 0) + 1
        items.append(Item(index, pid if seen[pid] == 1 else f"{pid}#{seen[pid]}", record))
    return (items if limit is None else items[:limit]), len(data)


def data_hash(items: Iterable[Item]) -> str:
    """The sha256 (hex) of what the items are: their pids, queries and answers in order, as canonical JSON. Two runs
    with the same hash scored the same questions against the same answers (``eval compare``, ``eval --resume``)."""
    content = [[item.pid, item.query, item.record.get("answer")] for item in items]
    text = json.dumps(content, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _json_type(value: object) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")
