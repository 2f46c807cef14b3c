"""Assemble an Agent from engines, tool names and limits: the one place modules get wired together."""

from __future__ import annotations

from collections.abc import Mapping

from agentflow.errors import InvalidInput
from agentflow.flow.loop import Agent, LoopConfig
from agentflow.llm.base import Engine, Sampling
from agentflow.modules.executor import Executor
from agentflow.modules.generator import Generator
from agentflow.modules.planner import Planner
from agentflow.modules.verifier import Verifier
from agentflow.tools.registry import ToolsConfig, build_tools

# Per-module output budgets (tokens); the planner's temperature is the caller's choice (1.0 when training).
MAX_TOKENS = {"planner": 192, "executor": 320, "verifier": 128, "generator": 192}
ROLES = ("planner", "executor", "verifier", "generator", "generalist")  # who needs an engine (generalist: the tool)


def build_agent(engine: Engine | Mapping[str, Engine], tool_names: list[str], loop: LoopConfig = LoopConfig(), *,
                planner_engine: Engine | None = None, planner_temperature: float = 0.0,
                call_timeout_s: float = 120.0, tool_timeout_s: float = 30.0,
                tools_config: ToolsConfig | None = None) -> Agent:
    """An Agent. ``engine`` is one engine for every role, or one per role: a mapping with every name in ``ROLES``
    (what ``Profile.engines`` returns). ``planner_engine``, when given, answers the planner instead."""
    engines = _per_role(engine)
    planner_engine = planner_engine or engines["planner"]
    tools = build_tools(list(tool_names), tools_config, engine=engines["generalist"])

    def sampling(module: str, temperature: float = 0.0) -> Sampling:
        return Sampling(temperature=temperature, max_tokens=MAX_TOKENS[module])

    planner = Planner(planner_engine, sampling("planner", planner_temperature), call_timeout_s,
                      tools=tuple(t.spec for t in tools.values()))
    executor = Executor(engines["executor"], sampling("executor"), call_timeout_s, tools=tools,
                        tool_timeout_s=tool_timeout_s)
    verifier = Verifier(engines["verifier"], sampling("verifier"), call_timeout_s)
    generator = Generator(engines["generator"], sampling("generator"), call_timeout_s)
    return Agent(planner, executor, verifier, generator, loop, count_tokens=_token_counter(engines["executor"]))


def _per_role(engine: Engine | Mapping[str, Engine]) -> dict[str, Engine]:
    if not isinstance(engine, Mapping):
        return dict.fromkeys(ROLES, engine)
    missing = [role for role in ROLES if role not in engine]
    if missing:
        raise InvalidInput(f"build_agent: no engine for {', '.join(missing)} (give one engine, or one per role)")
    return dict(engine)


def _token_counter(engine: Engine):
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None:
        from agentflow.domain.memory import approx_tokens

        return approx_tokens
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))
