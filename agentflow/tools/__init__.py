"""The tools the executor runs (registry: their names and builders)."""


def tool_names() -> tuple[str, ...]:
    """The tools' names, for checking a --tools flag: the tools are imported only when this is called."""
    from agentflow.tools.registry import available_tool_names

    return available_tool_names()
