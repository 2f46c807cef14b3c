"""What every `agentflow` parser shares: a parser that refuses in one line, and the ``type=`` checkers of its flags.

A checker takes the flag's text and returns its value, or raises ``ArgumentTypeError`` saying what the flag needs;
argparse puts the flag in front: ``agentflow run: error: argument --temperature: must be a finite number >= 0 (got
-1)``. Checkers look only at the text (and at files they are given): nothing is loaded or started. This module imports
nothing else of agentflow, so every parser module may use it (pyproject.toml, [tool.importlinter]).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import urlsplit

Check = Callable[[str], object]


class ArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose refusal is one line on stderr, ``PROG: error: MESSAGE``, with exit status 2 (no
    usage block; ``--help`` is unchanged). ``add_subparsers`` makes its subparsers of the same class."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def _refuse(need: str, given: str):
    raise argparse.ArgumentTypeError(f"must be {need} (got {given if given.strip() else repr(given)})")


def _span(lo, hi, lo_open: bool = False, hi_open: bool = False) -> str:
    if lo is not None and hi is not None:
        return f" in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    if lo is not None:
        return f" {'>' if lo_open else '>='} {lo:g}"
    return f" {'<' if hi_open else '<='} {hi:g}" if hi is not None else ""


def _inside(value, lo, hi, lo_open: bool, hi_open: bool) -> bool:
    return ((lo is None or (value > lo if lo_open else value >= lo))
            and (hi is None or (value < hi if hi_open else value <= hi)))


def integer(lo: int | None = None, hi: int | None = None, *, note: str = "") -> Check:
    """A whole number in [lo, hi] (either end may be open-ended); ``note`` says what a special value means."""
    need = f"an integer{_span(lo, hi)}{note}"

    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            _refuse(need, text)
        if not _inside(value, lo, hi, False, False):
            _refuse(need, text)
        return value

    return check


def number(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False,
           note: str = "") -> Check:
    """A finite number between lo and hi (``lo_open``/``hi_open``: the bound itself is excluded)."""
    need = f"a finite number{_span(lo, hi, lo_open, hi_open)}{note}"

    def check(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            _refuse(need, text)
        if not (math.isfinite(value) and _inside(value, lo, hi, lo_open, hi_open)):
            _refuse(need, text)
        return value

    return check


def port(*, off: bool = False) -> Check:
    """A TCP port: 1-65535, or 0 for any free port (and -1 for off, with ``off``)."""
    return integer(-1 if off else 0, 65535, note=f" ({'-1: off, ' if off else ''}0: any free port)")


def boolean(text: str) -> bool:
    """true or false (also 1/0, yes/no), as the environment's AGENTFLOW_* values."""
    if text.strip().lower() not in ("1", "0", "true", "false", "yes", "no"):
        _refuse("true or false", text)
    return text.strip().lower() in ("1", "true", "yes")


def text(max_chars: int | None = None, *, empty: bool = False) -> Check:
    """Text at most ``max_chars`` long, and not empty nor only spaces (unless ``empty``)."""

    def check(value: str) -> str:
        if not (empty or value.strip()):
            _refuse("non-empty text", value)
        if max_chars is not None and len(value) > max_chars:
            raise argparse.ArgumentTypeError(f"must be at most {max_chars} characters (got {len(value)})")
        return value

    return check


def matching(pattern: str, need: str) -> Check:
    """Text the whole of which matches ``pattern``; ``need`` says in words what that is."""
    regex = re.compile(pattern)

    def check(value: str) -> str:
        if not regex.fullmatch(value):
            _refuse(need, repr(value))
        return value

    return check


