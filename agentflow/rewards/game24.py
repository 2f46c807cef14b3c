"""Game of 24: is an arithmetic expression a valid solution for four given numbers?

The expression is never executed. It is parsed with ``ast`` and walked by a tiny evaluator that knows only number
literals, the binary operators ``+ - * /`` and (implicitly) parentheses; anything else — names, calls, attributes,
subscripts, ``**``, unary signs, strings — makes the answer invalid. Arithmetic is exact (``Fraction``).
"""

from __future__ import annotations

import ast
import operator
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from agentflow.rewards.text import as_text, extract_answer

TARGET = 24
TOLERANCE = 1e-6
MAX_EXPRESSION_CHARS = 200  # a solution for four numbers is short; longer input is not parsed at all

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_SYMBOLS = {"×": "*", "✕": "*", "⋅": "*", "·": "*", "∗": "*", "÷": "/", "∕": "/", "−": "-", "–": "-", "—": "-",
            "[": "(", "]": ")", "{": "(", "}": ")"}
_LATEX = [(r"\\times", "*"), (r"\\cdot", "*"), (r"\\div", "/"), (r"\\left", ""), (r"\\right", ""),
          (r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"((\1)/(\2))")]


@dataclass(frozen=True)
class Check:
    valid: bool
    reason: str  # why not, or "= 24"
    expression: str  # the expression that was checked (after normalisation)


class _Invalid(Exception):
    pass


def numbers_of(record: dict) -> list[int | float] | None:
    """The four numbers of a Game-of-24 record: its ``numbers`` or ``question`` list, else ``[a, b, c, d]`` in the
    query text ("Using the numbers [1, 1, 1, 8], …"). None when not found."""
    for field in ("numbers", "question"):
        value = record.get(field)
        if isinstance(value, (list, tuple)) and value and all(_is_number(v) for v in value):
            return list(value)
        if isinstance(value, str):
            found = _bracketed_numbers(value)
            if found:
                return found
    return _bracketed_numbers(as_text(record.get("query")))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bracketed_numbers(text: str) -> list[int | float] | None:
    match = re.search(r"\[\s*(-?\d+(?:\.\d+)?(?:\s*,\s*-?\d+(?:\.\d+)?)+)\s*\]", text)
    if not match:
        return None
    return [float(x) if "." in x else int(x) for x in re.split(r"\s*,\s*", match.group(1).strip())]


def normalise_expression(text: str) -> str:
    """Unicode and LaTeX operators to ``+ - * /``, brackets to parentheses, ``x`` between operands to ``*``,
    implicit products like ``(1+2)(3+5)`` or ``3(8)`` made explicit, and a ``= 24`` side dropped (the side with the
    most numbers is kept)."""
    for pattern, repl in _LATEX:
        text = re.sub(pattern, repl, text)
    text = "".join(_SYMBOLS.get(ch, ch) for ch in text).replace("$", "").replace("\\", "")
    text = re.sub(r"(?<=[\d)\s])[xX](?=[\s\d(])", "*", text)
    text = text.replace("**", "^")  # keep powers out: an explicit marker the parser rejects below
    sides = [s for s in text.split("=") if s.strip()]
    if len(sides) > 1:
        text = max(sides, key=lambda side: len(re.findall(r"\d+(?:\.\d+)?", side)))
    text = text.strip().rstrip(".").strip()
    text = re.sub(r"\)\s*\(", ")*(", text)
    text = re.sub(r"(?<=\d)\s*\(", "*(", text)
    return re.sub(r"\)\s*(?=\d)", ")*", text)


def check_24(expression: object, numbers: list[int | float], target: float = TARGET) -> Check:
    """Whether ``expression`` uses each of ``numbers`` exactly once (as a multiset), only ``+ - * /`` and
    parentheses, and evaluates to ``target`` within 1e-6. Division by zero, a foreign or repeated number, a missing
    number, or any other syntax is simply invalid (``Check.valid`` is False with the reason)."""
    text = normalise_expression(as_text(expression))
    if not text:
        return Check(False, "empty expression", text)
    if len(text) > MAX_EXPRESSION_CHARS:
        return Check(False, f"expression longer than {MAX_EXPRESSION_CHARS} characters", text[:MAX_EXPRESSION_CHARS])
    try:
        tree = ast.parse(text, mode="eval")
        used: list[Fraction] = []
        value = _evaluate(tree.body, used)
    except _Invalid as e:
        return Check(False, str(e), text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return Check(False, "not an arithmetic expression", text)
    given = Counter(Fraction(n).limit_denominator(10**9) for n in numbers)
    got = Counter(used)
    if got != given:
        missing, extra = given - got, got - given
        parts = [f"uses {_show(n)} more often than given" if n in given else f"uses {_show(n)}, which is not given"
                 for n in sorted(extra)]
        if missing:
            parts.append("does not use " + ", ".join(_show(n) for n in sorted(missing.elements())))
        return Check(False, "; ".join(parts), text)
    if abs(value - Fraction(target)) > Fraction(TOLERANCE):
        return Check(False, f"evaluates to {_show(value)}, not {target}", text)
    return Check(True, f"= {target}", text)


def _evaluate(node: ast.AST, used: list[Fraction]) -> Fraction:
    if isinstance(node, ast.Constant) and _is_number(node.value):
        value = Fraction(node.value)
        used.append(value)
        return value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate(node.left, used), _evaluate(node.right, used)
        if isinstance(node.op, ast.Div) and right == 0:
            raise _Invalid("division by zero")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        raise _Invalid(f"operator {type(node.op).__name__} is not allowed (only + - * / between numbers)")
    raise _Invalid(f"{type(node).__name__} is not allowed (only numbers, + - * / and parentheses)")


def _show(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"


def score_24(output: object, numbers: list[int | float]) -> Check:
    """:func:`check_24` on a model's output: its answer part (``<answer>``, ``\\boxed``, ``Answer:``, else the whole
    output); when that spans several lines, its last line with a digit."""
    candidate = extract_answer(output)
    if "\n" in candidate or not re.search(r"\d", candidate):
        lines = [line for line in candidate.splitlines() if re.search(r"\d", line)]
        candidate = lines[-1] if lines else candidate
    return check_24(candidate, numbers)
