"""Reward rules with known right and wrong answers for every kind, and the building blocks they share."""

from fractions import Fraction

import pytest

from agentflow.errors import EngineError, InvalidInput
from agentflow.llm.base import Completion
from agentflow.llm.scripted import ScriptedEngine
from agentflow.rewards import (Judge, as_answers, check_24, chosen_letter, exact_match, extract_answer, final_number,
                               gold_letter, ground_truth_text, normalise_answer, numbers_in, numbers_of,
                               numeric_match, options_of, parse_number, parse_verdict, score, token_f1)

# Records shaped like the files in ../shared/benchmarks (see NOTICE.md there).
BAMBOOGLE = {"pid": "0", "query": "Who was president of the United States in the year that Citibank was founded?"
             "When ready, output the final answer enclosed in <answer> and </answer> tags.",
             "question": "Who was president …", "answer": ["james madison"]}
TWOWIKI = {"pid": 1, "query": "When is the director of film Les Tuche 2 's birthday?", "answer": "5 January 1964"}
AIME = {"pid": "0", "query": "… Find $m+n$.", "question": "… Find $m+n$.", "answer": 33}
MEDQA = {"pid": "0", "query": "Which … risk?\nA. Hemolytic uremic syndrome\nB. Oral ulcers\nC. Colorectal cancer\n"
         "D. Pancreatic cancer\nChoose the correct option.",
         "options": ["A. Hemolytic uremic syndrome", "B. Oral ulcers", "C. Colorectal cancer", "D. Pancreatic cancer"],
         "answer": "Colorectal cancer"}
GAME = {"pid": "5", "question": [1, 1, 2, 7], "answer": ["(7+1)×(2+1)"],
        "query": "Using the numbers [1, 1, 2, 7], create an expression that equals 24. …"}


# --- normalisation, extraction, exact match, F1 --------------------------------------------------------------------
@pytest.mark.parametrize("raw,expected", [
    ("The Eiffel Tower", "eiffel tower"),
    ("  an   Apple,  a day!  ", "apple day"),
    ("Gülçiçek Hatun", "gulcicek hatun"),
    ("Let'S Make Money", "lets make money"),
    ("U.S.A.", "usa"),
    ("Saint-Denis", "saint denis"),
    ("Saint\u2013Denis", "saint denis"),
    ("ＦＵＬＬＷＩＤＴＨ", "fullwidth"),
    ("138,535", "138535"),
    ("Theater", "theater"),  # "the" is removed only as a whole word
    (None, ""),
    (33, "33"),
])
def test_normalise_answer(raw, expected):
    assert normalise_answer(raw) == expected


@pytest.mark.parametrize("output,expected", [
    ("reasoning … <answer> James Madison </answer>", "James Madison"),
    ("<answer>first</answer> then <answer>second</answer>", "second"),
    ("<answer>unclosed to the end", "unclosed to the end"),
    ("so the result is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
    ("It follows.\nAnswer: **42**\n", "42"),
    ("Final Answer: Paris", "Paris"),
    ("The answer is: 2018", "2018"),
    ("I think the answer is yes. The answer is yes.", "yes"),
    ("So the final answer is 3.5 meters. Done.", "3.5 meters"),
    ("The answer is: The answer is: Paris", "Paris"),
    ("just text", "just text"),
    ("", ""),
])
def test_extract_answer(output, expected):
    assert extract_answer(output) == expected


def test_exact_match_against_one_or_several_answers():
    assert exact_match("James Madison.", ["james madison"])
    assert exact_match("the Titan IIIE", ["Titan IIIE", "Titan 3E"])
    assert exact_match("Titan 3E", ["Titan IIIE", "Titan 3E"])
    assert exact_match("5 January 1964", "5 January 1964")
    assert not exact_match("James Monroe", ["james madison"])
    assert not exact_match("", ["james madison"])
    assert not exact_match("anything", [])


def test_token_f1_takes_the_best_answer_and_respects_yes_no():
    assert token_f1("Kurt Weill", ["Kurt Julian Weill"]) == pytest.approx(0.8)
    assert token_f1("Madison", ["someone else", "james madison"]) == pytest.approx(2 / 3)
    assert token_f1("March 4, 1797", ["4 March 1797"]) == 1.0
    assert token_f1("yes", "no") == 0.0
    assert token_f1("no", ["no"]) == 1.0
    assert token_f1("yes it is", ["yes"]) == 0.0  # a yes/no answer must be the bare word
    assert token_f1("", ["x"]) == 0.0
    assert token_f1("x", []) == 0.0


def test_as_answers_reads_strings_lists_and_numbers():
    assert as_answers(["a", "", " b "]) == ["a", "b"]
    assert as_answers("x") == ["x"]
    assert as_answers(33) == ["33"]
    assert as_answers(None) == []


# --- numbers -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,value", [
    ("33", 33), ("-7", -7), ("\u22125", -5), ("3.25", Fraction(13, 4)), (".5", Fraction(1, 2)),
    ("1,234,567", 1234567), ("$1,234.50", Fraction(246900, 200)), ("3/4", Fraction(3, 4)),
    ("\\frac{3}{4}", Fraction(3, 4)), ("\\dfrac{10}{4}", Fraction(5, 2)), ("1e3", 1000),
    ("about 12 apples", 12),
])
def test_parse_number(text, value):
    number = parse_number(text)
    assert number is not None and number.value == value


