"""The tiny-deterministic profile: its rules on hand-made prompts and memories, the planner adapter, and the profile
on the synthetic environment (the reference policy solves it; a random planner does not)."""

import json
import random

import pytest

from agentflow.envs import profiles
from agentflow.envs.profiles import (ASSUMED_VALUE, FROZEN_ROLES, FrozenEngine, PlannerAdapter, arithmetic_program,
                                     best_number, compact_plan_messages, generalist_answer, generalist_guess,
                                     get_profile, needs_computation, parse_steps, recall, search_keywords)
from agentflow.envs.synthetic import TOOLS, EnvConfig, SyntheticEnv
from agentflow.errors import InvalidInput
from agentflow.flow.loop import LoopConfig
from agentflow.domain.memory import Memory, MemoryStep
from agentflow.domain.parsing import parse_command, parse_plan, parse_verdict, plan_schema
from agentflow.rollout.tripwires import non_answer
from agentflow.llm.base import Completion, Sampling
from agentflow.modules.prompting import messages
from agentflow.rewards import score
from agentflow.tools.generalist import SYSTEM_PROMPT
from bench._harness import MemoTool

S = Sampling()
PASSAGE = ("[1] Dunby\nDunby is a town on the north coast of Greater Velor, in Veloria. Dunby has 214 bridges. "
           "The population of Dunby is 35127 people. Dunby was founded in the year 1643. Dunby lies at an elevation "
           "of 871 metres above sea level.\n\n[2] Corford\nCorford has 12 bridges. The population of Corford is "
           "4471 people.")
KNOWLEDGE = ("Dunby was founded in the year 1643.", "Corford was founded in the year 1288.")


def memory(query: str, *steps: MemoryStep) -> Memory:
    m = Memory(query=query, analysis=profiles.NEUTRAL_ANALYSIS)
    for s in steps:
        m.add(s)
    return m


ROLE = {"command": "executor", "verify": "verifier", "answer": "generator"}  # prompt -> the role that gets it


def ask(kind: str, **values) -> str:
    return FrozenEngine(ROLE[kind], KNOWLEDGE).complete(messages(kind, **values), S, timeout=1).text


def verify(query: str, *steps: MemoryStep) -> str:
    return parse_verdict(ask("verify", query=query, memory=memory(query, *steps).render()))[1]


def answer(query: str, *steps: MemoryStep) -> str:
    from agentflow.domain.parsing import parse_answer

    return parse_answer(ask("answer", query=query, memory=memory(query, *steps).render()))


def command(query: str, tool: str, context: str = "none") -> str:
    card = {"python": "python: Runs Python", "search": "search: Searches", "generalist": "generalist: Asks"}[tool]
    return parse_command(ask("command", query=query, sub_goal="x", context=context, tool_card=card))


# --- prompts and memories ------------------------------------------------------------------------------------------


def test_one_frozen_engine_per_role():
    engines = get_profile("tiny-deterministic").engines(ToolEngine("python"), knowledge=KNOWLEDGE)
    assert set(engines) == {"planner", *FROZEN_ROLES} and isinstance(engines["planner"], PlannerAdapter)
    assert [engines[role].role for role in FROZEN_ROLES] == list(FROZEN_ROLES)
    assert len({id(engines[role]) for role in FROZEN_ROLES}) == len(FROZEN_ROLES)
    assert engines["generalist"].knowledge == KNOWLEDGE
    with pytest.raises(InvalidInput, match="no tiny-deterministic rule"):
        FrozenEngine("judge")
    shared, planner = ToolEngine("python"), ToolEngine("search")
    engines = get_profile("llm").engines(planner, shared)
    assert engines["planner"] is planner and all(engines[role] is shared for role in FROZEN_ROLES)


def test_the_profile_wires_each_role_into_its_module():
    agent = get_profile("tiny-deterministic").build_agent(ToolEngine("python"), TOOLS, LoopConfig(max_steps=1),
                                                          knowledge=KNOWLEDGE)
    assert (agent.executor.engine.role, agent.verifier.engine.role, agent.generator.engine.role) == \
        ("executor", "verifier", "generator")
    assert agent.executor.tools["generalist"].engine.role == "generalist"
    assert isinstance(agent.planner.engine, PlannerAdapter)
    from agentflow.flow.build import build_agent

    with pytest.raises(InvalidInput, match="no engine for generalist"):
        build_agent({role: FrozenEngine(role) for role in ("executor", "verifier", "generator")} | {
            "planner": ToolEngine("python")}, list(TOOLS))


