"""Tools by name: ``build_tools(["python", "search"], config)`` -> ``{"python": PythonTool, ...}``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from agentflow.errors import InvalidInput
from agentflow.llm.base import Engine
from agentflow.tools.base import Tool
from agentflow.tools.generalist import GeneralistConfig, GeneralistTool
from agentflow.tools.python_tool import PythonTool, PythonToolConfig
from agentflow.tools.search import SearchConfig, SearchTool
from agentflow.tools.web_search import WebSearchConfig, WebSearchTool
from agentflow.tools.wikipedia import WikipediaConfig, WikipediaTool

DEFAULT_TOOLS = ("python", "search", "generalist")


@dataclass(frozen=True)
class ToolsConfig:
    """Settings of every tool; a tool that is not built ignores its part."""

    python: PythonToolConfig = field(default_factory=PythonToolConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    wikipedia: WikipediaConfig = field(default_factory=WikipediaConfig)
    web_search: WebSearchConfig = field(default_factory=WebSearchConfig)
    generalist: GeneralistConfig = field(default_factory=GeneralistConfig)


def _generalist(config: ToolsConfig, engine: Engine | None) -> Tool:
    if engine is None:
        raise InvalidInput("the generalist tool needs an engine: pass engine=... to build_tools or drop 'generalist'")
    return GeneralistTool(engine, config.generalist)


_BUILDERS: dict[str, Callable[[ToolsConfig, Engine | None], Tool]] = {
    "python": lambda c, e: PythonTool(c.python),
    "search": lambda c, e: SearchTool(c.search),
    "wikipedia": lambda c, e: WikipediaTool(c.wikipedia),
    "web_search": lambda c, e: WebSearchTool(c.web_search),
    "generalist": _generalist,
}


def available_tool_names() -> tuple[str, ...]:
    return tuple(sorted(_BUILDERS))


def build_tools(
    names: list[str] | str, config: ToolsConfig | None = None, *, engine: Engine | None = None
) -> dict[str, Tool]:
    """Build the named tools in the given order (duplicates once); unknown names raise InvalidInput."""
    config = config or ToolsConfig()
    if isinstance(names, str):  # "python,search"
        names = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in names if n not in _BUILDERS]
    if unknown:
        raise InvalidInput(f"unknown tool {unknown[0]!r}; known tools: {', '.join(available_tool_names())}")
    return {name: _BUILDERS[name](config, engine) for name in dict.fromkeys(names)}


def select_tools(tools: str | None, *, corpus: Path | None = None,
                 retriever: str | None = None) -> tuple[list[str], ToolsConfig]:
    """(tool names, ToolsConfig) from the command line's ``--tools``, ``--corpus`` and ``--retriever``; checks
    them before any model loads."""
    names = [t.strip() for t in tools.split(",") if t.strip()] if tools else list(DEFAULT_TOOLS)
    unknown = sorted(set(names) - set(available_tool_names()))
    if unknown or not names:
        raise InvalidInput(f"unknown tool(s) {', '.join(unknown) or '(none given)'}; "
                           f"known: {', '.join(available_tool_names())}")
    if corpus is not None and not corpus.is_file():
        raise InvalidInput(f"search corpus {corpus} does not exist")
    if retriever is not None and not retriever.startswith(("http://", "https://")):
        raise InvalidInput(f"--retriever must be an http(s) URL of `agentflow serve retriever`, got {retriever!r}")
    search = {k: v for k, v in {"corpus_path": corpus and str(corpus), "retriever_url": retriever}.items() if v}
    return names, ToolsConfig(search=SearchConfig(**search)) if search else ToolsConfig()
