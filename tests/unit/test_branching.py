"""Shadow branches (issue 35): the state after k turns of a finished trajectory, which trajectories may be branched,
and the loop going on from such a state (real loop, the deterministic profile, a real python sandbox)."""

import random

import pytest

from agentflow.domain.memory import Memory, MemoryStep
from agentflow.envs.profiles import FrozenEngine, get_profile
from agentflow.envs.synthetic import TOOLS, EnvConfig, SyntheticEnv
from agentflow.errors import InvalidInput
from agentflow.flow.loop import LoopConfig
from agentflow.llm.base import Completion
from agentflow.rewards import score
from agentflow.trainer.branching import branch_points, may_branch


def _memory(turns: int) -> Memory:
    memory = Memory(query="q", analysis="a")
    for i in range(1, turns + 1):
        memory.add(MemoryStep(step=i, tool="search", command=f"c{i}", result=f"r{i}", verdict="CONTINUE"))
    return memory


def test_the_state_after_k_turns_is_a_copy_of_the_first_k_steps():
    memory = _memory(3)
    state = memory.after(2)
    assert [s.command for s in state.steps] == ["c1", "c2"] and state.analysis == "a" and state.query == "q"
    state.steps[0].result = "changed"
    assert memory.steps[0].result == "r1"
    with pytest.raises(ValueError, match="turns must be in"):
        memory.after(4)
    memory.compact(budget_tokens=5)
    with pytest.raises(ValueError, match="compacted"):
        memory.after(1)


def _record(tid: str, turns: int, *, source: str = "training", train_ok: bool = False, status: str = "answered"):
    return {"trajectory_id": tid, "query": "q", "ground_truth": "1", "source": source, "train_ok": train_ok,
            "status": status, "turns": [{"step": i} for i in range(turns)], "memory": _memory(turns).to_dict()}


def test_only_finished_trainable_trajectories_of_two_turns_or_more_are_branched():
    assert may_branch(_record("a", 2))
    assert may_branch(_record("b", 3, source="traffic", train_ok=True))
    assert not may_branch(_record("c", 3, source="traffic"))  # its user did not allow training
    assert not may_branch(_record("d", 1))
    assert not may_branch(_record("e", 3, status="timeout"))
    assert not may_branch(_record("f", 3, source="eval"))
    records = [_record("a", 2), _record("b", 3, source="traffic", train_ok=True), _record("c", 3, source="traffic")]
    points = branch_points(records * 3, 10, random.Random(0))
    assert len(points) == 6 and {p.trajectory_id for p in points} == {"a", "b"}
    for point in points:
        assert 1 <= point.turn <= (1 if point.trajectory_id == "a" else 2)
        assert len(point.state.steps) == point.turn and point.group_id == f"branch/{point.trajectory_id}/{point.turn}"


class Scripted:
    """A planner engine that answers the tools in order and keeps the prompts it was shown."""

    supports_structured_output = True
    version = "v7"

    def __init__(self, *tools):
        self.tools, self.prompts = list(tools), []

    def complete(self, msgs, sampling, *, timeout, json_schema=None, key=""):
        self.prompts.append(msgs[-1]["content"])
        return Completion(text=f'{{"tool": "{self.tools.pop(0)}"}}', model_version=self.version, finish_reason="stop")


def test_the_loop_goes_on_from_a_branch_state_and_records_only_its_own_turns(tmp_path):
    env = SyntheticEnv(EnvConfig(seed=1, towns=12, train_size=12, heldout_size=6))
    task = next(t for t in env.train if t.kind == "two_hop")

    def agent(planner):
        return get_profile("tiny-deterministic").build_agent(planner, TOOLS, LoopConfig(max_steps=3),
                                                             tools_config=env.tools_config(tmp_path), **env.rules())

    whole = agent(FrozenEngine("planner", env.knowledge())).solve(task.query, ground_truth=task.answer,
                                                                 source="training")
    assert [t["decision"]["tool"] for t in whole["turns"]] == ["search", "python"]
    point = branch_points([whole], 1, random.Random(0))[0]
    assert point.turn == 1
    planner = Scripted("python")
    branch = agent(planner).solve(task.query, ground_truth=task.answer, source="training", group_id=point.group_id,
                                  start=point.state)
    assert [t["step"] for t in branch["turns"]] == [1] and branch["analysis_call"] == {}
    assert "Step 2 of 3" in planner.prompts[0] and "1. search ->" in planner.prompts[0]
    assert [s["tool"] for s in branch["memory"]["steps"]] == ["search", "python"]
    assert score("math", branch["answer"], {"answer": task.answer})["value"] == 1.0
    assert branch["turns"][0]["planner"]["model_version"] == "v7"
    dead_end = agent(Scripted("generalist", "generalist")).solve(task.query, ground_truth=task.answer,
                                                                 start=point.state)
    assert score("math", dead_end["answer"], {"answer": task.answer})["value"] == 0.0
    with pytest.raises(InvalidInput, match="same query"):
        agent(Scripted("python")).solve("What is 2 + 2?", start=point.state)
