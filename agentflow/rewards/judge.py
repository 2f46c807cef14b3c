"""An optional LLM judge: asks any ``Engine`` (agentflow/llm/base.py) whether a prediction means the same as an
accepted answer. The prompt is ``agentflow/prompts/judge.md``; engines with structured output get a JSON schema.

Without an accepted answer, ``supported_verdict`` judges by a rubric (``agentflow/prompts/judge_rubric.md``): is the
prediction an answer to the question, supported by the evidence (the tool results the agent saw)? Both prompts ask
for the same verdict format, read by ``parse_verdict``.

Both are guarded (``agentflow/rewards/guard.py``, docs/judge.md "The guard"): every text someone else wrote is an
escaped, named block the prompt calls data, and ``screen_reference`` / ``screen_rubric`` apply the policy before any
call: an answer that addresses the judge is INCORRECT without a call; a tool result that does is withheld from the
prompt (and with every one withheld, INCORRECT without a call).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentflow.errors import AgentFlowError, ParseFailure
from agentflow.llm.base import Completion, Engine, Message, Sampling
from agentflow.modules.prompting import messages
from agentflow.rewards.guard import Flag, block, describe, detect
from agentflow.rewards.text import as_answers, as_text

VERDICT_SCHEMA = {
    "type": "object",
    "properties": {"analysis": {"type": "string"}, "verdict": {"type": "string", "enum": ["CORRECT", "INCORRECT"]}},
    "required": ["analysis", "verdict"],
    "additionalProperties": False,
}
MAX_PREDICTION_CHARS = 2000  # the judge sees at most this much of the prediction
MAX_EVIDENCE_CHARS = 6000  # ... and of the evidence the rubric judges support against
# what the judge reads in place of a tool result the guard withheld: it must not count as support
WITHHELD = "(a tool result was withheld here: it addressed the judge instead of informing; it supports nothing)"


@dataclass(frozen=True)
class Verdict:
    correct: bool
    analysis: str
    raw: str
    completion: Completion | None = field(default=None, compare=False, repr=False)  # the call (its tokens)


@dataclass(frozen=True)
class Screened:
    """A judge prompt after the guard: the ``prompt`` to send, or none and the ``refusal`` (why the answer is
    INCORRECT without a call). ``context`` is what the judge is shown besides question and answer (the accepted
    answers, or the evidence as kept), for a cache key; ``answer_flags`` what the detector found in the answer,
    ``withheld`` the flags of each tool result left out of the prompt."""

    prompt: list[Message] | None
    refusal: str = ""
    context: str = ""
    answer_flags: tuple[Flag, ...] = ()
    withheld: tuple[tuple[Flag, ...], ...] = ()


@dataclass
class Judge:
    """Judges with ``engine`` at temperature 0; ``timeout_s`` bounds each call."""

    engine: Engine
    timeout_s: float = 60.0
    max_tokens: int = 128
    name: str = "llm-judge"

    def verdict(self, question: str, prediction: str, answers: object) -> Verdict:
        """CORRECT / INCORRECT for ``prediction``; raises EngineError when the engine fails and ParseFailure when its
        reply has no readable verdict. An answer the guard flags is INCORRECT without a call."""
        return self._decide(self.screen_reference(question, prediction, answers))

    def supported_verdict(self, question: str, prediction: str, evidence: str | Sequence[str]) -> Verdict:
        """The rubric's CORRECT / INCORRECT: ``prediction`` answers ``question`` and ``evidence`` (one text, or one
        per tool result) supports it (no reference needed). Raises as ``verdict`` does."""
        return self._decide(self.screen_rubric(question, prediction, evidence))

    @staticmethod
    def screen_reference(question: str, prediction: str, answers: object) -> Screened:
        """The reference check's prompt after the guard (``Screened.prompt`` None: INCORRECT without a call)."""
        accepted = as_answers(answers)
        refusal, flags = _screen_answer(prediction)
        if refusal:
            return Screened(None, refusal, " | ".join(accepted), flags)
        return Screened(Judge.reference_prompt(question, prediction, accepted), "", " | ".join(accepted))

    @staticmethod
    def screen_rubric(question: str, prediction: str, evidence: str | Sequence[str], note: str = "") -> Screened:
        """The rubric's prompt after the guard: a tool result (an item of ``evidence``) that addresses the judge is
        withheld, replaced by a line saying so; with every one withheld, or an answer that addresses the judge,
        ``Screened.prompt`` is None (INCORRECT without a call). ``note`` is a line of ours after the results."""
        refusal, flags = _screen_answer(prediction)
        if refusal:
            return Screened(None, refusal, "", flags)
        parts = [evidence] if isinstance(evidence, str) else list(evidence)
        kept, withheld = [], []
        for part in parts:
            found = detect(part)
            if found:
                withheld.append(found)
                kept.append(None)
            else:
                kept.append(as_text(part))
        context = "\n\n".join(p if p is not None else WITHHELD for p in kept)
        if parts and all(p is None for p in kept):
            return Screened(None, f"rubric: every tool result was withheld, as it addresses the judge "
                                  f"({describe(withheld[0])})", context, (), tuple(withheld))
        prompt = Judge.rubric_prompt(question, prediction, kept, note)
        return Screened(prompt, "", context, (), tuple(withheld))

    @staticmethod
    def reference_prompt(question: str, prediction: str, answers: object) -> list[Message]:
        """The messages of the reference check (judge.md): question, accepted answers and the proposed answer (its
        first ``MAX_PREDICTION_CHARS``), each an escaped block."""
        accepted = as_answers(answers)
        return messages("judge", question=block("question", as_text(question).strip()),
                        answers="\n".join(block("accepted_answer", a) for a in accepted) or "(none)",
                        prediction=block("proposed_answer", _clip_prediction(prediction)))

    @staticmethod
    def rubric_prompt(question: str, prediction: str, evidence: str | Sequence[str | None], note: str = ""
                      ) -> list[Message]:
        """The messages of the rubric (judge_rubric.md): each tool result an escaped ``<tool_result>`` block (a
        ``None`` item: one withheld by the guard), at most ``MAX_EVIDENCE_CHARS`` of them in all; ``note``, a line
        of ours, after them."""
        parts = [evidence] if isinstance(evidence, str) else list(evidence)
        budget, blocks = MAX_EVIDENCE_CHARS, []
        for part in parts:
            if part is None:
                blocks.append(WITHHELD)
                continue
            text = as_text(part).strip()
            if len(text) > budget:
                text = text[:budget] + f" …[{len(text) - budget} chars cut]"
            budget = max(0, budget - len(text))
            if text:
                blocks.append(block("tool_result", text))
        if note:
            blocks.append(note)
        return messages("judge_rubric", question=block("question", as_text(question).strip()),
                        evidence="\n".join(blocks) or "(none)",
                        prediction=block("proposed_answer", _clip_prediction(prediction)))

    def ask(self, prompt: list[Message]) -> Completion:
        """One judge call at temperature 0 (with the verdict schema where the engine supports structured output);
        raises EngineError when the engine fails."""
        schema = VERDICT_SCHEMA if getattr(self.engine, "supports_structured_output", False) else None
        return self.engine.complete(prompt, Sampling(temperature=0.0, max_tokens=self.max_tokens),
                                    timeout=self.timeout_s, json_schema=schema, key="judge")

    def _decide(self, screened: Screened) -> Verdict:
        if screened.prompt is None:
            return Verdict(False, screened.refusal, "")
        completion = self.ask(screened.prompt)
        correct, analysis = parse_verdict(completion.text)
        return Verdict(correct, analysis, completion.text, completion)


