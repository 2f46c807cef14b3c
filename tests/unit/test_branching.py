"""Shadow branches (issue 35): the state after k turns of a finished trajectory, which trajectories may be branched,
and the loop going on from such a state (real loop, the deterministic profile, a real python sandbox)."""

import random

import pytest

from agentflow.domain.memory import Memory, MemoryStep
from agentflow.domain.trajectory import may_branch
from agentflow.envs.profiles import FrozenEngine, get_profile
from agentflow.envs.synthetic import TOOLS, EnvConfig, SyntheticEnv
from agentflow.errors import InvalidInput
from agentflow.flow.loop import LoopConfig
from agentflow.llm.base import Completion
from agentflow.rewards import score
from agentflow.trainer.branching import branch_points


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
    assert may_branch(_record("a", 3), 2) and not may_branch(_record("a", 3), 3) and not may_branch(_record("a", 3), 0)
    branch = _record("g", 2)
    branch["memory"] = _memory(3).to_dict()  # a branch's memory also holds the steps it started from
    assert not may_branch(branch)
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


def test_the_driver_mixes_in_branch_groups_from_its_finished_rollouts_at_the_share_asked():
    from itertools import islice

    from agentflow.trainer.branching import BranchPool
    from agentflow.trainer.drive import Item, with_branches

    pool = BranchPool(size=4, seed=0)
    pool.add(_record("opted-out", 3, source="traffic"))  # never kept: its user did not allow training
    assert pool.take() is None
    whole = ((Item(f"q{n // 3}", "1"), f"g{n // 3}") for n in range(10**6))
    rollouts = with_branches(whole, pool, 0.25, 3)
    assert [b for _, _, b in islice(rollouts, 6)] == [None] * 6  # nothing to branch yet: whole groups only
    for n in range(6):
        pool.add(_record(f"r{n}", 3))  # the pool keeps the 4 most recent
    sent = list(islice(rollouts, 3 * 40))
    groups = [sent[i:i + 3] for i in range(0, len(sent), 3)]
    branched = [g for g in groups if g[0][2] is not None]
    assert len(branched) == 4 and pool.take() is None  # each kept rollout branched once, the oldest two dropped
    for group in branched:
        (item, group_id, (tid, turn)), = set(group)  # G copies of one branch point
        assert tid in {"r2", "r3", "r4", "r5"} and 1 <= turn <= 2 and group_id == f"branch/{tid}/{turn}"
        assert item == Item("q", "1")
    assert {tid for (_, _, (tid, _)), *_ in branched} == {"r2", "r3", "r4", "r5"}
    assert all(len(g) == 3 and len({x[1] for x in g}) == 1 for g in groups)  # groups stay whole


def test_branch_groups_keep_to_their_share_when_there_is_always_one_to_take():
    from agentflow.trainer.branching import BranchPool
    from agentflow.trainer.drive import Item, with_branches

    pool = BranchPool(seed=1)
    whole = ((Item("q", "1"), f"g{n // 2}") for n in range(10**6))
    kinds = []
    for n, (_, _, branch) in enumerate(with_branches(whole, pool, 0.3, 2)):
        if n % 2 == 0:
            kinds.append(branch is not None)
            pool.add(_record(f"r{n}", 3))
        if len(kinds) == 200:
            break
    assert 0.28 <= sum(kinds) / len(kinds) <= 0.31, sum(kinds)
