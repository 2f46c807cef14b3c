"""Module-output parsing against well-formed and adversarial model outputs."""

import pytest

from agentflow.errors import ParseFailure
from agentflow.domain.parsing import (
    normalise_tool,
    parse_answer,
    parse_command,
    parse_plan,
    parse_verdict,
)

TOOLS = ["python", "search", "generalist", "web_search"]


def test_plan_from_json():
    d = parse_plan('{"context": "x=3", "sub_goal": "square x", "tool": "python"}', TOOLS)
    assert (d.sub_goal, d.tool, d.context) == ("square x", "python", "x=3")


def test_plan_from_json_in_markdown_fence_with_chatter():
    text = "Sure! Here is my plan:\n```json\n{\"Sub-Goal\": \"find the capital\", \"Tool_Name\": \"Search_Tool\"}\n```"
    d = parse_plan(text, TOOLS)
    assert (d.sub_goal, d.tool) == ("find the capital", "search")


def test_plan_from_labelled_text():
    text = "Context: none yet\nSub-Goal: compute 1234*5678\nTool Name: Python_Coder_Tool\n"
    d = parse_plan(text, TOOLS)
    assert (d.sub_goal, d.tool, d.context) == ("compute 1234*5678", "python", "none yet")


def test_plan_from_markdown_bold_and_headings():
    text = "## Context\nnothing\n**Sub-Goal:** look up Veloria\n**Tool Name:** `search`"
    d = parse_plan(text, TOOLS)
    assert (d.sub_goal, d.tool) == ("look up Veloria", "search")


def test_repeated_sections_keep_the_first():
    text = "Sub-Goal: first goal\nTool Name: python\nSub-Goal: second goal\nTool Name: search"
    d = parse_plan(text, TOOLS)
    assert (d.sub_goal, d.tool) == ("first goal", "python")


def test_missing_tool_is_a_parse_failure():
    with pytest.raises(ParseFailure, match="no tool"):
        parse_plan("Sub-Goal: do something clever", TOOLS)


def test_missing_sub_goal_is_a_parse_failure():
    with pytest.raises(ParseFailure, match="sub-goal"):
        parse_plan("Tool Name: python", TOOLS)


def test_unknown_tool_names_the_choices():
    with pytest.raises(ParseFailure, match="unknown tool 'Time_Machine'.*python, search"):
        parse_plan("Sub-Goal: go back\nTool Name: Time_Machine", TOOLS)


def test_garbage_is_a_parse_failure():
    with pytest.raises(ParseFailure):
        parse_plan("}{ ]] random ``` noise", TOOLS)


@pytest.mark.parametrize("raw,expected", [
    ("Python", "python"), ("python_tool", "python"), ("Python_Coder_Tool", "python"), ("**search**", "search"),
    ("Web Search", "web_search"), ("Google_Search_Tool", "web_search"), ("Base_Generator_Tool", "generalist"),
    ("serch", "search"), ("`generalist`", "generalist"),
])
def test_tool_normalisation(raw, expected):
    assert normalise_tool(raw, TOOLS) == expected


def test_alias_of_a_tool_that_is_not_enabled_is_unknown():
    with pytest.raises(ParseFailure):
        normalise_tool("wikipedia_search", ["python", "search"])


def test_command_from_fence_json_label_and_plain():
    assert parse_command("Here:\n```python\nprint(2+2)\n```\nDone.") == "print(2+2)"
    assert parse_command('{"command": "capital of Veloria"}') == "capital of Veloria"
    assert parse_command("Command: capital of Veloria") == "capital of Veloria"
    assert parse_command("  print(1)  ") == "print(1)"
    with pytest.raises(ParseFailure):
        parse_command("   ")


def test_verdict_forms():
    assert parse_verdict("Analysis: all good.\nConclusion: STOP") == ("all good.", "STOP")
    assert parse_verdict('{"analysis": "need more", "conclusion": "CONTINUE"}') == ("need more", "CONTINUE")
    assert parse_verdict("**Conclusion:** **STOP**")[1] == "STOP"


def test_ambiguous_or_missing_verdict_is_a_parse_failure():
    with pytest.raises(ParseFailure, match="CONTINUE and STOP"):
        parse_verdict("Conclusion: STOP or CONTINUE, hard to say")
    with pytest.raises(ParseFailure, match="neither"):
        parse_verdict("I think we are done.")


def test_answer_prefers_the_answer_line():
    assert parse_answer("The product is large.\nAnswer: 7006652") == "7006652"
    assert parse_answer("just text") == "just text"
    # a line that starts with the word is prose, not the label (a small model echoing its instructions)
    assert parse_answer("Step 0 printed 9.\nAnswer the question using the steps above.\nAnswer: 9") == "9"
    assert parse_answer("## Answer\n9") == "9" and parse_answer("**Answer**: 9") == "9"
    assert parse_answer('{"answer": "Paris"}') == "Paris"


def test_the_prompts_placeholder_echoed_back_is_no_answer():
    assert parse_answer("I cannot tell.\nAnswer: <the answer alone>") == ""
    assert parse_answer('{"answer": "<answer>"}') == "" and parse_answer("<the answer alone>") == ""
    assert parse_answer("Answer: 3 < 4 > 2") == "3 < 4 > 2" and parse_answer("Answer: <b>bold</b>") == "<b>bold</b>"