def names(known: Callable[[], Iterable[str]] | Iterable[str] | None = None, *, one: bool = False) -> Check:
    """Comma-separated names (at least one; with ``one``: exactly one), each of ``known`` if given (a function is
    called only when the flag is given, so that what it imports is imported only then). Returns them comma-joined."""

    def check(value: str) -> str:
        given = [part.strip() for part in value.split(",") if part.strip()]
        if not given or (one and len(given) > 1):
            _refuse("one name" if one else "one or more comma-separated names", repr(value))
        allowed = tuple((known() if callable(known) else known) or ())
        unknown = [name for name in given if allowed and name not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown: {', '.join(unknown)} (known: {', '.join(allowed)})")
        return ",".join(given)

    return check


def _host_port(value: str) -> bool:
    host, _, digits = value.strip().rpartition(":")
    return bool(host.strip("[]")) and "/" not in host and digits.isdigit() and 1 <= int(digits) <= 65535


def address(value: str) -> str:
    """HOST:PORT (a gRPC target such as 127.0.0.1:50051; also unix:PATH)."""
    if not (_host_port(value) or value.startswith("unix:")):
        _refuse("HOST:PORT with a port 1-65535", repr(value))
    return value.strip()


def addresses(value: str) -> str:
    """Comma-separated HOST:PORT (Kafka bootstrap servers)."""
    parts = [part.strip() for part in value.split(",") if part.strip()]
    if not parts or not all(_host_port(part) for part in parts):
        _refuse("comma-separated HOST:PORT", repr(value))
    return ",".join(parts)


def url(value: str) -> str:
    """An http:// or https:// URL with a host (and a valid port, if one is given)."""
    try:
        parts = urlsplit(value.strip())
        parts.port  # noqa: B018 - a port that is not a number, or out of range, raises ValueError
    except ValueError:
        parts = None
    if not (parts and parts.scheme in ("http", "https") and parts.hostname):
        _refuse("an http(s):// URL", repr(value))
    return value.strip()


def urls(value: str) -> str:
    """Comma-separated http(s):// URLs (at least one)."""
    parts = [part.strip() for part in value.split(",") if part.strip()]
    if not parts:
        _refuse("one or more comma-separated http(s):// URLs", repr(value))
    return ",".join(url(part) for part in parts)


def _readable(path: Path) -> Path:
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such file: {path}")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{path} is not a file")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {path}: permission denied")
    return path


def readable_file(value: str) -> Path:
    return _readable(Path(value).expanduser())


def jsonl_file(value: str) -> Path:
    """A readable file whose first non-blank line is a JSON object (a corpus: one passage per line)."""
    path = readable_file(value)
    try:
        with path.open(encoding="utf-8") as f:
            first = next((line for line in f if line.strip()), "")
        ok = isinstance(json.loads(first), dict)
    except (OSError, UnicodeDecodeError, ValueError):
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"{path} is not JSONL: its first line is not a JSON object")
    return path


def existing_path(value: str) -> Path:
    """A file or folder that exists."""
    path = Path(value).expanduser()
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such file or folder: {path}")
    return path


def out_folder(value: str) -> Path:
    """A folder to write: one that exists, or one that can be made (not a file; its nearest existing parent a
    writable folder)."""
    path = Path(value).expanduser()
    if not value.strip():
        _refuse("a folder", repr(value))
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a file, not a folder")
    parent = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write in {parent}")
    return path


def folder(value: str) -> Path:
    """A folder that exists."""
    path = Path(value).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"no such folder: {path}")
    return path


def uri_or(check: Check, *, words: tuple[str, ...] = ()) -> Check:
    """A URI with a scheme (s3://..., checked where it is opened), one of ``words`` (e.g. smollm2), else a local
    path that passes ``check``; the text is returned as given."""

    def either(value: str) -> str:
        if "://" not in value and value not in words:
            check(value)
        return value

    return either


def optional(check: Check) -> Check:
    """``check``, or the word itself for none (or null, or nothing): kept as text, so that a flag given as
    ``none`` is not taken for a flag not given (None); the settings read it as None (``agentflow.config``)."""

    def check_or_none(value: str):
        word = value.strip().lower()
        return word if word in ("", "none", "null") else check(value)

    return check_or_none


def argument_group(parser: argparse.ArgumentParser, title: str, description: str | None = None):
    """``parser``'s argument group titled ``title``, made on first use (``--help`` lists the groups in that order)."""
    for group in parser._action_groups:  # argparse has no public look-up of its groups
        if group.title == title:
            return group
    return parser.add_argument_group(title, description)