def test_parse_steps_reads_rendered_memory():
    m = memory("q", MemoryStep(0, "look", "search", "bridges Dunby", result=PASSAGE, verdict="CONTINUE"),
               MemoryStep(1, "compute", "python", "print(x)", error="runtime_error: NameError: x"))
    steps = parse_steps(m.render())
    assert [(s.tool, s.command) for s in steps] == [("search", "bridges Dunby"), ("python", "print(x)")]
    assert steps[0].result == PASSAGE and not steps[0].error
    assert steps[1].error == "runtime_error: NameError: x" and not steps[1].result
    assert parse_steps("(no steps yet)") == []


# --- reading questions ---------------------------------------------------------------------------------------------


def test_question_readers():
    assert needs_computation("What is 4817 * 263?") and needs_computation("What is 12 times 7 plus 3?")
    assert needs_computation("What is the population of Dunby minus 40?")
    assert not needs_computation("How many bridges does Dunby have?")
    assert not needs_computation("When was Dunby founded? Give the year.")
    assert best_number("How many bridges does Dunby have?", PASSAGE) == "214"
    assert best_number("How many people live in Dunby?", PASSAGE) == "35127"
    assert best_number("What is the elevation of Dunby in metres?", PASSAGE) == "871"
    assert best_number("How many bridges does Corford have?", PASSAGE) == "12"
    assert best_number("How many bridges does Kerby have?", PASSAGE) is None  # not in the text


# --- the executor --------------------------------------------------------------------------------------------------


def test_executor_python_rules():
    assert arithmetic_program("What is 4817 * 263?") == "print(4817 * 263)"
    assert arithmetic_program("What is 12 times 7 plus 3?") == "print(12 * 7 + 3)"
    assert arithmetic_program("What is (12 + 5) * 3?") == "print(( 12 + 5 ) * 3)"
    assert arithmetic_program("Calculate 7537 * 597 - 1186.") == "print(7537 * 597 - 1186)"
    # two-hop: the quantity comes from the context, or is assumed
    q = "What is the number of bridges in Dunby times 42?"
    assert arithmetic_program(q, PASSAGE) == "print(214 * 42)"
    assert arithmetic_program(q) == (f"number_bridge_dunby = {ASSUMED_VALUE}  # assumed: not given in the context\n"
                                     "print(number_bridge_dunby * 42)")  # runs, and prints a wrong number
    assert arithmetic_program("How many bridges does Dunby have?", PASSAGE) == "print(214)"
    assert arithmetic_program("what is there to compute?").startswith("raise ValueError")
    # through the prompt
    assert command("What is 4817 * 263?", "python") == "print(4817 * 263)"
    assert command(q, "python", context=PASSAGE) == "print(214 * 42)"


def test_executor_search_and_generalist_rules():
    assert search_keywords("What is the number of bridges in Dunby times 42?") == "number bridges Dunby"
    assert search_keywords("How many people live in Dunby?") == "people live Dunby"
    assert search_keywords("What is 4817 * 263?") == "What is 4817 * 263?"  # nothing to search with
    assert command("How many people live in Dunby?", "search") == "people live Dunby"
    assert command("How many people live in Dunby?", "generalist") == "How many people live in Dunby?"


def test_generalist_knows_or_guesses():
    assert generalist_guess("What is 4817 * 263?") == "It is roughly 1248000."  # 4800 * 260
    guess = generalist_guess("How many bridges does Dunby have?")
    assert guess.startswith("As far as I recall, bridges Dunby: ") and guess == generalist_guess(
        "How many bridges does Dunby have?")
    assert recall("In which year was Dunby founded?", KNOWLEDGE) == KNOWLEDGE[0]
    assert recall("How many bridges does Dunby have?", KNOWLEDGE) is None  # names Dunby, but asks something else
    assert recall("When was Kerby founded?", KNOWLEDGE) is None
    assert generalist_answer("When was Corford founded? Give the year.", KNOWLEDGE) == KNOWLEDGE[1]
    # about a town it knows nothing of, it hedges and asks back: the refusal tripwire's detector reads a clarification
    asked = generalist_answer("How many bridges does Dunby have?", KNOWLEDGE)
    assert asked == guess + " Could you tell me more about Dunby?"
    assert non_answer(asked) == "clarify" and non_answer(generalist_answer("What is 4817 * 263?")) == ""

    def reply(question):
        return FrozenEngine("generalist", KNOWLEDGE).complete([{"role": "system", "content": SYSTEM_PROMPT},
                                                               {"role": "user", "content": question}], S,
                                                              timeout=1).text

    assert reply("What is 4817 * 263?") == "It is roughly 1248000."
    assert reply("What year was Dunby founded in?") == KNOWLEDGE[0]


# --- the verifier and the generator ----------------------------------------------------------------------------------

