"""``score(kind, prediction, record)``: one reward per answer, from the rule registered for the benchmark's kind.

A reward is a dict shaped like ``agentflow.v1.Reward``: ``{"value": float, "source": "rule" | "judge",
"detail": str}``, so it can go straight into a trajectory record's ``rewards``. Every rule here gives 0.0 or 1.0.

Kinds:

* ``search`` — correct when the answer part of the prediction exactly matches an accepted answer after
  normalisation, **or** its token F1 with the best accepted answer is at least ``F1_THRESHOLD`` (0.8). The F1 route
  accepts reorderings and small additions ("4 March 1797" for "March 4, 1797"; "Kurt Weill" for "Kurt Julian Weill")
  but not a long answer that merely contains the right one, which would reward listing candidates. A yes/no answer
  must be the same word.
* ``math`` — the final number of the prediction equals an accepted number (exact fractions; 1e-6 relative
  tolerance otherwise; ``45%`` matches 45 and 0.45). Gold answers without a number fall back to exact match.
* ``mcq`` — the option the prediction picks (letter or option text) is the gold option.
* ``gameof24`` — the expression in the prediction uses the record's four numbers once each with ``+ - * /`` and
  reaches 24; checked by safe evaluation, never by string match.

With a :class:`~agentflow.rewards.judge.Judge`, answers the rule marks wrong in ``search``, ``math`` and ``mcq`` are
put to the judge (it can rescue a paraphrase; it never overturns a rule's *correct*). Game of 24 is never judged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from agentflow.errors import InvalidInput
from agentflow.rewards.choice import choice_match, options_of
from agentflow.rewards.game24 import numbers_of, score_24
from agentflow.rewards.judge import Judge, judge_reward
from agentflow.rewards.numeric import numbers_in, numeric_match
from agentflow.rewards.text import as_answers, as_text, exact_match, extract_answer, token_f1

F1_THRESHOLD = 0.8
DETAIL_CHARS = 80  # how much of the extracted prediction a detail quotes

Scorer = Callable[[str, dict], dict]


@dataclass(frozen=True)
class Kind:
    name: str
    scorer: Scorer
    judged: bool  # whether a judge may rescue answers the rule marks wrong
    check: Callable[[dict], str]  # "" when a record has what scoring needs, else why not


KINDS: dict[str, Kind] = {}


def register(name: str, scorer: Scorer, *, judged: bool = True, check: Callable[[dict], str] | None = None) -> None:
    """Add (or replace) the rule for ``name``."""
    KINDS[name] = Kind(name, scorer, judged, check or _needs_answer)


def kind_names() -> list[str]:
    return sorted(KINDS)


def get_kind(name: str) -> Kind:
    try:
        return KINDS[name]
    except KeyError:
        raise InvalidInput(f"unknown kind {name!r}; known: {', '.join(kind_names())}") from None


def reward(value: float, detail: str, source: str = "rule") -> dict:
    return {"value": float(value), "source": source, "detail": detail}


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS] + "…")


def score_search(prediction: str, record: dict) -> dict:
    answers = as_answers(record.get("answer"))
    guess = extract_answer(prediction)
    em = exact_match(guess, answers)
    f1 = token_f1(guess, answers)
    ok = em or f1 >= F1_THRESHOLD - 1e-9
    return reward(ok, f"search: exact={int(em)} f1={f1:.3f} (threshold {F1_THRESHOLD}) answer={_quote(guess)}")


def score_math(prediction: str, record: dict) -> dict:
    answers = as_answers(record.get("answer"))
    if not any(numbers_in(a) for a in answers):
        guess = extract_answer(prediction)
        ok = exact_match(guess, answers)
        return reward(ok, f"math: non-numeric gold, exact={int(ok)} answer={_quote(guess)}")
    ok, number = numeric_match(prediction, answers)
    shown = "none" if number is None else number.text
    return reward(ok, f"math: final number {shown} {'equals' if ok else 'does not equal'} "
                      f"{' / '.join(answers)[:DETAIL_CHARS]}")


def score_mcq(prediction: str, record: dict) -> dict:
    options = options_of(record)
    ok, chosen, gold = choice_match(prediction, record.get("answer"), options)
    if gold is None:
        return reward(ok, f"mcq: gold not among {len(options)} options; text match={int(ok)}")
    return reward(ok, f"mcq: chose {chosen or 'nothing'}, gold {gold}")


def score_gameof24(prediction: str, record: dict) -> dict:
    numbers = numbers_of(record)
    if not numbers:
        return reward(0.0, "gameof24: the record gives no numbers")
    check = score_24(prediction, numbers)
    return reward(check.valid, f"gameof24: {_quote(check.expression)} {check.reason}")


def _needs_answer(record: dict) -> str:
    return "" if as_answers(record.get("answer")) else "has no answer"


def _needs_numbers(record: dict) -> str:
    numbers = numbers_of(record)
    if not numbers:
        return "has no numbers (expected a 'question' or 'numbers' list, or [a, b, c, d] in the query)"
    return ""


register("search", score_search)
register("math", score_math)
register("mcq", score_mcq)
register("gameof24", score_gameof24, judged=False, check=_needs_numbers)


def question_of(record: dict) -> str:
    """The question text a judge sees: ``question`` when it is text, else ``query``."""
    question = record.get("question")
    return question if isinstance(question, str) and question.strip() else as_text(record.get("query"))


def score(kind: str, prediction: object, record: dict, *, judge: Judge | None = None) -> dict:
    """The reward for ``prediction`` (a model's raw output or final answer) on benchmark ``record``.

    Raises InvalidInput for an unknown kind. Never raises on a malformed prediction: it simply scores 0.
    """
    spec = get_kind(kind)
    text = as_text(prediction)
    result = spec.scorer(text, record)
    if judge is not None and spec.judged and result["value"] < 1.0 and text.strip():
        result = judge_reward(judge, question_of(record), extract_answer(text), record.get("answer"), result)
    return result


def ground_truth_text(kind: str, record: dict) -> str:
    """The gold answer as one string, for a trajectory record's ``ground_truth``: a single answer as is, several as
    a JSON list, and for Game of 24 the numbers as a JSON list (any valid expression is right)."""
    if kind == "gameof24":
        return json.dumps(numbers_of(record) or [])
    answer = record.get("answer")
    if isinstance(answer, (list, tuple)):
        answers = as_answers(answer)
        return answers[0] if len(answers) == 1 else json.dumps(answers, ensure_ascii=False)
    return as_text(answer)
