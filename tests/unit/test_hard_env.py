"""The synthetic environment's hard mode (issue 35): three-hop tasks with computed ground truth, frozen modules that
err at their set rates with seeded draws, a wrong tool that costs a turn, and a world where the reference policy
still solves most of it while no fixed tool sequence and no random planner come close."""

import itertools
import random
import re

import pytest

from agentflow.envs.profiles import (FrozenEngine, Noise, get_profile, missing, near_miss, phrases, slip_digit)
from agentflow.envs.synthetic import EXPECTED_TOOLS, HARD_CYCLE, HARD_MAX_TURNS, TOOLS, EnvConfig, SyntheticEnv
from agentflow.errors import InvalidInput
from agentflow.flow.loop import LoopConfig
from agentflow.llm.base import Sampling
from agentflow.rewards import score
from bench._harness import MemoTool

HARD = EnvConfig(seed=5, towns=24, train_size=36, heldout_size=36, mode="hard")
THREE_HOP = "What is the population of Corford plus the number of bridges in Dunby?"


@pytest.fixture(scope="module")
def env():
    return SyntheticEnv(HARD)


def _value(env, town: str, phrase: str) -> int:
    """The number the corpus states in the town's sentence that names the quantity (re-read from the text)."""
    passage = next(p["text"] for p in env.passages() if p["title"] == town)
    word = {"population": "population", "bridges": "bridges", "elevation": "elevation"}[
        next(w for w in ("population", "bridges", "elevation") if w in phrase)]
    sentence = next(s for s in passage.split(". ") if word in s)
    return int(re.findall(r"\d+", sentence)[-1])


def test_hard_tasks_follow_their_cycle_and_three_hop_truth_is_the_corpus_arithmetic(env):
    for tasks in (env.train, env.heldout):
        assert [t.kind for t in tasks] == [HARD_CYCLE[i % len(HARD_CYCLE)] for i in range(len(tasks))]
        assert all(t.tools == EXPECTED_TOOLS[t.kind] for t in tasks)
    three = [t for t in env.train + env.heldout if t.kind == "three_hop"]
    assert len(three) == 24 and env.max_turns == HARD_MAX_TURNS
    names = {t.name for t in env.towns}
    for task in three:
        first, word, second = re.match(r"What is (.+) (plus|minus) (the .+)\?", task.query).groups()
        a_town, b_town = (next(w for w in re.findall(r"[A-Z]\w+", part) if w in names) for part in (first, second))
        assert a_town != b_town
        a, b = _value(env, a_town, first), _value(env, b_town, second)
        assert int(task.answer) == (a + b if word == "plus" else a - b), task.query
    assert not {t.query for t in env.train} & {t.query for t in env.heldout}
    assert SyntheticEnv(EnvConfig(seed=5, towns=24, train_size=36, heldout_size=36)).max_turns is None


def test_a_bad_mode_or_rate_is_refused():
    for bad in ({"mode": "harder"}, {"error_rate": 1.0}, {"recall_rate": -0.1}):
        with pytest.raises(InvalidInput, match="env.mode|error_rate"):
            EnvConfig(**bad)
    from agentflow.envs.synthetic import _three_hop

    one_town = [("Dunby", "bridges"), ("Dunby", "population")]
    with pytest.raises(InvalidInput, match="two towns"):  # bounded, where an unbounded redraw would never end
        _three_hop(random.Random(0), None, one_town)


def test_two_towns_split_into_phrases_and_the_first_unknown_is_searched():
    assert phrases(THREE_HOP) == ["What is the population of Corford", "the number of bridges in Dunby?"]
    assert phrases("How many bridges does Dunby have?") == ["How many bridges does Dunby have?"]
    known = "The population of Corford is 4471 people."
    assert missing(THREE_HOP, known) == ["the number of bridges in Dunby?"]
    executor = FrozenEngine("executor", noise=Noise(error_rate=0.0))
    assert _command(executor, THREE_HOP, "none", "search") == "population Corford"
    assert _command(executor, THREE_HOP, known, "search") == "number bridges Dunby"
    program = _command(executor, THREE_HOP, known + "\nDunby has 214 bridges.", "python")
    assert program == "print(4471 + 214)"


