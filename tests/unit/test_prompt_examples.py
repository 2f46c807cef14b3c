"""No example query of the README or docs appears in a prompt: a showcase answered from the prompt proves nothing.

A small model copies what its prompt shows; when the README's example calculation was also a tool card's example,
its result came back as the answer to unrelated benchmark questions (bench/answer_copy.py measures that rate)."""

import ast
import operator
import re
from importlib.resources import files
from pathlib import Path

import pytest

from agentflow.llm.scripted import ScriptedEngine
from agentflow.tools.registry import available_tool_names, build_tools

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_QUERY = re.compile(r"agentflow (?:run|ask) \"([^\"]+)\"")
EXPRESSION = re.compile(r"\d+(?:\s*[-+*/]\s*\d+)+")
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def prompt_text() -> str:
    """Everything a module's prompt can contain besides the request: the prompt files and every tool card."""
    prompts = files("agentflow").joinpath("prompts")
    texts = [p.read_text(encoding="utf-8") for p in prompts.iterdir() if p.name.endswith((".md", ".json"))]
    tools = build_tools(available_tool_names(), engine=ScriptedEngine(["unused"]))
    texts += [tool.spec.card() for tool in tools.values()]
    return "\n".join(texts).replace("\\n", "\n")


def example_queries() -> list[str]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return sorted({q for page in pages for q in EXAMPLE_QUERY.findall(page.read_text(encoding="utf-8"))})


def value(expression: str) -> float:
    def walk(node):
        if isinstance(node, ast.BinOp):
            return OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        return node.value
    return walk(ast.parse(expression, mode="eval").body)


def squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text).lower()


def test_the_docs_have_example_queries():
    assert len(example_queries()) >= 2  # the pattern still finds the README's `run` and `ask` examples


def leaks(query: str, prompts: str) -> list[str]:
    """What of ``query`` the prompts show: the query itself, a calculation in it, or that calculation's result."""
    found = [query] if squeezed(query) in squeezed(prompts) else []
    for expression in EXPRESSION.findall(query):
        if squeezed(expression) in squeezed(prompts):
            found.append(expression)
        result = value(expression)
        if abs(result) >= 100 and result == int(result):  # small numbers occur in any text
            if re.search(rf"(?<![\d.]){int(result)}(?![\d.])", prompts):
                found.append(f"{expression} = {int(result)}")
    return found


@pytest.mark.parametrize("query", example_queries())
def test_no_example_query_or_its_result_is_in_a_prompt(query):
    assert leaks(query, prompt_text()) == []


def test_a_leak_is_found():
    query = "What is 2468 * 1357?"
    assert leaks(query, "example: print(2468*1357)") == ["2468 * 1357"]
    assert leaks(query, "Result: 3349076") == ["2468 * 1357 = 3349076"]
    assert leaks(query, "Q: what is 2468 * 1357?") == [query, "2468 * 1357"]
    assert leaks(query, "Result: 33490761") == []


@pytest.mark.parametrize("reply, query, sub_goal, copied", [
    ("```python\nprint(100 - 7)\n```", "Who directed the film Kaleidoscope?", "The tool is: python", True),
    ("print(100 - 7)", "Which river is longer?", "find it", True),  # unfenced, the same program
    ("```python\nimport math; print(math.sqrt(2))\n```", "How tall is the tower?", "compute it", True),  # the card's
    ("```python\nprint(100 - 7)\n```", "How much is 100 - 7?", "The tool is: 100 - 7", False),  # asked for
    ("```python\nprint(2468 * 1357)\n```", "What is 2468 * 1357?", "The tool is: 2468 * 1357", False),
    ("```python\nprint('this question needs no calculation')\n```", "Who founded Rome?", "find it", False),
])
def test_the_executor_refuses_a_command_copied_from_its_examples(reply, query, sub_goal, copied):
    """A program of the prompt's worked examples or tool card, word for word, for a question without its numbers is
    a parse failure (the step records it), not a tool call whose result becomes the answer."""
    from agentflow.domain.deadline import Deadline
    from agentflow.domain.parsing import PlanDecision
    from agentflow.errors import ParseFailure
    from agentflow.llm.base import Sampling
    from agentflow.modules.executor import Executor

    tools = build_tools(["python"], engine=ScriptedEngine(["unused"]))
    executor = Executor(ScriptedEngine([reply]), Sampling(), tools=tools)
    command, _ = executor.command(query, PlanDecision(sub_goal=sub_goal, tool="python"), Deadline(30))
    assert isinstance(command, ParseFailure) == copied, command
    if copied:  # and the step's error does not quote the program: the generator would copy it from the memory
        assert "repeats an example" in str(command) and not re.search(r"\d", str(command))


@pytest.mark.parametrize("reply, query, steps, answer", [
    ("Answer: 12 * 34", "Use 1 3 4 6 to make 24.", [], ""),  # the answer example's calculation, not this puzzle's
    ("Step 0 found it.\nAnswer: 100 - 7 = 57", "Who wrote the novel?", [], ""),
    ("Answer: 408", "What is 12 * 34?", [], "408"),  # asked for: no copy
    ("Answer: 408", "Find the number of lattice points.", [], ""),  # the answer example's result, as the answer
    ("Answer: 408", "How many days?", [("count them", "print(400 + 8)", "408")], "408"),  # found by a step
    ("Answer: 3 * 8 = 24", "Use 3 8 1 1 to make 24.", [], "3 * 8 = 24"),
    ("Answer: 12 * 34 = 408", "What is the product?", [("compute it", "print(12 * 34)", "408")], "12 * 34 = 408"),
])
def test_the_generator_gives_no_answer_when_it_repeats_an_example_calculation(reply, query, steps, answer):
    from agentflow.domain.deadline import Deadline
    from agentflow.domain.memory import Memory, MemoryStep
    from agentflow.llm.base import Sampling
    from agentflow.modules.generator import Generator

    memory = Memory(query=query)
    for i, (goal, command, result) in enumerate(steps):
        memory.add(MemoryStep(step=i, sub_goal=goal, tool="python", command=command, result=result))
    assert Generator(ScriptedEngine([reply]), Sampling()).answer(memory, Deadline(30))[0] == answer