def test_numbers_in_handles_lists_ranges_and_sentence_ends():
    assert [n.value for n in numbers_in("1,2,3")] == [1, 2, 3]
    assert [n.value for n in numbers_in("pages 3-4")] == [3, 4]
    assert [n.value for n in numbers_in("between 1,000 and 2,000.")] == [1000, 2000]
    assert [n.value for n in numbers_in("5 - 3 = 2")] == [5, 3, 2]
    assert numbers_in("45%")[0].percent
    assert parse_number("1 and 2") is None


@pytest.mark.parametrize("output,number", [
    ("The answer is 33.", 33),
    ("x = 5 and y = 7, so m + n = 33", 33),
    ("Working: 12 * 3 = 36\nAnswer: 36", 36),
    ("<answer>$1,200</answer> (we checked 3 cases)", 1200),
    ("\\boxed{204}", 204),
    ("5 apples and 3 pears make 8", 8),
])
def test_final_number_is_the_answers_last_number(output, number):
    assert final_number(output).value == number


@pytest.mark.parametrize("output,gold,ok", [
    ("33", 33, True),
    ("The answer is 33.", [33], True),
    ("33.0", "33", True),
    ("m+n = 033", 33, True),
    ("1,000", "1000", True),
    ("$1000", "1000", True),
    ("45%", "45", True),
    ("45%", "0.45", True),
    ("1/2", "0.5", True),
    ("0.3333333", "1/3", True),
    ("0.33", "1/3", False),
    ("34", 33, False),
    ("33 or 34, and the answer is 34", 33, False),
    ("no idea", 33, False),
    ("", 33, False),
])
def test_numeric_match(output, gold, ok):
    assert numeric_match(output, gold)[0] is ok


# --- multiple choice -----------------------------------------------------------------------------------------------
def test_options_from_every_shape():
    assert options_of(MEDQA) == {"A": "Hemolytic uremic syndrome", "B": "Oral ulcers", "C": "Colorectal cancer",
                                 "D": "Pancreatic cancer"}
    assert options_of({"options": {"a": "x", "b": "y"}}) == {"A": "x", "B": "y"}
    assert options_of({"choices": ["red", "green"]}) == {"A": "red", "B": "green"}
    assert options_of({"query": MEDQA["query"]})["C"] == "Colorectal cancer"
    assert options_of({"query": "no options here"}) == {}


def test_gold_letter_from_text_or_letter():
    options = options_of(MEDQA)
    assert gold_letter("Colorectal cancer", options) == "C"
    assert gold_letter("C", options) == "C"
    assert gold_letter("(C)", options) == "C"
    assert gold_letter("C. Colorectal cancer", options) == "C"
    assert gold_letter("Not an option", options) is None


@pytest.mark.parametrize("output,letter", [
    ("C", "C"), ("(C)", "C"), ("c", "C"), ("C.", "C"), ("C. Colorectal cancer", "C"), ("C) Colorectal cancer", "C"),
    ("colorectal cancer", "C"), ("Colorectal Cancer.", "C"), ("The answer is C.", "C"), ("Answer: (C)", "C"),
    ("<answer>C</answer>", "C"), ("I think it is colorectal cancer, given the colitis.", "C"),
    ("B", "B"), ("Oral ulcers", "B"),
    ("A 34-year-old man", None),  # a sentence starting with "A" is not option A
    ("Oral ulcers or colorectal cancer", None),  # two options named: ambiguous
    ("", None), ("E", None),
])
def test_chosen_letter(output, letter):
    assert chosen_letter(output, options_of(MEDQA)) == letter


@pytest.mark.parametrize("output,value", [
    ("C", 1.0), ("C. Colorectal cancer", 1.0), ("colorectal cancer", 1.0), ("(B)", 0.0), ("Pancreatic cancer", 0.0),
    ("", 0.0),
])
def test_score_mcq(output, value):
    assert score("mcq", output, MEDQA)["value"] == value


