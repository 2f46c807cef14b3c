"""Reading module outputs: JSON when the model produced it, labelled text sections otherwise.

Every parser either returns a value or raises ParseFailure with a message saying what was missing; the loop
records that message in memory and carries on.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass

from agentflow.errors import ParseFailure

# Names models commonly use for our tools (AgentFlow's own prompts and close variants).
TOOL_ALIASES = {
    "python": ["python_coder", "python_code_generator", "code", "code_interpreter", "calculator", "py"],
    "search": ["local_search", "bm25", "retrieval", "retriever", "document_search"],
    "wikipedia": ["wikipedia_search", "wiki", "wiki_search", "wikipedia_knowledge_searcher"],
    "web_search": ["google_search", "web", "internet_search", "google", "bing"],
    "generalist": ["base_generator", "generalist_solution_generator", "llm", "general", "reasoning"],
}


@dataclass
class PlanDecision:
    sub_goal: str
    tool: str
    context: str = ""


def plan_schema(tools: list[str]) -> dict:
    """JSON schema for structured planner output; the tool is a closed choice."""
    return {
        "type": "object",
        "properties": {"context": {"type": "string"}, "sub_goal": {"type": "string"},
                       "tool": {"type": "string", "enum": list(tools)}},
        "required": ["context", "sub_goal", "tool"],
        "additionalProperties": False,
    }


VERDICT_SCHEMA = {
    "type": "object",
    "properties": {"analysis": {"type": "string"}, "conclusion": {"type": "string", "enum": ["STOP", "CONTINUE"]}},
    "required": ["analysis", "conclusion"],
    "additionalProperties": False,
}


def _slug(name: str) -> str:
    name = re.sub(r"[*`\"'\[\]()]", "", name).strip().lower()
    name = re.sub(r"[\s\-]+", "_", name)
    return re.sub(r"_?tool$", "", name)


def normalise_tool(raw: str, allowed: list[str]) -> str:
    """Map a model's tool name onto one of ``allowed``; raise ParseFailure naming the choices when none fits."""
    slug = _slug(raw)
    if not slug:
        raise ParseFailure("no tool named")
    for name in allowed:
        if slug == name or slug in TOOL_ALIASES.get(name, ()):
            return name
    close = difflib.get_close_matches(slug, allowed, n=1, cutoff=0.75)
    if close:
        return close[0]
    raise ParseFailure(f"unknown tool {raw.strip()[:60]!r}; choose one of {', '.join(allowed)}")


_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\s*\n(.*?)```", re.S)


def _json_object(text: str) -> dict | None:
    """The first JSON object in ``text`` (bare, or inside a markdown fence), or None."""
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    for candidate in candidates:
        start = candidate.find("{")
        while start != -1:
            try:
                value, _ = json.JSONDecoder().raw_decode(candidate[start:])
            except json.JSONDecodeError:
                start = candidate.find("{", start + 1)
                continue
            if isinstance(value, dict):
                return value
            start = candidate.find("{", start + 1)
    return None


def _key(name: str) -> str:
    return re.sub(r"[^a-z]", "", name.lower())


def _field(data: dict, *names: str) -> str:
    wanted = {_key(n) for n in names}
    for k, v in data.items():
        if _key(k) in wanted and v is not None:
            return str(v).strip()
    return ""


# "Sub-Goal: ...", "**Tool Name:** ...", "## Context", "1. Tool: ..." — the value runs to the next label. Without a
# colon a label must end its line (a heading): "Answer the question ..." is prose, not the answer.
_LABEL = re.compile(
    r"^[ \t]*(?:[-*]|\d+\.)?[ \t]*#*[ \t]*\**[ \t]*"
    r"(justification|context|sub[ _-]?goal|tool(?:[ _-]?name)?|selected[ _]tool|command|analysis|conclusion|answer)"
    r"[ \t]*\**[ \t]*(?::[ \t]*\**[ \t]*:?|\**[ \t]*$)",
    re.I | re.M,
)


def labelled_sections(text: str) -> dict[str, str]:
    """Split text into {label: value}; a label that repeats keeps its first non-empty value."""
    sections: dict[str, str] = {}
    matches = list(_LABEL.finditer(text))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        label = _key(m.group(1))
        label = "tool" if label.startswith(("tool", "selectedtool")) else label
        value = text[m.end():end].strip().strip("*").strip()
        if value and not sections.get(label):
            sections[label] = value
    return sections


def parse_plan(text: str, allowed: list[str]) -> PlanDecision:
    data = _json_object(text)
    if data is not None and _field(data, "tool", "tool_name", "selected_tool"):
        sub_goal = _field(data, "sub_goal", "subgoal", "goal")
        tool = _field(data, "tool", "tool_name", "selected_tool")
        context = _field(data, "context")
    else:
        sections = labelled_sections(text)
        sub_goal, tool, context = sections.get("subgoal", ""), sections.get("tool", ""), sections.get("context", "")
        tool = tool.splitlines()[0] if tool else ""
    if not tool:
        raise ParseFailure("planner output names no tool (expected a 'Tool:' line or JSON with \"tool\")")
    if not sub_goal:
        raise ParseFailure("planner output has no sub-goal (expected a 'Sub-Goal:' line or JSON with \"sub_goal\")")
    return PlanDecision(sub_goal=sub_goal, tool=normalise_tool(tool, allowed), context=context)


def parse_command(text: str) -> str:
    """The tool input: JSON {"command": ...}, else a fenced block, else a 'Command:' section, else the text."""
    data = _json_object(text)
    if data is not None and _field(data, "command", "code", "query", "input"):
        return _field(data, "command", "code", "query", "input")
    fence = _FENCE.search(text)
    if fence and fence.group(1).strip():
        return fence.group(1).strip()
    command = labelled_sections(text).get("command", "") or text.strip()
    if not command:
        raise ParseFailure("executor produced an empty command")
    return command


def parse_verdict(text: str) -> tuple[str, str]:
    """(analysis, "STOP" | "CONTINUE"); raises ParseFailure when the conclusion is missing or ambiguous."""
    data = _json_object(text)
    if data is not None and _field(data, "conclusion", "verdict", "decision"):
        conclusion, analysis = _field(data, "conclusion", "verdict", "decision"), _field(data, "analysis")
    else:
        sections = labelled_sections(text)
        conclusion, analysis = sections.get("conclusion", ""), sections.get("analysis", text.strip())
    words = set(re.findall(r"\b(STOP|CONTINUE)\b", conclusion.upper() or text.upper()))
    if len(words) != 1:
        found = " and ".join(sorted(words)) or "neither"
        raise ParseFailure(f"verifier conclusion must be STOP or CONTINUE, found {found}")
    return analysis, words.pop()


_PLACEHOLDER = re.compile(r"<[^<>\n]*>")  # a template's slot, as answer.md's "Answer: <the answer alone>"


def parse_answer(text: str) -> str:
    """The generator's answer; an 'Answer:' section wins over the surrounding explanation. The prompt's placeholder
    echoed back (``<the answer alone>``) is no answer: ""."""
    data = _json_object(text)
    if data is not None and _field(data, "answer"):
        answer = _field(data, "answer")
    else:
        answer = labelled_sections(text).get("answer", "") or text.strip()
    return "" if _PLACEHOLDER.fullmatch(answer) else answer
