"""Text into passages for retrieval: windows of about ``words`` words that overlap by ``overlap`` words, cut at
paragraph breaks where they fall, each kept with its title and URL."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from agentflow.errors import InvalidInput


@dataclass(frozen=True)
class Passage:
    title: str
    text: str
    url: str = ""


def split_passages(title: str, text: str, *, url: str = "", words: int = 100, overlap: int = 20) -> list[Passage]:
    """``text`` as passages; an empty text gives none."""
    if words < 1 or not 0 <= overlap < words:
        raise InvalidInput(f"passages need words >= 1 and 0 <= overlap < words, got {words} and {overlap}")
    passages = []
    for paragraph in re.split(r"\n\s*\n", text):
        tokens = paragraph.split()
        start = 0
        while start < len(tokens):
            window = tokens[start:start + words]
            passages.append(Passage(title, " ".join(window), url))
            if start + words >= len(tokens):
                break
            start += words - overlap
    return _merge_short(passages, words)


def _merge_short(passages: list[Passage], words: int) -> list[Passage]:
    """Join runs of short paragraphs (under a third of a window) into one passage, up to a window."""
    merged: list[Passage] = []
    for p in passages:
        last = merged[-1] if merged else None
        if (last is not None and len(p.text.split()) < words // 3
                and len(last.text.split()) + len(p.text.split()) <= words):
            merged[-1] = Passage(last.title, f"{last.text} {p.text}", last.url)
        else:
            merged.append(p)
    return merged


def corpus_record(uri, number: int, line: str) -> tuple[str, str, str, object]:
    """Line ``number`` of a JSONL corpus, checked: ``(title, text, url, id)``; ``InvalidInput`` names the file and
    line."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{uri} line {number}: not valid JSON ({exc.msg})") from None
    if not isinstance(item, dict):
        raise InvalidInput(f"{uri} line {number}: expected an object with 'title' and 'text'")
    for key in ("title", "text"):
        if not isinstance(item.get(key), str) or not item[key].strip():
            raise InvalidInput(f"{uri} line {number}: missing or empty '{key}'")
    url = item.get("url", "")
    if not isinstance(url, str):
        raise InvalidInput(f"{uri} line {number}: 'url' must be a string")
    doc = item.get("id")
    if doc is not None and not isinstance(doc, (str, int)):
        raise InvalidInput(f"{uri} line {number}: 'id' must be a string or an integer")
    return item["title"].strip(), item["text"].strip(), url.strip(), doc
