"""Multiple-choice answers: reading the options of a record, and the letter a gold answer or a model output picks.

Options come as ``["A. text", …]`` (MedQA), a ``{"A": "text"}`` mapping, a plain list of texts (lettered A, B, …
in order), or, when the record has none, ``A. text`` / ``(A) text`` lines in its question.
"""

from __future__ import annotations

import re
import string

from agentflow.rewards.text import any_normalised_in, as_text, extract_answer, normalise_answer

_LETTERED = re.compile(r"^\s*[(\[]?([A-Za-z])[)\]]?\s*[.):\]]\s*(.*)$", re.S)
_LINE = re.compile(r"^\s*[(\[]?([A-Z])[)\]]?[.):]\s+(\S.*)$", re.M)
# "B", "(B)", "[b]", "B.", "B)", "B: text", "B. text", "b. text"
_LEADING = re.compile(r"^\s*(?:\(([A-Za-z])\)|\[([A-Za-z])\]|([A-Za-z])\s*[.):\-]|([A-Z])(?=\s*$)|([a-z])\s*$)")
# "the answer is B", "Answer: (C)", "option D", "choice: A"
_PHRASE = re.compile(r"\b(?:answer|option|choice)\b(?:\s+is)?\s*[:\-]?\s*[(\[]?([A-Z])[)\]]?(?![A-Za-z0-9])", re.I)


def options_of(record: dict) -> dict[str, str]:
    """The record's options as an ordered ``{letter: text}`` mapping (upper-case letters); empty when none found.

    Looks at ``options``, then ``choices``; a string option like ``"C. Colorectal cancer"`` keeps its own letter.
    Without either field, lettered lines of ``question`` or ``query`` are used.
    """
    for field in ("options", "choices"):
        raw = record.get(field)
        if isinstance(raw, dict) and raw:
            return {as_text(k).strip().upper(): as_text(v).strip() for k, v in raw.items()}
        if isinstance(raw, (list, tuple)) and raw:
            return _from_list([as_text(v) for v in raw])
    for field in ("question", "query"):
        text = as_text(record.get(field))
        lines = _LINE.findall(text)
        if lines:
            found: dict[str, str] = {}
            for letter, option in lines:
                found.setdefault(letter, option.strip())  # MedQA repeats the list; keep the first
            return found
    return {}


def _from_list(items: list[str]) -> dict[str, str]:
    lettered = [_LETTERED.match(item) for item in items]
    letters = [m.group(1).upper() for m in lettered if m]
    if all(lettered) and len(set(letters)) == len(items):
        return {m.group(1).upper(): m.group(2).strip() for m in lettered}
    return {string.ascii_uppercase[i]: item.strip() for i, item in enumerate(items[:26])}


def gold_letter(answer: object, options: dict[str, str]) -> str | None:
    """The letter the gold ``answer`` names: a letter (``"C"``, ``"(C)"``, ``"C. text"``) or an option's text."""
    return _letter(as_text(answer), options)


def chosen_letter(output: object, options: dict[str, str]) -> str | None:
    """The option a model's output picks, or None when it picks none or is ambiguous.

    The answer part is taken first (``<answer>`` tags, ``\\boxed``, ``Answer:``). Then, in order: the whole text
    equal to one option's text; a leading letter (``B``, ``(B)``, ``B.``, ``B) text``, ``B: text``) that names an
    option (it wins over a text after it that belongs to another option); the last ``answer is B`` / ``option B``
    phrase; a single bracketed ``(B)``; and finally the text of exactly one option appearing in the output (several
    options mentioned: ambiguous, None). When the answer part yields nothing, the whole output is tried the same way,
    without the leading-letter rule.
    """
    letter = _letter(extract_answer(output), options)
    if letter is None:
        letter = _letter(as_text(output), options, leading=False)
    return letter


def _letter(text: str, options: dict[str, str], *, leading: bool = True) -> str | None:
    text = text.strip()
    if not text or not options:
        return None
    norm = normalise_answer(text)
    by_text = [letter for letter, option in options.items() if norm and normalise_answer(option) == norm]
    if len(by_text) == 1:
        return by_text[0]
    match = _LEADING.match(text) if leading else None
    if match:
        letter = next(g for g in match.groups() if g).upper()
        if letter in options:
            return letter
    phrases = [m.group(1).upper() for m in _PHRASE.finditer(text) if m.group(1).upper() in options]
    if phrases:
        return phrases[-1]
    bracketed = {m.upper() for m in re.findall(r"\(([A-Za-z])\)", text) if m.upper() in options}
    if len(bracketed) == 1:
        return bracketed.pop()
    contained = any_normalised_in(text, list(options.values()))
    if len(contained) == 1:
        return list(options)[contained[0]]
    return None


def choice_match(output: object, answer: object, options: dict[str, str]) -> tuple[bool, str | None, str | None]:
    """(correct, chosen letter, gold letter). Without usable options, the texts are compared after normalisation."""
    gold = gold_letter(answer, options)
    if gold is None:
        guess = extract_answer(output)
        return (bool(normalise_answer(guess)) and normalise_answer(guess) == normalise_answer(answer)), None, None
    chosen = chosen_letter(output, options)
    return chosen == gold, chosen, gold
