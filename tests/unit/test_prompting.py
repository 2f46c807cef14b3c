"""Prompt assembly: the frozen modules' worked examples come first, as earlier turns rendered with their own
template; the trained planner's prompts carry none."""

import json
from importlib.resources import files

import pytest

from agentflow.llm.embedded import resolve_dtype
from agentflow.modules.prompting import messages

EXAMPLES = json.loads(files("agentflow").joinpath("prompts", "examples.json").read_text())


@pytest.mark.parametrize("name,values", [
    ("command", {"query": "What is 6 * 7?", "context": "none", "sub_goal": "multiply", "tool_card": "python: runs"}),
    ("verify", {"query": "What is 6 * 7?", "memory": "Step 0: multiply\n  Result: 42"}),
    ("answer", {"query": "What is 6 * 7?", "memory": "Step 0: multiply\n  Result: 42"}),
])
def test_frozen_modules_see_their_examples_as_earlier_turns(name, values):
    got = messages(name, **values)
    shots = EXAMPLES[name]
    assert [m["role"] for m in got] == ["system"] + ["user", "assistant"] * len(shots) + ["user"]
    assert [m["content"] for m in got[2:-1:2]] == [s["reply"] for s in shots]
    assert shots[0]["values"]["query"] in got[1]["content"] and values["query"] in got[-1]["content"]
    got[2]["content"] = "changed"  # callers get copies: the cached examples stay as they are
    assert messages(name, **values)[2]["content"] == shots[0]["reply"]


def test_the_trained_planner_gets_no_examples():
    assert [m["role"] for m in messages("analyze", query="q", tools="t")] == ["system", "user"]
    plan = messages("plan", query="q", analysis="a", tools="t", memory="m", step=1, max_steps=3, tool_names="x")
    assert [m["role"] for m in plan] == ["system", "user"]


def test_every_example_fills_its_template():
    for name, shots in EXAMPLES.items():
        if name.startswith("_"):
            continue
        for shot in shots:  # a missing or misspelled value raises KeyError here
            messages(name, **shot["values"])


@pytest.mark.parametrize("flags,expected", [
    ("fpu avx2 avx512f avx512_bf16", "bfloat16"), ("fpu amx_bf16 amx_tile", "bfloat16"),
    ("fpu avx2 avx512f", "float32"), ("", "float32"),
])
def test_auto_dtype_follows_the_cpu(flags, expected):
    assert resolve_dtype("auto", flags) == expected
    assert resolve_dtype("float32", flags) == "float32" and resolve_dtype("bfloat16", "") == "bfloat16"