def test_mcq_with_a_letter_as_gold_and_no_options():
    assert score("mcq", "Colorectal cancer", {**MEDQA, "answer": "C"})["value"] == 1.0
    assert score("mcq", "maybe", {"query": "q", "answer": "maybe"})["value"] == 1.0
    assert score("mcq", "no", {"query": "q", "answer": "maybe"})["value"] == 0.0


# --- Game of 24 ----------------------------------------------------------------------------------------------------
def test_numbers_of_records():
    assert numbers_of(GAME) == [1, 1, 2, 7]
    assert numbers_of({"query": "Using the numbers [4, 9, 10, 13], create …"}) == [4, 9, 10, 13]
    assert numbers_of({"numbers": [3, 3, 8, 8]}) == [3, 3, 8, 8]
    assert numbers_of({"query": "no numbers"}) is None


@pytest.mark.parametrize("expression", [
    "(7+1)*(2+1)", "(7+1)×(2+1)", "(1+7)*(1+2)", "(7 + 1) x (2 + 1)", "(7+1)(2+1)", "[(7+1)*(2+1)]",
    "(7+1)*(2+1) = 24", "24 = (7+1)*(2+1)", "\\boxed{(7+1) \\times (2+1)}", "$(7+1)\\cdot(2+1)$",
    "((7+1)*(2+1)).",
])
def test_valid_game24_expressions(expression):
    check = check_24(extract_answer(expression), [1, 1, 2, 7])
    assert check.valid, check


def test_valid_game24_with_fractions_and_division():
    assert check_24("8/(3-8/3)", [3, 3, 8, 8]).valid
    assert check_24("8÷(3−8÷3)", [3, 3, 8, 8]).valid
    assert check_24("(1+1/7)*21", [1, 7, 21, 1]).valid
    assert check_24("(1+1/7)*21", [1, 7, 21, 5]).reason == "uses 1 more often than given; does not use 5"
    assert check_24("(4-1/7)*7", [1, 4, 7, 7]).reason == "evaluates to 27, not 24"


@pytest.mark.parametrize("expression,numbers,reason", [
    ("(7+1)*(2+2)", [1, 1, 2, 7], "2 more often than given"),  # reuses 2 and leaves a 1 unused
    ("(1+1+1)*8", [1, 1, 2, 7], "8, which is not given"),  # foreign number
    ("7*2+1+1", [1, 1, 2, 7], "evaluates to 16"),  # wrong result
    ("(7+1)*2", [1, 1, 2, 7], "does not use 1"),  # a number left out
    ("(7+2)/(1-1)", [1, 1, 2, 7], "division by zero"),  # each number once, but divides by zero
    ("7*2*1*1*1", [1, 1, 2, 7], "1 more often than given"),
    ("__import__('os').system('echo pwned')", [1, 1, 2, 7], "not allowed"),
    ("(7+1).__class__", [1, 1, 2, 7], "not allowed"),
    ("open('/etc/passwd')", [1, 1, 2, 7], "not allowed"),
    ("[x for x in (1,)]", [1, 1, 2, 7], ""),
    ("2**3*(1+1+7-7)", [1, 1, 2, 7], "not allowed"),
    ("-(1-7)*(2+1+1)", [1, 1, 2, 7], "not allowed"),  # unary minus is not one of the four operations
    ("'24'", [1, 1, 2, 7], "not allowed"),
    ("lambda: 24", [1, 1, 2, 7], ""),
    ("", [1, 1, 2, 7], "empty"),
    ("(" * 300 + "1" + ")" * 300, [1, 1, 2, 7], "longer than"),
])
def test_invalid_game24_expressions(expression, numbers, reason):
    check = check_24(expression, numbers)
    assert not check.valid
    assert reason in check.reason


def test_game24_reused_number_is_wrong_even_when_it_reaches_24():
    # [1, 1, 1, 8]: (1+1+1)*8 is right; (1+1+1+1)*... or reusing 8 is wrong though it may equal 24.
    numbers = [1, 1, 1, 8]
    assert check_24("(1+1+1)*8", numbers).valid
    assert not check_24("8+8+8", numbers).valid
    assert not check_24("8*(1+1+1)*1", numbers).valid


def test_game24_never_executes_the_expression(tmp_path):
    marker = tmp_path / "ran"
    check = check_24(f"__import__('pathlib').Path({str(marker)!r}).touch()", [1, 1, 2, 7])
    assert not check.valid and not marker.exists()