LOOKUP, ARITH, HOP = "How many bridges does Dunby have?", "What is 4817 * 263?", \
    "What is the number of bridges in Dunby times 42?"
FOUND = MemoryStep(0, "look", "search", "bridges Dunby", result=PASSAGE)
NOTHING = MemoryStep(0, "look", "search", ARITH, result=f"No passages matched {ARITH!r}.")
NAME_ERROR = MemoryStep(0, "compute", "python", "print(x)", error="runtime_error: NameError: name 'x' is not defined")
PRINTED = MemoryStep(1, "compute", "python", "print(214 * 42)", result="8988\n")
GUESS = MemoryStep(0, "ask", "generalist", ARITH, result="It is roughly 1248000.")


def test_verifier_rules():
    assert verify(LOOKUP) == "CONTINUE"  # no steps
    assert verify(LOOKUP, NAME_ERROR) == "CONTINUE"  # the last step failed
    assert verify(LOOKUP, FOUND) == "STOP"  # the fact is stated
    assert verify(HOP, FOUND) == "CONTINUE"  # a search found an input: still a computation to do
    assert verify(HOP, FOUND, PRINTED) == "STOP"  # a printed value
    # a tool returned a value: the verifier cannot tell a guess or an irrelevant result from an answer
    assert verify(ARITH, GUESS) == "STOP"
    assert verify(ARITH, NOTHING) == "STOP"
    assert verify(HOP, MemoryStep(0, "ask", "generalist", HOP, result="As far as I recall, number: 5.")) == "STOP"
    assert verify(HOP, MemoryStep(0, "compute", "python", "print(4200)", result="4200\n")) == "STOP"


def test_generator_rules():
    assert answer(LOOKUP, FOUND) == "214"
    assert answer(HOP, FOUND, PRINTED) == "8988"
    assert answer(ARITH, GUESS) == "1248000"
    assert answer(HOP, FOUND, NAME_ERROR) == "214"  # the last *successful* result
    assert answer(LOOKUP) == "unknown"
    assert answer(LOOKUP, NAME_ERROR) == "unknown"
    # the generalist's question back is passed on (its guess the number a reward reads); a search result that ends
    # with a question is not one
    asked = "As far as I recall, bridges Dunby: 4821. Could you tell me more about Dunby?"
    assert answer(LOOKUP, MemoryStep(0, "ask", "generalist", LOOKUP, result=asked)) == asked
    assert answer(LOOKUP, MemoryStep(0, "look", "search", "Dunby", result="Dunby has 214 bridges. Why?")) == "214"


def test_analysis_is_neutral():
    analysis = PlannerAdapter(FrozenEngine("planner")).complete(messages("analyze", query=ARITH, tools="t"), S,
                                                                 timeout=1)
    assert (analysis.text, analysis.model_version) == (profiles.NEUTRAL_ANALYSIS, "")  # a rule, no planner version


# --- the planner adapter ---------------------------------------------------------------------------------------------


class ToolEngine:
    """A structured-output engine that always picks ``tool`` and records what it was asked."""

    supports_structured_output = True
    version = "v7"

    def __init__(self, tool: str):
        self.tool, self.calls = tool, []

    def complete(self, msgs, sampling, *, timeout, json_schema=None, key=""):
        self.calls.append((msgs, json_schema))
        return Completion(text=json.dumps({"tool": self.tool}), prompt_token_ids=[1, 2, 3], token_ids=[4, 5],
                          logprobs=[-0.5, -0.1], model_version=self.version, finish_reason="stop")


def plan_prompt(query: str, *steps: MemoryStep) -> list[dict]:
    return messages("plan", query=query, analysis=profiles.NEUTRAL_ANALYSIS, tools="- python: x", step=len(steps) + 1,
                    max_steps=3, memory=memory(query, *steps).render(), tool_names=", ".join(TOOLS))


def test_adapter_asks_for_the_tool_and_fills_the_rest():
    inner = ToolEngine("python")
    adapter = PlannerAdapter(inner)
    c = adapter.complete(plan_prompt(HOP, FOUND), Sampling(temperature=1.0), timeout=1,
                         json_schema=plan_schema(list(TOOLS)))
    shown, schema = inner.calls[0]
    assert schema["properties"] == {"tool": {"type": "string", "enum": list(TOOLS)}}
    assert (c.prompt_token_ids, c.token_ids, c.logprobs, c.model_version) == ([1, 2, 3], [4, 5], [-0.5, -0.1], "v7")
    decision = parse_plan(c.text, list(TOOLS))
    assert decision.tool == "python" and decision.context == PASSAGE.strip()
    assert decision.sub_goal == profiles.SUB_GOALS["python"]
    # the compact prompt: question, steps, step number, tools
    text = shown[0]["content"]
    assert text.startswith(f"Question: {HOP}\nSteps so far:\n1. search -> ") and text.endswith(
        "Step 2 of 3. Tools: python, search, generalist.")
    assert adapter.version == "v7"


