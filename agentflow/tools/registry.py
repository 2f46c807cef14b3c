"""Tools by name: ``build_tools(["python", "search"], config)`` -> ``{"python": PythonTool, ...}``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from agentflow.errors import InvalidInput
from agentflow.llm.base import Engine
from agentflow.tools.base import Tool
from agentflow.tools.generalist import GeneralistConfig, GeneralistTool
from agentflow.tools.http_tools import HttpToolConfig, web_search_tool, wikipedia_tool
from agentflow.tools.python_tool import PythonTool, PythonToolConfig
from agentflow.tools.search import SearchConfig, SearchTool

DEFAULT_TOOLS = ("python", "search", "generalist")


@dataclass(frozen=True)
class ToolsConfig:
    """Settings of every tool; a tool that is not built ignores its part."""

    python: PythonToolConfig = field(default_factory=PythonToolConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    wikipedia: HttpToolConfig = field(default_factory=HttpToolConfig)
    web_search: HttpToolConfig = field(default_factory=HttpToolConfig)
    generalist: GeneralistConfig = field(default_factory=GeneralistConfig)


def _generalist(config: ToolsConfig, engine: Engine | None) -> Tool:
    if engine is None:
        raise InvalidInput("the generalist tool needs an engine: pass engine=... to build_tools or drop 'generalist'")
    return GeneralistTool(engine, config.generalist)


_BUILDERS: dict[str, Callable[[ToolsConfig, Engine | None], Tool]] = {
    "python": lambda c, e: PythonTool(c.python),
    "search": lambda c, e: SearchTool(c.search),
    "wikipedia": lambda c, e: wikipedia_tool(c.wikipedia),
    "web_search": lambda c, e: web_search_tool(c.web_search),
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
