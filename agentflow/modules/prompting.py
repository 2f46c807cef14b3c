"""Prompt templates live in agentflow/prompts/*.md as ``string.Template`` text ($name placeholders)."""

from __future__ import annotations

from functools import lru_cache
from importlib.resources import files
from string import Template

from agentflow.llm.base import Message


@lru_cache(maxsize=None)
def template(name: str) -> Template:
    return Template(files("agentflow").joinpath("prompts", f"{name}.md").read_text())


def messages(name: str, **values) -> list[Message]:
    """System prompt plus the named template filled in; a missing value is a programming error (KeyError)."""
    return [
        {"role": "system", "content": template("system").template.strip()},
        {"role": "user", "content": template(name).substitute(**values).strip()},
    ]
