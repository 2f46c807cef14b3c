"""Reward functions: small pure rules shared by the evaluation harness and the Flow-GRPO trainer.

``score(kind, prediction, record)`` is the entry point (see ``registry``); the building blocks are importable for
other uses: text normalisation, exact match and token F1 (``text``), numbers (``numeric``), multiple choice
(``choice``), Game of 24 (``game24``) and the optional LLM judge (``judge``). ``score_records`` puts the rule reward
on trajectory records (``records``), for the memory service and the trainer alike.
"""

from agentflow.rewards.choice import chosen_letter, choice_match, gold_letter, options_of
from agentflow.rewards.game24 import check_24, numbers_of, score_24
from agentflow.rewards.judge import Judge, parse_verdict
from agentflow.rewards.numeric import final_number, numbers_in, numeric_match, parse_number, same_value
from agentflow.rewards.records import score_record, score_records
from agentflow.rewards.registry import (F1_THRESHOLD, KINDS, get_kind, ground_truth_text, kind_names, register,
                                        score)
from agentflow.rewards.text import as_answers, exact_match, extract_answer, normalise_answer, token_f1

__all__ = [
    "F1_THRESHOLD", "KINDS", "Judge", "as_answers", "check_24", "choice_match", "chosen_letter", "exact_match",
    "extract_answer", "final_number", "get_kind", "gold_letter", "ground_truth_text", "kind_names", "normalise_answer",
    "numbers_in", "numbers_of", "numeric_match", "options_of", "parse_number", "parse_verdict", "register",
    "same_value", "score", "score_24", "score_record", "score_records", "token_f1",
]