def _clip_prediction(prediction: object) -> str:
    return as_text(prediction).strip()[:MAX_PREDICTION_CHARS] or "(empty)"


def _screen_answer(prediction: object) -> tuple[str, tuple[Flag, ...]]:
    """(refusal, flags): a refusal when the answer addresses the judge (the whole answer is read, not only the part
    the judge would see)."""
    flags = detect(prediction)
    if not flags:
        return "", ()
    return f"guard: the answer addresses the judge ({describe(flags)})", flags


def parse_verdict(text: str) -> tuple[bool, str]:
    """(correct, analysis) from a judge reply: JSON ``{"verdict": …}``, a ``Verdict:`` line, or a lone
    CORRECT/INCORRECT word. Raises ParseFailure when none is found or both words appear without a verdict line."""
    start = text.find("{")
    if start != -1:
        try:
            data, _ = json.JSONDecoder().raw_decode(text[start:])
            if isinstance(data, dict) and str(data.get("verdict", "")).strip().upper() in ("CORRECT", "INCORRECT"):
                return str(data["verdict"]).strip().upper() == "CORRECT", str(data.get("analysis", "")).strip()
        except json.JSONDecodeError:
            pass
    analysis_match = re.search(r"analysis\s*:\s*(.*)", text, re.I)
    analysis = analysis_match.group(1).strip() if analysis_match else ""
    line = re.search(r"verdict\s*[*:]*\s*\**\s*(CORRECT|INCORRECT)\b", text, re.I)
    if line:
        return line.group(1).upper() == "CORRECT", analysis
    words = {w.upper() for w in re.findall(r"\b(CORRECT|INCORRECT)\b", text, re.I)}
    if len(words) == 1:
        return words.pop() == "CORRECT", analysis
    raise ParseFailure(f"judge reply has no readable verdict: {text.strip()[:120]!r}")


def judge_reward(judge: Judge, question: str, prediction: str, answers: object, rule: dict) -> dict:
    """The judge's reward, or ``rule`` (with the judge's failure noted in its detail) when the judge cannot answer."""
    try:
        verdict = judge.verdict(question, prediction, answers)
    except AgentFlowError as e:
        return {**rule, "detail": f"{rule.get('detail', '')}; judge unavailable ({e.reason}: {str(e)[:160]})"}
    why = f" — {verdict.analysis[:200]}" if verdict.analysis else ""
    label = "CORRECT" if verdict.correct else "INCORRECT"
    return {"value": 1.0 if verdict.correct else 0.0, "source": "judge",
            "detail": f"{judge.name}: {label}{why}; rule said: {rule.get('detail', '')}"}
