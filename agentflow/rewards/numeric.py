"""Numeric answers: reading numbers from text (integers, decimals, fractions, thousands separators, ``$``, ``%``,
LaTeX ``\\frac``) and deciding whether two are the same value.

Values are kept as exact ``Fraction``s, so ``0.5``, ``1/2`` and ``\\frac{1}{2}`` compare equal without rounding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from agentflow.rewards.text import as_answers, as_text, extract_answer

REL_TOL = 1e-6  # relative tolerance for values that are not exactly equal (e.g. 0.333333 against 1/3)


@dataclass(frozen=True)
class Number:
    value: Fraction
    percent: bool = False  # written with a trailing "%"
    text: str = ""


# A number: optional sign (not a hyphen between two words or numbers), then either digits grouped by thousands
# separators or plain digits, an optional decimal part and exponent, an optional "/denominator", an optional "%".
_NUMBER = re.compile(
    r"(?<![\w.)\]])(?P<sign>[-+])?(?:\$\s?)?"
    r"(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+|(?=\.\d))(?P<frac>\.\d+)?"
    r"(?:[eE](?P<exp>[-+]?\d+))?"
    r"(?:\s*/\s*(?P<den>\d+(?:\.\d+)?)(?![\d.]))?"
    r"(?P<pct>\s*%)?"
)
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]*)\s*\}\s*\{\s*([^{}]*)\s*\}")
_LATEX_FRAC_SHORT = re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)")
_LATEX_NOISE = re.compile(r"\\(?:left|right|[,;:! ]|mathrm|text|textbf|mathbf|displaystyle)|\{,\}|\^\s*\{?\\circ\}?")


def _clean(text: str) -> str:
    """Plain text for the number regex: unicode minus and LaTeX fractions/percent/spacing rewritten."""
    text = text.replace("\u2212", "-").replace("\u2013", "-").replace("\\%", "%").replace("\\$", "$")
    text = text.replace("\u00a0", " ").replace("\u202f", " ").replace("\u2009", " ")
    for _ in range(3):  # nested \frac{\frac{..}{..}}{..} is rare; a few passes cover it
        text = _LATEX_FRAC.sub(r"(\1)/(\2)", text)
    text = _LATEX_FRAC_SHORT.sub(r"\1/\2", text)
    text = _LATEX_NOISE.sub("", text)
    return re.sub(r"\((-?[\d.,]+)\)/\((-?[\d.,]+)\)", r"\1/\2", text)  # (3)/(4) from \frac{3}{4}


def _to_number(match: re.Match) -> Number | None:
    digits = (match.group("int") or "").replace(",", "") + (match.group("frac") or "")
    if not digits or digits == ".":
        return None
    try:
        value = Fraction(digits)
        if match.group("exp"):
            exponent = int(match.group("exp"))
            if abs(exponent) > 308:
                return None
            value *= Fraction(10) ** exponent
        if match.group("den"):
            den = Fraction(match.group("den"))
            if den == 0:
                return None
            value /= den
    except (ValueError, ZeroDivisionError):
        return None
    if match.group("sign") == "-":
        value = -value
    return Number(value, bool(match.group("pct")), match.group(0).strip())


def numbers_in(text: object) -> list[Number]:
    """Every number in ``text``, in order of appearance.

    ``1,234`` is one number (thousands separators are groups of three digits); ``1,2,3`` is three. A ``-`` counts as
    a sign only when it does not follow a word, digit or bracket, so ``3-4`` reads as 3 and 4. ``$`` is ignored,
    a trailing ``%`` is remembered, ``a/b`` is a fraction and a sentence's final period is not a decimal point.
    """
    return [n for n in (_to_number(m) for m in _NUMBER.finditer(_clean(as_text(text)))) if n is not None]


def parse_number(text: object) -> Number | None:
    """The number ``text`` consists of, when it is one number (surrounding words like 'about' aside), else None."""
    found = numbers_in(text)
    return found[0] if len(found) == 1 else None


def final_number(output: object) -> Number | None:
    """The number a model's output gives as its answer.

    The answer part is taken first (:func:`~agentflow.rewards.text.extract_answer`: ``<answer>`` tags, ``\\boxed``,
    an ``Answer:`` line); within it, the last number wins (*"5 apples and 3 pears make 8"* -> 8). When the answer
    part has no number, the last number of the whole output is used.
    """
    found = numbers_in(extract_answer(output)) or numbers_in(output)
    return found[-1] if found else None


def same_value(a: Number, b: Number, rel_tol: float = REL_TOL) -> bool:
    """Equal values, or within ``rel_tol`` of each other (relative to the larger magnitude, at least 1).

    When exactly one side was written as a percentage, both readings are tried: ``45%`` matches ``45`` and ``0.45``.
    """
    candidates = [(a.value, b.value)]
    if a.percent != b.percent:
        pct, plain = (a, b) if a.percent else (b, a)
        candidates.append((pct.value / 100, plain.value))
    for x, y in candidates:
        if x == y or abs(x - y) <= Fraction(rel_tol) * max(1, abs(x), abs(y)):
            return True
    return False


def numeric_match(prediction: object, answers: object, rel_tol: float = REL_TOL) -> tuple[bool, Number | None]:
    """Whether the final number of ``prediction`` equals any accepted answer's number; also returns that number.

    Accepted answers that contain no number are ignored; an answer text with several numbers uses its last one.
    """
    guess = final_number(prediction)
    if guess is None:
        return False, None
    for answer in as_answers(answers):
        found = numbers_in(answer)
        if found and same_value(guess, found[-1], rel_tol):
            return True, guess
    return False, guess
