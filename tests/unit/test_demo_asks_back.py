"""The demo's second degraded version (agentflow/demo/asks_back.py): built from a real tiny planner, it sends town
questions to the generalist and asks the user back on lookups, which the refusal tripwire's detector reads."""

import json
from collections import Counter

import pytest

from agentflow.demo.asks_back import asks_back_tool, first_turn_messages, main
from agentflow.envs.profiles import get_profile
from agentflow.envs.synthetic import TOOLS, EnvConfig, SyntheticEnv
from agentflow.flow.loop import LoopConfig
from agentflow.llm.base import Completion
from agentflow.rollout.tripwires import non_answer


@pytest.fixture(scope="module")
def env():
    return SyntheticEnv(EnvConfig(seed=0))


class FirstCall:
    """An inner planner engine that records what it is shown and always picks python."""

    supports_structured_output = True
    version = "recorder"

    def __init__(self):
        self.shown = []

    def complete(self, messages, sampling, *, timeout, json_schema=None, key=""):
        self.shown.append(list(messages))
        return Completion(text=json.dumps({"tool": "python"}), model_version=self.version, finish_reason="stop")


def test_first_turn_messages_are_what_the_planner_shows_its_model(env, tmp_path):
    for task in env.heldout[:6]:
        inner = FirstCall()
        agent = get_profile("tiny-deterministic").build_agent(inner, TOOLS, LoopConfig(max_steps=3),
                                                              tools_config=env.tools_config(tmp_path))
        agent.solve(task.query)
        assert inner.shown[0] == first_turn_messages(task.query, TOOLS, 3), task.query


def test_the_asks_back_version_asks_back_on_town_lookups_and_answers_the_rest(env, tiny_model_dir, tmp_path, capsys):
    """Built as the demo builds it (its command line, on seed 0's train split)."""
    from agentflow.llm.embedded import EmbeddedEngine

    out = tmp_path / "asks-back"
    main(["--stable", str(tiny_model_dir), "--out", str(out), "--seed", "0", "--max-steps", "3"])
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["event"] == "built" and metrics["questions"] == 120, metrics
    assert metrics["sft_loss_last"] < metrics["sft_loss_first"] / 4, metrics
    assert [p.name for p in tmp_path.iterdir()] == ["asks-back"]  # written aside, then moved in place whole
    engine = EmbeddedEngine(out, version="asks-back")
    try:
        agent = get_profile("tiny-deterministic").build_agent(engine, TOOLS, LoopConfig(max_steps=3),
                                                              tools_config=env.tools_config(tmp_path),
                                                              knowledge=env.knowledge())
        seen = Counter()
        for task in env.heldout[:36]:  # questions it was not trained on
            record = agent.solve(task.query)
            first = next(s["tool"] for s in record["memory"]["steps"]) if record["memory"]["steps"] else ""
            seen[task.kind, first == asks_back_tool(task.query), bool(non_answer(record["answer"]))] += 1
    finally:
        engine.close()
    # every first tool as built; lookups and two-hop questions asked back, the rest answered
    assert set(seen) == {("arithmetic", True, False), ("history", True, False), ("lookup", True, True),
                         ("two_hop", True, True)}, seen
