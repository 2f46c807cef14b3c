"""Prompt templates live in agentflow/prompts/*.md as ``string.Template`` text ($name placeholders).

A template with worked examples in agentflow/prompts/examples.json (the frozen modules': command, verify, answer)
gets them first, as earlier user/assistant turns rendered with the same template: a 135M model copies their format
and brevity far better than it follows instructions. The planner's templates have none (it is the trained one)."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib.resources import files
from string import Template
from types import MappingProxyType

from agentflow.domain.parsing import parse_command
from agentflow.llm.base import Message


@lru_cache(maxsize=None)
def template(name: str) -> Template:
    return Template(files("agentflow").joinpath("prompts", f"{name}.md").read_text())


@lru_cache(maxsize=None)
def _examples_text() -> str:
    return files("agentflow").joinpath("prompts", "examples.json").read_text()


@lru_cache(maxsize=None)
def _shots(name: str) -> tuple[dict, ...]:
    return tuple(json.loads(_examples_text()).get(name, []))


@lru_cache(maxsize=None)
def examples(name: str) -> tuple[Message, ...]:
    turns = []
    for shot in _shots(name):
        turns += [{"role": "user", "content": template(name).substitute(**shot["values"]).strip()},
                  {"role": "assistant", "content": shot["reply"]}]
    return tuple(turns)


def example_replies(name: str) -> tuple[str, ...]:
    """The replies of ``name``'s worked examples, as the model sees them."""
    return tuple(shot["reply"] for shot in _shots(name))


def messages(name: str, **values) -> list[Message]:
    """System prompt, the template's worked examples, then the named template filled in; a missing value is a
    programming error (KeyError)."""
    return [
        {"role": "system", "content": template("system").template.strip()},
        *(dict(turn) for turn in examples(name)),
        {"role": "user", "content": template(name).substitute(**values).strip()},
    ]


_EXPRESSION = re.compile(r"\d+(?:\.\d+)?\s*[-+*/]\s*\d+(?:\.\d+)?")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_SHOWN_RESULT = re.compile(r"(?:Result|Answer): (-?\d+(?:\.\d+)?)")


def _spaced(expression: str) -> str:
    return re.sub(r"\s*([-+*/])\s*", r" \1 ", expression)


@lru_cache(maxsize=None)
def example_expressions() -> frozenset[str]:
    """Every calculation the worked examples show (``12 * 34``, ``100 - 7``), spaced alike."""
    return frozenset(_spaced(e) for e in _EXPRESSION.findall(_examples_text()))


@lru_cache(maxsize=None)
def example_commands() -> tuple[str, ...]:
    """The commands of the executor's worked examples, as ``parse_command`` reads a reply."""
    return tuple(map(parse_command, example_replies("command")))


def copies_a_showcase(command: str, showcases: tuple[str, ...], asked: str) -> bool:
    """Whether ``command`` is one of the prompt's example programs word for word while the numbers in it appear
    nowhere in what was ``asked``: a small model copying its showcase (``print(100 - 7)`` for a question about a
    film) instead of doing the task. An example with no numbers ("this question needs no calculation") is no copy."""
    given = set(_NUMBER.findall(asked))
    return any(command.strip() == shown.strip() and not set(_NUMBER.findall(shown)) <= given for shown in showcases)


@lru_cache(maxsize=None)
def example_results() -> MappingProxyType[str, frozenset[str]]:
    """Every result and answer the worked examples show as found (``408``), with the calculations of the examples
    that show it (``12 * 34``): asked that calculation, the value is an answer, not a copy."""
    found: dict[str, set[str]] = {}
    for shot in (shot for name in ("command", "verify", "answer") for shot in _shots(name)):
        text = json.dumps(shot)
        for value in _SHOWN_RESULT.findall(text):
            found.setdefault(value, set()).update(map(_spaced, _EXPRESSION.findall(text)))
    return MappingProxyType({value: frozenset(expressions) for value, expressions in found.items()})


def repeats_an_example(text: str, asked: str) -> str:
    """What of the worked examples ``text`` repeats although ``asked`` (the request and what the module was given)
    never mentions it, '' if nothing: one of their calculations (``12 * 34``), or their result as the whole answer
    (``408``). A small model writing its showcase instead of an answer."""
    given = {_spaced(e) for e in _EXPRESSION.findall(asked)} | set(_NUMBER.findall(asked))
    for expression in map(_spaced, _EXPRESSION.findall(text)):
        if expression in example_expressions() and expression not in given:
            return expression
    numbers = _NUMBER.findall(text)
    value = numbers[0] if len(numbers) == 1 else ""
    shown = example_results().get(value)
    return value if shown is not None and value not in given and not shown & given else ""
