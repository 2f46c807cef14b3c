"""What judging one finished record takes (docs/judge.md), pure: whether a record is sampled (``sample_point``),
its accepted answers (``reference_answers``), the tool results it saw (``evidence_parts``), and the ``Case`` built
from it after the guard (``judge_case``): a reward without a call, or the screened prompt to ask; then the reward a
verdict makes (``verdict_reward``). Records are dicts (``agentflow.domain.convert.record_from_proto``)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from agentflow.rewards.judge import MAX_EVIDENCE_CHARS, Judge, Screened
from agentflow.rewards.text import as_answers

NO_ANSWER_STATUSES = ("error", "cancelled")
DETAIL_CHARS = 500  # a reward's detail is at most this long
_STEP_MIN_CHARS = 300  # each tool result keeps at least this much when the evidence budget is shared
_STEP_HEADER_CHARS = 260  # a result's "[step N] tool: command" line (the command clipped to 200)


def sample_point(trajectory_id: str) -> float:
    """A stable point in [0, 1) for a trajectory id: it is sampled when the point is below the share."""
    return int.from_bytes(hashlib.sha256(trajectory_id.encode()).digest()[:8], "big") / 2**64


def reference_answers(ground_truth: str) -> list[str]:
    """A record's accepted answers: its ground truth, or the answers of a JSON list (several accepted answers are
    stored that way, agentflow.rewards.ground_truth_text)."""
    text = (ground_truth or "").strip()
    if text.startswith("["):
        try:
            listed = json.loads(text)
        except ValueError:
            listed = None
        if isinstance(listed, list) and (answers := as_answers(listed)):
            return answers
    return as_answers(text)


def evidence_parts(record: dict, limit: int = MAX_EVIDENCE_CHARS) -> tuple[list[str], str]:
    """The tool results the agent saw, one text each (``[step N] tool: command`` and the result; the summary of
    compacted steps first), oldest first, from the record's final memory (the turns' results when the memory has no
    steps), and a note of ours on what was left out. At most ``limit`` characters: each result gets an equal share;
    past the limit the oldest are left out. Failed tool calls are not evidence. No parts: no tool call returned a
    result."""
    memory = record.get("memory") or {}
    steps = memory.get("steps") or []
    if not steps and not memory.get("summary"):
        steps = [{"step": t.get("step", i), "tool": (t.get("decision") or {}).get("tool", ""),
                  "command": t.get("command", ""), "result": t.get("result", ""), "error": t.get("tool_error", "")}
                 for i, t in enumerate(record.get("turns") or [])]
    results = [s for s in steps if (s.get("result") or "").strip() and not s.get("error")]
    share = max(_STEP_MIN_CHARS, limit // max(1, len(results)) - _STEP_HEADER_CHARS)
    parts = []
    for s in results:
        result = s["result"].strip()
        if len(result) > share:
            result = result[:share] + f" …[{len(result) - share} chars cut]"
        command = " ".join((s.get("command") or "").split())[:200]
        parts.append(f"[step {s.get('step', '?')}] {s.get('tool') or 'tool'}: {command}\n{result}")
    if memory.get("summary"):
        parts.insert(0, f"Earlier steps (summarised):\n{memory['summary'].strip()}")
    kept, size, note = [], 0, ""
    for part in reversed(parts):  # the latest results first: the answer is most likely drawn from them
        if kept and size + len(part) > limit - 64:  # room for the note
            note = f"({len(parts) - len(kept)} earlier result(s) left out)"
            break
        kept.append(part)
        size += len(part) + 2
    return list(reversed(kept)), note


def evidence(record: dict, limit: int = MAX_EVIDENCE_CHARS) -> str:
    """``evidence_parts`` as one text (the note first). Empty when no tool call returned a result."""
    parts, note = evidence_parts(record, limit)
    return "\n\n".join([note, *parts] if note else parts)


@dataclass(frozen=True)
class Case:
    """What judging one record takes: a ``reward`` decided without a call (and the records ``outcome`` it counts
    as), or the ``screened`` prompt to ask."""

    mode: str = ""
    screened: Screened | None = None
    reward: dict | None = None
    outcome: str = ""


def judge_case(record: dict, author: str) -> Case:
    """What judging ``record`` takes, after the guard (docs/judge.md, "The guard"): a reward without a call when
    there is no answer, no evidence, an answer that addresses the judge, or only evidence that does; else the
    screened prompt. ``author``: the judge's name, the author of its rewards."""
    answer, status = (record.get("answer") or "").strip(), record.get("status") or ""
    if status in NO_ANSWER_STATUSES or not answer:
        why = f"status {status}" if status in NO_ANSWER_STATUSES else "the answer is empty"
        return Case(reward=reward_by(author, 0.0, f"no answer to judge: {why}"), outcome="no_answer")
    question = record.get("query") or ""
    answers = reference_answers(record.get("ground_truth") or "")
    if answers:
        mode, screened = "reference", Judge.screen_reference(question, answer, answers)
    else:
        mode, (parts, note) = "rubric", evidence_parts(record)
        if not parts:
            return Case(mode, reward=reward_by(author, 0.0, "rubric: no tool result in the record's memory "
                                                               "supports the answer"), outcome="no_evidence")
        screened = Judge.screen_rubric(question, answer, parts, note)
    if screened.answer_flags:
        return Case(mode, screened, reward_by(author, 0.0, f"INCORRECT ({mode}): {screened.refusal}"), "injection")
    if screened.prompt is None:  # every tool result withheld
        return Case(mode, screened, reward_by(author, 0.0, screened.refusal), "no_evidence")
    return Case(mode, screened)


def verdict_reward(case: Case, correct: bool, analysis: str, author: str) -> dict:
    """The reward the judge's verdict on ``case`` makes, noting the tool results the guard withheld."""
    label = "CORRECT" if correct else "INCORRECT"
    count = len(case.screened.withheld)
    withheld = f" [{count} tool result(s) withheld by the guard]" if count else ""
    detail = f"{label} ({case.mode}): {analysis}" if analysis else f"{label} ({case.mode})"
    return reward_by(author, 1.0 if correct else 0.0, detail + withheld)


def reward_by(author: str, value: float, detail: str, source: str = "judge") -> dict:
    """A reward of the judge named ``author`` (a dict of ``agentflow.v1.Reward``'s fields), its detail cut to
    ``DETAIL_CHARS``."""
    return {"value": value, "source": source, "detail": detail[:DETAIL_CHARS], "author": author}
