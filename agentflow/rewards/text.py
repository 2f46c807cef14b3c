"""Text answers: pulling the answer out of a model's output, normalising it, exact match and token F1.

All functions are pure and never raise on odd input: ``None`` and non-strings are read as their ``str()``.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from typing import Iterable

# Characters read as a word break rather than deleted: "Saint-Denis" and "Saint Denis" normalise alike.
_BREAKS = re.compile(r"[\s\-\u2010-\u2015\u2212/_|]+")
# Deleted: punctuation, currency and modifier symbols. Kept: math and other symbols (+, <, arrows), which can be
# the whole difference between two options ("↓ ↑ ↓" against "↓ ↑ ↑").
_DELETED = {"Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sc", "Sk"}
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_TAG = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.I | re.S)
_LABEL = re.compile(r"(?:^|\n)[ \t]*[*#]*[ \t]*(?:final[ \t]+)?answer[ \t]*[*]*[ \t]*:[ \t]*[*]*(.*)", re.I | re.S)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_PHRASE = re.compile(r"\banswer\s+(?:is|was|would\s+be)\s*:?[ \t]*", re.I)


def as_text(value: object) -> str:
    """``value`` as a string: ``None`` is empty, anything else its ``str()``."""
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def as_answers(value: object) -> list[str]:
    """The accepted answers of a record's ``answer`` field: a string is one answer, a list (or tuple) several.

    Empty entries are dropped; numbers become their text (``33`` -> ``"33"``).
    """
    items = value if isinstance(value, (list, tuple)) else [value]
    return [text for text in (as_text(v).strip() for v in items) if text]


def boxed_contents(text: str) -> list[str]:
    """Every ``\\boxed{...}`` argument in ``text`` (nested braces balanced), in order."""
    found = []
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                found.append(text[start:i])
                break
    return found


def extract_answer(output: object) -> str:
    """The answer part of a model's output.

    In order of preference: the last ``<answer>…</answer>`` (the benchmark prompts ask for it; an unclosed tag runs to
    the end), the last ``\\boxed{…}``, the text after the last ``Answer:`` label (up to the end of that line), the
    rest of the sentence after the last "answer is" / "answer was" (``The answer is: 1999.`` -> ``1999``), else the
    whole output. Surrounding whitespace, quotes and markdown emphasis are stripped.
    """
    text = as_text(output)
    tags = [t for t in _TAG.findall(text) if t.strip()]
    if tags:
        return _strip(tags[-1])
    boxed = [b for b in boxed_contents(text) if b.strip()]
    if boxed:
        return _strip(boxed[-1])
    labels = list(_LABEL.finditer(text))
    for match in reversed(labels):
        line = match.group(1).strip().split("\n", 1)[0]
        if line.strip(" *"):
            return _strip(line)
    for match in reversed(list(_PHRASE.finditer(text))):
        sentence = re.split(r"\.(?:\s|$)|\n", text[match.end():], maxsplit=1)[0]
        if _strip(sentence):
            return _strip(sentence)
    return _strip(text)


def _strip(text: str) -> str:
    return text.strip().strip("*").strip().strip("\"'`").strip()


def normalise_answer(text: object) -> str:
    """A canonical form for comparing short answers.

    Unicode is decomposed (NFKD) and accents dropped (``Gülçiçek`` -> ``gulcicek``), text is case-folded, dashes,
    slashes and underscores become spaces, other punctuation and currency signs are deleted (``U.S.`` -> ``us``,
    ``$138,535`` -> ``138535``; math symbols and arrows stay), the articles *a*, *an*, *the* are removed, and
    whitespace is collapsed.
    """
    text = unicodedata.normalize("NFKD", as_text(text))
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).casefold()
    text = _BREAKS.sub(" ", text)
    text = "".join(ch for ch in text if unicodedata.category(ch) not in _DELETED)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: object, answers: object) -> bool:
    """Whether the normalised prediction equals the normalised form of any accepted answer (a string or a list).

    The prediction is used as given; call :func:`extract_answer` first on a raw model output.
    """
    guess = normalise_answer(prediction)
    return any(guess == normalise_answer(a) for a in as_answers(answers))


_POLAR = {"yes", "no", "noanswer"}


def token_f1(prediction: object, answers: object) -> float:
    """Token-level F1 between the normalised prediction and the best-matching accepted answer, in [0, 1].

    Tokens are the words of :func:`normalise_answer`; overlap counts repeated words at most as often as both sides
    have them. When either side is a bare *yes*/*no* the score is 1 only for the same word (a yes/no question is
    not half right). No answers or an empty prediction score 0.
    """
    guess = normalise_answer(prediction)
    return max((_f1(guess, normalise_answer(a)) for a in as_answers(answers)), default=0.0)


def _f1(guess: str, gold: str) -> float:
    if (guess in _POLAR or gold in _POLAR) and guess != gold:
        return 0.0
    ours, theirs = guess.split(), gold.split()
    common = sum((Counter(ours) & Counter(theirs)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(ours), common / len(theirs)
    return 2 * precision * recall / (precision + recall)


def any_normalised_in(prediction: object, candidates: Iterable[str]) -> list[int]:
    """Indexes of ``candidates`` whose normalised text occurs as whole words inside the normalised prediction."""
    guess = f" {normalise_answer(prediction)} "
    hits = []
    for i, candidate in enumerate(candidates):
        norm = normalise_answer(candidate)
        if norm and f" {norm} " in guess:
            hits.append(i)
    return hits
