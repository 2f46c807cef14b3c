"""Prompt templates live in agentflow/prompts/*.md as ``string.Template`` text ($name placeholders).

A template with worked examples in agentflow/prompts/examples.json (the frozen modules': command, verify, answer)
gets them first, as earlier user/assistant turns rendered with the same template: a 135M model copies their format
and brevity far better than it follows instructions. The planner's templates have none (it is the trained one)."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib.resources import files
from string import Template

from agentflow.llm.base import Message


@lru_cache(maxsize=None)
def template(name: str) -> Template:
    return Template(files("agentflow").joinpath("prompts", f"{name}.md").read_text())


@lru_cache(maxsize=None)
def _shots(name: str) -> tuple[dict, ...]:
    return tuple(json.loads(files("agentflow").joinpath("prompts", "examples.json").read_text()).get(name, []))


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