def test_adapter_full_prompt_and_passthrough():
    inner = ToolEngine("search")
    adapter = PlannerAdapter(inner, compact=False)
    prompt = plan_prompt(LOOKUP)
    c = adapter.complete(prompt, S, timeout=1, json_schema=plan_schema(list(TOOLS)))
    assert inner.calls[0][0] == prompt and parse_plan(c.text, list(TOOLS)).context == "none"
    analysis = adapter.complete(messages("analyze", query=LOOKUP, tools="t"), S, timeout=1)  # the call without schema
    assert analysis.text == profiles.NEUTRAL_ANALYSIS and len(inner.calls) == 1  # not the trained engine
    plain = ToolEngine("search")
    plain.supports_structured_output = False  # e.g. the reference planner: gets the plan call unchanged
    PlannerAdapter(plain).complete(prompt, S, timeout=1, json_schema=plan_schema(list(TOOLS)))
    assert plain.calls == [(prompt, plan_schema(list(TOOLS)))]


def test_compact_prompt_clips_results():
    text = compact_plan_messages(plan_prompt(LOOKUP, NAME_ERROR)[1]["content"], TOOLS, result_chars=30)[0]["content"]
    assert "1. python -> error: runtime_error: NameError: nam…" in text


def test_get_profile():
    assert get_profile("tiny-deterministic").name == "tiny-deterministic"
    with pytest.raises(InvalidInput, match="unknown profile"):
        get_profile("nope")


# --- the profile on the synthetic environment -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def env():
    return SyntheticEnv(EnvConfig(seed=3, towns=24, train_size=30, heldout_size=30))


def success(agent, tasks) -> float:
    values = [score("math", agent.solve(t.query, ground_truth=t.answer)["answer"], {"answer": t.answer})["value"]
              for t in tasks]
    return sum(values) / len(values)


def memoised(agent):
    agent.executor.tools["python"] = MemoTool(agent.executor.tools["python"])
    return agent


def test_reference_policy_solves_the_environment(env, tmp_path):
    agent = memoised(get_profile("tiny-deterministic").build_agent(
        FrozenEngine("planner", env.knowledge()), TOOLS, LoopConfig(max_steps=3),
        tools_config=env.tools_config(tmp_path), knowledge=env.knowledge()))
    assert success(agent, env.heldout) == 1.0


class RandomTool(ToolEngine):
    def __init__(self, seed):
        super().__init__("")
        self.rng = random.Random(seed)

    def complete(self, msgs, sampling, *, timeout, json_schema=None, key=""):
        self.tool = self.rng.choice(json_schema["properties"]["tool"]["enum"])
        return super().complete(msgs, sampling, timeout=timeout, json_schema=json_schema, key=key)


def test_a_random_planner_mostly_fails(env, tmp_path):
    agent = memoised(get_profile("tiny-deterministic").build_agent(
        RandomTool(0), TOOLS, LoopConfig(max_steps=3), tools_config=env.tools_config(tmp_path),
        knowledge=env.knowledge()))
    assert success(agent, env.heldout * 2) < 0.5  # uniform over 3 tools: ~0.3


class FixedSequence(ToolEngine):
    def __init__(self, sequence):
        super().__init__("")
        self.sequence = sequence

    def complete(self, msgs, sampling, *, timeout, json_schema=None, key=""):
        step = int(msgs[-1]["content"].rsplit("Step ", 1)[1].split()[0])
        self.tool = self.sequence[step - 1]
        return super().complete(msgs, sampling, timeout=timeout, json_schema=json_schema, key=key)


@pytest.mark.parametrize("sequence", [("python",) * 3, ("search", "python", "python"), ("search", "search", "python"),
                                      ("generalist",) * 3, ("search", "generalist", "python"),
                                      ("generalist", "search", "python")])
def test_no_fixed_tool_sequence_solves_more_than_a_third(env, tmp_path, sequence):
    agent = memoised(get_profile("tiny-deterministic").build_agent(
        FixedSequence(sequence), TOOLS, LoopConfig(max_steps=3), tools_config=env.tools_config(tmp_path),
        knowledge=env.knowledge()))
    assert success(agent, env.heldout) <= 0.34


def test_generalist_never_hits_the_truth_without_knowing(env):
    for task in env.train + env.heldout:
        said = profiles.final_number(generalist_answer(task.query, env.knowledge()))
        assert (said == task.answer) == (task.kind == "history"), task
