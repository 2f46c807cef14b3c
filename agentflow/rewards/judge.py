"""An optional LLM judge: asks any ``Engine`` (agentflow/llm/base.py) whether a prediction means the same as an
accepted answer. The prompt is ``agentflow/prompts/judge.md``; engines with structured output get a JSON schema.

Without an accepted answer, ``supported_verdict`` judges by a rubric (``agentflow/prompts/judge_rubric.md``): is the
prediction an answer to the question, supported by the evidence (the tool results the agent saw)? Both prompts ask
for the same verdict format, read by ``parse_verdict``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from agentflow.errors import AgentFlowError, ParseFailure
from agentflow.llm.base import Completion, Engine, Message, Sampling
from agentflow.modules.prompting import messages
from agentflow.rewards.text import as_answers, as_text

VERDICT_SCHEMA = {
    "type": "object",
    "properties": {"analysis": {"type": "string"}, "verdict": {"type": "string", "enum": ["CORRECT", "INCORRECT"]}},
    "required": ["analysis", "verdict"],
    "additionalProperties": False,
}
MAX_PREDICTION_CHARS = 2000  # the judge sees at most this much of the prediction
MAX_EVIDENCE_CHARS = 6000  # ... and of the evidence the rubric judges support against


@dataclass(frozen=True)
class Verdict:
    correct: bool
    analysis: str
    raw: str
    completion: Completion | None = field(default=None, compare=False, repr=False)  # the call (its tokens)


@dataclass
class Judge:
    """Judges with ``engine`` at temperature 0; ``timeout_s`` bounds each call."""

    engine: Engine
    timeout_s: float = 60.0
    max_tokens: int = 128
    name: str = "llm-judge"

    def verdict(self, question: str, prediction: str, answers: object) -> Verdict:
        """CORRECT / INCORRECT for ``prediction``; raises EngineError when the engine fails and ParseFailure when its
        reply has no readable verdict."""
        return self._decide(self.reference_prompt(question, prediction, answers))

    def supported_verdict(self, question: str, prediction: str, evidence: str) -> Verdict:
        """The rubric's CORRECT / INCORRECT: ``prediction`` answers ``question`` and ``evidence`` supports it (no
        reference needed). Raises as ``verdict`` does."""
        return self._decide(self.rubric_prompt(question, prediction, evidence))

    @staticmethod
    def reference_prompt(question: str, prediction: str, answers: object) -> list[Message]:
        """The messages of the reference check (judge.md)."""
        accepted = as_answers(answers)
        return messages("judge", question=as_text(question).strip(), answers=" | ".join(accepted) or "(none)",
                        prediction=as_text(prediction).strip()[:MAX_PREDICTION_CHARS] or "(empty)")

    @staticmethod
    def rubric_prompt(question: str, prediction: str, evidence: str) -> list[Message]:
        """The messages of the rubric (judge_rubric.md); ``evidence`` is clipped to ``MAX_EVIDENCE_CHARS``."""
        evidence = as_text(evidence).strip()
        if len(evidence) > MAX_EVIDENCE_CHARS:
            evidence = evidence[:MAX_EVIDENCE_CHARS] + f" …[{len(evidence) - MAX_EVIDENCE_CHARS} chars cut]"
        return messages("judge_rubric", question=as_text(question).strip(), evidence=evidence or "(none)",
                        prediction=as_text(prediction).strip()[:MAX_PREDICTION_CHARS] or "(empty)")

    def ask(self, prompt: list[Message]) -> Completion:
        """One judge call at temperature 0 (with the verdict schema where the engine supports structured output);
        raises EngineError when the engine fails."""
        schema = VERDICT_SCHEMA if getattr(self.engine, "supports_structured_output", False) else None
        return self.engine.complete(prompt, Sampling(temperature=0.0, max_tokens=self.max_tokens),
                                    timeout=self.timeout_s, json_schema=schema, key="judge")

    def _decide(self, prompt: list[Message]) -> Verdict:
        completion = self.ask(prompt)
        correct, analysis = parse_verdict(completion.text)
        return Verdict(correct, analysis, completion.text, completion)


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