@pytest.mark.parametrize("output,value", [
    ("Answer: (7+1)×(2+1)", 1.0),
    ("<answer>(7 + 1) * (2 + 1) = 24</answer>", 1.0),
    ("We combine them.\n(7+1)*(2+1) = 24", 1.0),
    ("Answer: 24", 0.0),
    ("Answer: (7+1)*3", 0.0),
    ("", 0.0),
])
def test_score_gameof24(output, value):
    assert score("gameof24", output, GAME)["value"] == value


# --- search and math through score() ------------------------------------------------------------------------------
@pytest.mark.parametrize("output,value", [
    ("James Madison", 1.0),
    ("<answer>James Madison</answer>", 1.0),
    ("Answer: President James Madison", 1.0),  # F1 0.8
    ("Madison", 0.0),  # F1 0.67
    ("James Monroe", 0.0),
    ("It was James Madison, the fourth president of the United States", 0.0),  # a long answer is not rewarded
    ("", 0.0),
])
def test_score_search(output, value):
    reward = score("search", output, BAMBOOGLE)
    assert reward["value"] == value
    assert reward["source"] == "rule" and "f1=" in reward["detail"]


def test_score_search_string_answer_and_dates():
    assert score("search", "January 5, 1964", TWOWIKI)["value"] == 1.0
    assert score("search", "5 January 1965", TWOWIKI)["value"] == 0.0
    assert score("search", "yes", {"query": "q", "answer": "no"})["value"] == 0.0


def test_score_math():
    assert score("math", "Thus $m+n = 33$.", AIME)["value"] == 1.0
    assert score("math", "<answer>33</answer>", AIME)["value"] == 1.0
    assert score("math", "\\boxed{32}", AIME)["value"] == 0.0
    assert score("math", "no number", AIME)["value"] == 0.0
    assert score("math", "x^2", {"query": "q", "answer": "x^2"})["value"] == 1.0  # non-numeric gold


def test_score_rejects_unknown_kinds_and_returns_reward_dicts():
    with pytest.raises(InvalidInput, match="unknown kind 'poetry'"):
        score("poetry", "x", BAMBOOGLE)
    reward = score("math", None, AIME)
    assert set(reward) == {"value", "source", "detail"} and reward["value"] == 0.0


def test_ground_truth_text():
    assert ground_truth_text("search", BAMBOOGLE) == "james madison"
    assert ground_truth_text("search", {"answer": ["a", "b"]}) == '["a", "b"]'
    assert ground_truth_text("math", AIME) == "33"
    assert ground_truth_text("gameof24", GAME) == "[1, 1, 2, 7]"


# --- the LLM judge -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reply,correct", [
    ('{"analysis": "same person", "verdict": "CORRECT"}', True),
    ("Analysis: different year\nVerdict: INCORRECT", False),
    ("Analysis: same\n**Verdict:** CORRECT", True),
    ("CORRECT", True),
])
def test_parse_verdict(reply, correct):
    assert parse_verdict(reply)[0] is correct


def test_parse_verdict_unreadable():
    from agentflow.errors import ParseFailure

    with pytest.raises(ParseFailure):
        parse_verdict("it might be correct or incorrect")


def test_judge_rescues_a_paraphrase_and_never_overrules_a_correct_rule():
    engine = ScriptedEngine(["Analysis: both name the fourth US president\nVerdict: CORRECT"])
    judge = Judge(engine)
    rescued = score("search", "the fourth president, Madison", BAMBOOGLE, judge=judge)
    assert rescued["value"] == 1.0 and rescued["source"] == "judge" and "rule said" in rescued["detail"]
    prompt = engine.calls[0][-1]["content"]
    assert "james madison" in prompt and "the fourth president, Madison" in prompt
    calls = len(engine.calls)
    assert score("search", "James Madison", BAMBOOGLE, judge=judge)["source"] == "rule"  # right by rule: no call
    assert score("gameof24", "7*2+1+1", GAME, judge=judge)["value"] == 0.0  # Game of 24 is never judged
    assert len(engine.calls) == calls


def test_judge_failure_falls_back_to_the_rule():
    class Down:
        supports_structured_output = False

        def complete(self, *a, **kw) -> Completion:
            raise EngineError("cannot reach the judge")

    reward = score("search", "Madison", BAMBOOGLE, judge=Judge(Down()))
    assert reward["source"] == "rule" and reward["value"] == 0.0 and "judge unavailable" in reward["detail"]
    unreadable = score("search", "Madison", BAMBOOGLE, judge=Judge(ScriptedEngine(["hmm"])))
    assert unreadable["source"] == "rule" and "judge unavailable" in unreadable["detail"]
