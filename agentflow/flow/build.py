"""Assemble an Agent from engines, tool names and limits: the one place modules get wired together."""

from __future__ import annotations

from agentflow.flow.loop import Agent, LoopConfig
from agentflow.llm.base import Engine, Sampling
from agentflow.modules.executor import Executor
from agentflow.modules.generator import Generator
from agentflow.modules.planner import Planner
from agentflow.modules.verifier import Verifier
from agentflow.tools.registry import ToolsConfig, build_tools

# Per-module output budgets (tokens); the planner's temperature is the caller's choice (1.0 when training).
MAX_TOKENS = {"planner": 192, "executor": 320, "verifier": 128, "generator": 192}


def build_agent(engine: Engine, tool_names: list[str], loop: LoopConfig = LoopConfig(), *,
                planner_engine: Engine | None = None, planner_temperature: float = 0.0,
                call_timeout_s: float = 120.0, tool_timeout_s: float = 30.0,
                tools_config: ToolsConfig | None = None) -> Agent:
    """An Agent whose frozen modules (executor, verifier, generator, generalist tool) use ``engine`` and whose
    planner uses ``planner_engine`` (default: the same engine)."""
    tools = build_tools(list(tool_names), tools_config, engine=engine)

    def sampling(module: str, temperature: float = 0.0) -> Sampling:
        return Sampling(temperature=temperature, max_tokens=MAX_TOKENS[module])

    planner = Planner(planner_engine or engine, sampling("planner", planner_temperature), call_timeout_s,
                      tools=tuple(t.spec for t in tools.values()))
    executor = Executor(engine, sampling("executor"), call_timeout_s, tools=tools, tool_timeout_s=tool_timeout_s)
    verifier = Verifier(engine, sampling("verifier"), call_timeout_s)
    generator = Generator(engine, sampling("generator"), call_timeout_s)
    return Agent(planner, executor, verifier, generator, loop, count_tokens=_token_counter(engine))


def _token_counter(engine: Engine):
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None:
        from agentflow.flow.memory import approx_tokens

        return approx_tokens
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))
