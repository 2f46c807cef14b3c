import pytest

from agentflow.errors import InvalidInput
from agentflow.tools.registry import DEFAULT_TOOLS, ToolsConfig, available_tool_names, build_tools
from agentflow.tools.search import SearchConfig


class NullEngine:
    supports_structured_output = False

    def complete(self, messages, sampling, *, timeout, json_schema=None, key=""):
        raise AssertionError("not called")


def test_available_names():
    assert available_tool_names() == ("generalist", "python", "search", "web_search", "wikipedia")


def test_builds_the_default_tools_in_order():
    tools = build_tools(list(DEFAULT_TOOLS), engine=NullEngine())
    assert list(tools) == list(DEFAULT_TOOLS)
    assert all(tool.spec.name == name for name, tool in tools.items())
    assert all(tool.spec.card().startswith(f"- {name}:") for name, tool in tools.items())


def test_unknown_tool_is_named_with_the_known_ones():
    with pytest.raises(InvalidInput) as err:
        build_tools(["python", "calculator"])
    assert "'calculator'" in str(err.value) and "python, search" in str(err.value)


def test_generalist_without_engine_is_refused():
    with pytest.raises(InvalidInput, match="engine"):
        build_tools(["generalist"])


def test_config_reaches_the_tools_and_duplicates_are_built_once():
    config = ToolsConfig(search=SearchConfig(top_k=5))
    tools = build_tools("search, search, web_search", config)
    assert list(tools) == ["search", "web_search"]
    assert tools["search"].config.top_k == 5