def test_draws_are_seeded_by_the_trajectory_and_err_at_their_rate():
    noise = Noise(seed=1, error_rate=0.2)
    assert noise.draw("t1", "executor", "p") == noise.draw("t1", "executor", "p")
    assert noise.draw("t1", "executor", "p") != Noise(seed=2).draw("t1", "executor", "p")
    executor = FrozenEngine("executor", noise=noise)
    searches = [_command(executor, "How many bridges does Dunby have?", "none", "search", key=f"t{i}")
                for i in range(400)]
    assert set(searches) == {"bridges Dunby", f"bridges {near_miss('Dunby')}"}
    assert 0.15 < searches.count("bridges Dunb") / 400 < 0.25
    assert slip_digit("x = 1\nprint(4471 + 214)") == "x = 1\nprint(5471 + 214)"
    generalist = FrozenEngine("generalist", noise=Noise(recall_rate=0.3, rumours=("Dunby has 214 bridges.",)))
    said = [generalist.complete([{"role": "user", "content": "How many bridges does Dunby have?"}], Sampling(),
                                timeout=1, key=f"t{i}").text for i in range(400)]
    assert 0.24 < said.count("Dunby has 214 bridges.") / 400 < 0.36  # the rest: a hedged guess and a question back


def _command(executor, question, context, tool, key="k"):
    from agentflow.domain.parsing import parse_command
    from agentflow.modules.prompting import messages

    card = {"python": "python: Runs Python", "search": "search: Searches"}[tool]
    prompt = messages("command", query=question, sub_goal="x", context=context, tool_card=card)
    return parse_command(executor.complete(prompt, Sampling(), timeout=1, key=key).text)


class Scripted:
    """A planner engine that picks its tool by a rule: a fixed sequence, or at random."""

    supports_structured_output = True
    version = "scripted"

    def __init__(self, pick):
        self.pick = pick

    def complete(self, msgs, sampling, *, timeout, json_schema=None, key=""):
        from agentflow.llm.base import Completion

        step = int(re.search(r"step (\d+)", msgs[-1]["content"], re.I).group(1))
        tool = self.pick(step, json_schema["properties"]["tool"]["enum"])
        return Completion(text=f'{{"tool": "{tool}"}}', model_version=self.version, finish_reason="stop")


def _success(env, planner, tmp_path, reps=2) -> float:
    agent = get_profile("tiny-deterministic").build_agent(planner, TOOLS, LoopConfig(max_steps=env.max_turns),
                                                          tools_config=env.tools_config(tmp_path), **env.rules())
    agent.executor.tools["python"] = MemoTool(agent.executor.tools["python"])
    values = [score("math", agent.solve(t.query, ground_truth=t.answer, trajectory_id=f"{t.id}/{r}")["answer"],
                    {"answer": t.answer})["value"] for t in env.heldout for r in range(reps)]
    return sum(values) / len(values)


def test_the_reference_solves_most_of_it_and_no_fixed_sequence_or_random_planner_does(env, tmp_path):
    reference = _success(env, FrozenEngine("planner", env.knowledge()), tmp_path)
    assert 0.75 <= reference < 1.0, reference  # the modules' errors cost the best policy too
    rng = random.Random(0)
    assert _success(env, Scripted(lambda step, tools: rng.choice(tools)), tmp_path) < 0.35
    best = max(_success(env, Scripted(lambda step, tools, s=sequence: s[step - 1]), tmp_path, reps=1)
               for sequence in itertools.product(("search", "python", "generalist"), repeat=2)
               for sequence in [sequence + ("search", "python")])
    assert best <= 0.65 and best < reference - 0.15, (best, reference)
