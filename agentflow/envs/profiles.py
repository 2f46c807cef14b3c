"""Profiles: which engine answers which module. ``tiny-deterministic`` makes every frozen module a documented rule.

With a tiny, randomly initialised planner, LLM-backed executor / verifier / generator would be noise, and any
learning would be buried in it. The ``tiny-deterministic`` profile replaces them with deterministic engines that read
the module's prompt (``agentflow/prompts/*.md``) and answer it by fixed rules, so that the only thing that can change
an outcome is the planner's decision — which tool at which turn (and, through that, when the verifier can stop).
They are ordinary ``Engine`` objects: the loop, the stages and the services run unchanged.

``FrozenEngine(role)`` — one engine per frozen role, built by the profile for that role's module (or tool) alone, so
it never has to guess which prompt it was given; its rule reads the question and the steps out of the prompt:

* executor (``command.md``): the tool input is derived from the question and the planner's Context —
  python: the arithmetic expression of the question, read left to right (``times``/``plus``/``minus``/
  ``multiplied by``/``divided by`` become operators); a phrase naming a town's quantity (``the number of bridges
  in Kerrowick``) stands for the number the Context states about it; when the Context has none, the program
  assumes a value (``ASSUMED_VALUE``, as code written without the fact would) — it runs and prints a wrong number.
  The program is ``print(<expression>)``.
  search: the question's content words (no stop words, numbers or operator words); the question itself if none.
  generalist: the question itself.
* generalist tool (its system prompt and a question): a general-purpose model without tools. It *knows* what its
  training documents say (``knowledge``: sentences; the synthetic environment supplies the towns' history) and
  answers with the sentence that names the question's entity and shares a content word with it. Otherwise it
  answers anyway: an estimate from operands rounded to two significant digits for arithmetic, else a confident
  number hashed from the question, stated about the question's own words; about a town it knows nothing of, it
  hedges and asks the user back (``As far as I recall, number bridges Kerrowick: 4821. Could you tell me more about
  Kerrowick?``), as a chat model does. Those numbers are wrong on the synthetic environment (tests check this) and
  are what a reward compares (a vote, a rating); the question back is what the ``refusal_rate`` tripwire sees
  (agentflow/rollout/tripwires.py; ``agentflow demo --inject-bad-version`` shows it). Until 2026-12-06 the reply
  was the guess alone: with the number kept, rewards are the same as then.
* verifier (``verify.md``): CONTINUE when there is no step or the last step failed; CONTINUE when the last step
  was a search and the question computes with a quantity of something it names (``... of Kerrowick times 37``):
  what was found is an input, the computation is still to do; otherwise STOP — a tool returned a value (the
  generalist's reply is an answer to the whole question). It cannot tell a guess or an irrelevant result from an
  answer, so a wrong first tool usually ends the query with a wrong answer.
* generator (``answer.md``): ``Answer:`` the last successful result's value — its final number when it is a
  short answer, else the number of its sentence that best matches the question; ``unknown`` when there is none.
  A last result that asks the user back (``asks_back``: the generalist's question) is passed on as the answer.
* planner (``plan.md``), only when ``FrozenEngine("planner")`` is given to the profile as the planner's engine: a
  rule-based reference policy (while the question names something whose number is not yet known: the generalist if
  its knowledge has it, else search; then python if there is a computation), the ceiling the trained planner is
  compared with.

``PlannerAdapter`` wraps the trained planner's engine. In this profile the planner's action is the **tool** alone:
it asks its engine for ``{"tool": <one of the tools>}`` under JSON-schema-guided decoding (a closed choice, sampled
at temperature > 0 — the exploration — and argmax at 0), and fills the other two fields of the decision by rule:
``sub_goal`` names the tool's job, ``context`` carries the results of the steps so far (the facts the executor
needs). The returned completion keeps the engine's prompt/response token ids and logprobs — exactly the tokens
the model produced, which are what Flow-GRPO trains — while its ``text`` is the full three-field decision the loop
parses. The tiny model is shown a compact rendering of the plan prompt (``compact_plan_messages``: the question,
one line per step, the step number, the tool names; ``compact=False`` keeps ``plan.md``). The planner's one-off
analysis (``analyze.md``, the call the Planner module makes without a schema) gets a fixed neutral sentence: it is
not trained, and an untrained model's free text would only add noise to every planner prompt. Structured decoding
guarantees the format; the trainer's optional format warm-up only evens out the untrained model's choice between
tools (docs/training.md). An inner engine without structured output (``FrozenEngine("planner")``) gets the plan
prompt as it is and answers the whole decision.

``Noise`` (the synthetic environment's hard mode, ``env.rules()``) makes the frozen modules fallible, each draw
seeded by the environment's seed, the trajectory id (the engine's ``key``), the role and the prompt, so a rollout
is reproducible and a retry within it draws again: the executor searches for a near-miss of the town's name (one
letter dropped; only distractors come back) or writes a program with one digit slipped, each with ``error_rate``;
the generalist recalls a local statistic (``rumours``) with ``recall_rate``; the verifier says CONTINUE after a
step that asked back or a search that stated nothing about a town the question names, so a wrong tool costs a
turn instead of ending the query. In a question about two towns, the executor searches the first town whose number
the Context lacks and computes each phrase with its own town's number.

``get_profile("llm")`` is the other profile: every module uses the given engine (e.g. SmolLM2), nothing is a rule.

``Profile.engines`` returns one engine per role (planner, executor, verifier, generator, generalist), which
``agentflow.flow.build.build_agent`` wires into the modules and the generalist tool.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, replace
from typing import Sequence

from agentflow.errors import InvalidInput
from agentflow.llm.base import Completion, Engine, Message, Sampling
from agentflow.modules.prompting import template

TINY_DETERMINISTIC = "tiny-deterministic"
ASSUMED_VALUE = 100  # what the python executor assumes for a quantity it was not given
LLM = "llm"
NEUTRAL_ANALYSIS = "Not analysed (tiny-deterministic profile): choose the tool from the question and the steps."
SUB_GOALS = {
    "python": "Compute the value the question asks for with Python.",
    "search": "Look up the fact the question needs in the local corpus.",
    "generalist": "Ask the general-purpose model for the answer.",
}

FROZEN_ROLES = ("executor", "verifier", "generator", "generalist")  # each gets its own FrozenEngine

# --- reading prompts ----------------------------------------------------------------------------------------------

# what follows the rendered steps in the prompt of a role that shows them (agentflow/prompts/*.md)
_TRAILERS = {"planner": "\n\nThis is step ", "verifier": "\n\nIs this enough",
             "generator": "\n\nAnswer the question using"}


def _user(messages: Sequence[Message]) -> str:
    return next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")


def _question(user: str) -> str:
    """The ``Question: ...`` line every module template starts with."""
    match = re.search(r"^Question: (.*)$", user, re.M)
    return match.group(1).strip() if match else user.strip()


def _memory_text(user: str, role: str) -> str:
    start = user.find("Steps so far:\n")
    if start < 0:
        return ""
    start += len("Steps so far:\n")
    end = user.rfind(_TRAILERS.get(role, "\n\n"))
    return user[start: end if end > start else len(user)]


@dataclass(frozen=True)
class Step:
    tool: str
    command: str
    result: str
    error: str


_STEP_HEAD = re.compile(r"^Step \d+: ", re.M)


def parse_steps(memory: str) -> list[Step]:
    """The steps of a rendered memory (``Memory.render``), oldest first; summarised steps are skipped."""
    heads = list(_STEP_HEAD.finditer(memory))
    steps = []
    for i, head in enumerate(heads):
        block = memory[head.start(): heads[i + 1].start() if i + 1 < len(heads) else len(memory)].rstrip("\n")
        block = re.sub(r"\n  Verifier: (STOP|CONTINUE)\s*$", "", block)
        tool = re.search(r"^  Tool: ?(.*)$", block, re.M)
        outcome = re.search(r"\n  (Result|Error): ?", block)
        command = re.search(r"^  Command: ?", block, re.M)
        body = block[outcome.end():] if outcome else ""
        steps.append(Step(
            tool=tool.group(1).strip() if tool else "",
            command=block[command.end(): outcome.start()].strip() if command and outcome else "",
            result=body if outcome and outcome.group(1) == "Result" else "",
            error=body if outcome and outcome.group(1) == "Error" else "",
        ))
    return steps


# --- reading questions and results -------------------------------------------------------------------------------

_OP_WORDS = (("multiplied by", "*"), ("divided by", "/"), ("times", "*"), ("plus", "+"), ("minus", "-"))
_QUESTION_WORDS = {"What", "How", "When", "Which", "Who", "Where", "In", "Calculate", "Compute", "Give", "Take",
                   "If", "The", "Is", "Does", "Do", "Of", "A", "An"}
STOPWORDS = set("""a an the of in on at to for by with from and or is are was were be been does do did have has had
how many much what which when where who whom whose why it its this that these those there their give calculate
compute take if you get into as than then""".split())
_NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")


def _with_symbols(text: str) -> str:
    for word, symbol in _OP_WORDS:
        text = re.sub(rf"\b{word}\b", f" {symbol} ", text, flags=re.I)
    return text


def needs_computation(question: str) -> bool:
    """Whether the question asks to combine numbers (an operator between operands, or an operator word)."""
    q = _with_symbols(question)
    return bool(re.search(r"[\d)]\s*[-+*/]\s*[\d(]|[-+*/]\s*\d|\d\s*[-+*/]|[A-Za-z]\s+[-+*/]\s+[A-Za-z\d(]", q))


def entities(question: str) -> list[str]:
    """Capitalised names in the question, other than question words (e.g. ``Kerrowick``)."""
    words = re.findall(r"\b[A-Z][a-z]+\b", question)
    return [w for w in dict.fromkeys(words) if w not in _QUESTION_WORDS]


def phrases(question: str) -> list[str]:
    """The parts of a question about two or more named things, one per thing (split at the operators): each is
    what the executor searches and computes for that thing. A question about one thing (or none) is one part."""
    if len(entities(question)) < 2:
        return [question]
    parts = re.split(r"\s[-+*/]\s", _with_symbols(question))
    return [part.strip() for part in parts if entities(part)] or [question]


def missing(question: str, known: str) -> list[str]:
    """The phrases of ``question`` about a named thing whose number ``known`` does not state yet."""
    return [part for part in phrases(question) if entities(part) and best_number(part, known) is None]


def _fold(word: str) -> str:
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def content_words(text: str) -> list[str]:
    """Lower-cased words that carry meaning: no stop words, numbers or operator words; plurals folded."""
    ops = {w for phrase, _ in _OP_WORDS for w in phrase.split()}
    words = re.findall(r"[A-Za-z]+", text.lower())
    return [_fold(w) for w in words if w not in STOPWORDS and w not in ops]


def _sentences(text: str) -> list[str]:
    text = re.sub(r"^\[\d+\] ", "", text, flags=re.M)  # search hit markers are not numbers of interest
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]


def _numbers(text: str) -> list[str]:
    return [n.replace(",", "") for n in _NUMBER.findall(text)]


def best_number(question: str, text: str) -> str | None:
    """The number stated by the sentence of ``text`` that best matches the question (most shared content words);
    when the question names entities, only sentences naming one of them count. None when no sentence qualifies."""
    names = entities(question)
    wanted = set(content_words(question))
    best, best_score = None, 0
    for sentence in _sentences(text):
        numbers = _numbers(sentence)
        if not numbers or (names and not any(re.search(rf"\b{n}\b", sentence) for n in names)):
            continue
        score = len(wanted & set(content_words(sentence))) + 1
        if score > best_score:
            best, best_score = numbers[-1], score
    return best


def answer_like(result: str) -> bool:
    """A short reply (<= 12 words) that ends with a number: a printed value, or a model's direct answer."""
    text = result.strip()
    return bool(text) and len(text.split()) <= 12 and bool(re.search(r"\d\s*[.!]?$", text))


def final_number(text: str) -> str | None:
    numbers = _numbers(text)
    return numbers[-1] if numbers else None


# --- the executor's rules ------------------------------------------------------------------------------------------


def arithmetic_program(question: str, context: str = "") -> str:
    """``print(<expression>)``: the question's arithmetic read left to right; a phrase naming an entity's quantity
    becomes the number the context states about it, or an undefined variable when the context has none."""
    tokens = re.findall(r"\d+(?:\.\d+)?|[-+*/()]|[A-Za-z][A-Za-z'-]*|[?.!,;:]", _with_symbols(question))
    names = set(entities(question))
    items: list[str] = []
    run: list[str] = []
    assumed: dict[str, int] = {}

    def flush() -> None:
        if run and names & set(run):
            about = " ".join(run) if len(names) > 1 else question  # a question about two towns: this phrase's own
            value = best_number(about, context) if context and context.strip() != "none" else None
            if value is None:
                value = "_".join(content_words(" ".join(run))) or "unknown_value"
                assumed[value] = ASSUMED_VALUE
            items.append(value)
        run.clear()

    for token in tokens:
        if re.fullmatch(r"[A-Za-z][A-Za-z'-]*", token):
            run.append(token)
            continue
        flush()
        if re.fullmatch(r"\d+(?:\.\d+)?|[-+*/()]", token):
            items.append(token)
    flush()
    while items and items[0] in "+*/)":
        items.pop(0)
    while items and items[-1] in "+-*/(":
        items.pop()
    expression = " ".join(items)
    if not expression:
        return 'raise ValueError("the question contains no arithmetic to compute")'
    try:
        compile(expression, "<expression>", "eval")
    except SyntaxError:
        return f'raise ValueError("cannot read an expression from the question: {expression!r}")'
    lines = [f"{name} = {value}  # assumed: not given in the context" for name, value in assumed.items()]
    return "\n".join(lines + [f"print({expression})"])


def search_keywords(question: str) -> str:
    """The search input: the question's content words in order (no stop words, numbers or operators)."""
    ops = {w for phrase, _ in _OP_WORDS for w in phrase.split()}
    words = [w for w in re.findall(r"[A-Za-z]+", question) if w.lower() not in STOPWORDS and w.lower() not in ops]
    return " ".join(words) or question


def recall(question: str, knowledge: Sequence[str]) -> str | None:
    """The knowledge sentence that names the question's entity, shares another content word with it and states a
    number (the best such), or None."""
    names = entities(question)
    if not names:
        return None
    wanted = set(content_words(question)) - {n.lower() for n in names}
    best, best_score = None, 0
    for sentence in knowledge:
        if not _numbers(sentence) or not any(re.search(rf"\b{n}\b", sentence) for n in names):
            continue
        score = len(wanted & set(content_words(sentence)))
        if score > best_score:
            best, best_score = sentence, score
    return best


def generalist_answer(question: str, knowledge: Sequence[str] = ()) -> str:
    """What the generalist says: what its knowledge states; else a guess, about a town with a question back."""
    known = recall(question, knowledge)
    if known:
        return known
    names = entities(question)
    if names:  # a hedged guess and a question back; the guess is what a vote or a rating compares
        return f"{generalist_guess(question)} Could you tell me more about {' and '.join(names)}?"
    return generalist_guess(question)


def asks_back(step: Step) -> bool:
    """The step asked the user a question instead of stating something: a reply of the generalist (the one tool
    that talks to the user) that ends with a question."""
    return step.tool == "generalist" and step.result.strip().endswith("?")


def generalist_guess(question: str) -> str:
    """What a small model without tools says: an estimate on rounded operands, else a confident made-up number."""
    if needs_computation(question) and not entities(question):
        def rounded(match: re.Match) -> str:
            value = float(match.group(0))
            return f"{float(f'{value:.2g}'):g}"

        program = arithmetic_program(question)
        if program.startswith("print("):
            try:
                estimate = eval(re.sub(r"\d+(?:\.\d+)?", rounded, program[6:-1]), {"__builtins__": {}})
                return f"It is roughly {int(round(estimate))}."
            except (ArithmeticError, SyntaxError, TypeError, ValueError):
                pass
    digest = int(hashlib.sha256(question.encode()).hexdigest(), 16)
    return f"As far as I recall, {search_keywords(question).rstrip('?.!')}: {100 + digest % 9000}."


# --- the engines -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Noise:
    """How the frozen modules err (the synthetic environment's hard mode): see the module docstring."""

    seed: int = 0
    error_rate: float = 0.15
    recall_rate: float = 0.3
    rumours: tuple[str, ...] = ()  # what the generalist half-remembers (the towns' local statistics)

    def draw(self, *parts: str) -> float:
        """A number in [0, 1) fixed by the seed and ``parts`` (trajectory id, role, prompt)."""
        digest = hashlib.sha256("\x1f".join((str(self.seed), *parts)).encode()).digest()
        return random.Random(digest).random()


def near_miss(name: str) -> str:
    """A town's name with its last letter dropped: what a careless query asks for."""
    return name[:-1]


def slip_digit(program: str) -> str:
    """The program with the first digit of its last line's first number changed (a typo, still valid Python)."""
    head, _, last = program.rpartition("\n")
    match = re.search(r"\d", last)
    if not match:
        return program
    digit = str((int(match.group(0)) + 1) % 10 or 1)
    last = last[: match.start()] + digit + last[match.end():]
    return f"{head}\n{last}" if head else last


class FrozenEngine:
    """The engine of one frozen ``role`` (executor, verifier, generator, generalist; or planner: the reference
    policy): every prompt it gets is answered by that role's rule above. Zero latency, no tokens, version
    ``tiny-deterministic``. ``knowledge`` is what the generalist knows (the reference planner consults it too)."""

    supports_structured_output = False
    version = TINY_DETERMINISTIC

    def __init__(self, role: str, knowledge: Sequence[str] = (), noise: Noise | None = None):
        if role not in (*FROZEN_ROLES, "planner"):
            raise InvalidInput(f"no {TINY_DETERMINISTIC} rule for the role {role!r}; "
                               f"choose one of {', '.join((*FROZEN_ROLES, 'planner'))}")
        self.role = role
        self.knowledge = tuple(knowledge)
        self.noise = noise

    def complete(self, messages: Sequence[Message], sampling: Sampling, *, timeout: float,
                 json_schema: dict | None = None, key: str = "") -> Completion:
        user = _user(messages)
        errs = self.noise is not None and self.noise.draw(key, self.role, user) < self._chance()
        text = getattr(self, f"_{self.role}")(user, errs)
        return Completion(text=text, model_version=self.version, finish_reason="stop")

    def _chance(self) -> float:
        """The chance of this role's draw going the other way (``Noise``): erring, or for the generalist
        recalling a local statistic."""
        if self.noise is None or self.role not in ("executor", "generalist"):
            return 0.0
        return self.noise.recall_rate if self.role == "generalist" else self.noise.error_rate

    # one method per role; each gets the user message of its module's prompt and whether its draw came up
    def _generalist(self, user: str, recalls: bool = False) -> str:
        rumours = self.noise.rumours if recalls and self.noise else ()
        return generalist_answer(user.strip(), (*self.knowledge, *rumours))

    def _executor(self, user: str, errs: bool = False) -> str:
        question = _question(user)
        tool = re.search(r"\nTool: ([\w-]+)", user[user.rfind("\nTool: "):]) if "\nTool: " in user else None
        match = re.search(r"\nContext: (.*?)\nSub-Goal: ", user, re.S)
        context = match.group(1) if match else ""
        name = tool.group(1) if tool else ""
        if name == "python":
            program = arithmetic_program(question, context)
            return f"```python\n{slip_digit(program) if errs else program}\n```"
        if name == "search":
            about = (missing(question, context) or [question])[0]  # the first town whose number is not known yet
            keywords = search_keywords(about)
            for town in entities(about) if errs else ():
                keywords = re.sub(rf"\b{town}\b", near_miss(town), keywords)
            return keywords
        return question

    def _verifier(self, user: str, _: bool = False) -> str:
        question, steps = _question(user), parse_steps(_memory_text(user, "verifier"))
        if not steps:
            return "Analysis: no step has run yet.\nConclusion: CONTINUE"
        last = steps[-1]
        if last.error:
            return f"Analysis: the last step failed ({_clip(last.error)}).\nConclusion: CONTINUE"
        if self.noise is not None and asks_back(last):
            return "Analysis: the last step asked the user back instead of answering.\nConclusion: CONTINUE"
        if self.noise is not None and last.tool == "search" and entities(question) \
                and best_number(question, last.result) is None:
            return "Analysis: the search stated nothing about what the question names.\nConclusion: CONTINUE"
        if last.tool == "search" and needs_computation(question) and entities(question):
            return "Analysis: the value found is an input; the computation is still to do.\nConclusion: CONTINUE"
        return f"Analysis: the {last.tool or 'last'} step returned a value.\nConclusion: STOP"

    def _generator(self, user: str, _: bool = False) -> str:
        question, steps = _question(user), parse_steps(_memory_text(user, "generator"))
        answered = [s for s in steps if s.result.strip() and not s.error]
        if answered and asks_back(answered[-1]):
            return f"The generalist asked back.\nAnswer: {_one_line(answered[-1].result)}"
        results = [s.result for s in answered]
        value = None
        if results:
            last = results[-1]
            value = final_number(last) if answer_like(last) else best_number(question, last)
        if value is None:
            return "No step produced a usable value.\nAnswer: unknown"
        return f"The last result gives the value.\nAnswer: {value}"

    def _planner(self, user: str, _: bool = False) -> str:
        question, steps = _question(user), parse_steps(_memory_text(user, "planner"))
        tool = reference_tool(question, steps, self.knowledge)
        known = "\n".join(s.result for s in steps if s.result and not s.error) or "none"
        return f"Context: {_one_line(known)}\nSub-Goal: {SUB_GOALS[tool]}\nTool Name: {tool}"


def reference_tool(question: str, steps: Sequence[Step], knowledge: Sequence[str] = ()) -> str:
    """The reference policy: while the question's entity has no stated number, ask the generalist if it knows,
    else search; then python when there is a computation."""
    known = "\n".join(s.result for s in steps if s.result and not s.error)
    if entities(question) and missing(question, known):
        return "generalist" if recall(question, knowledge) else "search"
    return "python" if needs_computation(question) or entities(question) else "search"


def _clip(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _one_line(text: str) -> str:
    return " ".join(text.split())


class PlannerAdapter:
    """The trained planner's engine as this profile uses it: the model chooses the tool; the rest is by rule.

    The Planner module makes two kinds of call (``agentflow/modules/planner.py``): each plan call carries the plan
    schema (this adapter supports structured output, so the module always sends it), the one analysis call carries
    none. Plan calls go to ``inner`` with the schema reduced to ``{"tool": enum}``; the completion comes back with
    inner's token ids and logprobs and a full decision as its text. An inner engine without structured output (the
    reference planner) gets the plan call unchanged. The analysis is ``NEUTRAL_ANALYSIS``, with no model version:
    it is a rule, not the planner model (rollouts attribute planner calls by their version).
    """

    supports_structured_output = True

    def __init__(self, inner: Engine, *, compact: bool = True):
        self.inner = inner
        self.compact = compact

    @property
    def version(self) -> str:
        return getattr(self.inner, "version", "")

    def complete(self, messages: Sequence[Message], sampling: Sampling, *, timeout: float,
                 json_schema: dict | None = None, key: str = "") -> Completion:
        tools = ((json_schema or {}).get("properties", {}).get("tool") or {}).get("enum")
        if not tools:
            return Completion(text=NEUTRAL_ANALYSIS, finish_reason="stop")
        if not getattr(self.inner, "supports_structured_output", False):
            return self.inner.complete(messages, sampling, timeout=timeout, json_schema=json_schema, key=key)
        schema = tool_schema(tools)
        shown = compact_plan_messages(_user(messages), tools) if self.compact else messages
        completion = self.inner.complete(shown, sampling, timeout=timeout, json_schema=schema, key=key)
        try:
            tool = json.loads(completion.text)["tool"]
        except (ValueError, KeyError, TypeError):
            return completion  # not what structured decoding promises: let the planner's parser report it
        steps = parse_steps(_memory_text(_user(messages), "planner"))
        context = "\n".join(s.result.strip() for s in steps if s.result.strip() and not s.error) or "none"
        text = json.dumps({"context": context, "sub_goal": SUB_GOALS.get(tool, f"Use {tool}."), "tool": tool})
        return replace(completion, text=text)


def compact_plan_messages(plan_prompt: str, tools: Sequence[str], result_chars: int = 60) -> list[Message]:
    """The plan prompt's information in a few lines: the question, each step's tool and the start of its result
    (or error), the step number and the tool names. The prose around it (the module's instructions, the tool
    cards, the analysis) is the same for every query, and a tiny model cannot read it: it would only multiply the
    tokens of every rollout and update (~600 -> ~60). The template is agentflow/prompts/plan_compact.md."""
    question, steps = _question(plan_prompt), parse_steps(_memory_text(plan_prompt, "planner"))
    step = re.search(r"This is step (\d+) of at most (\d+)", plan_prompt)
    lines = [""]
    for i, s in enumerate(steps, start=1):
        outcome = f"error: {_clip(s.error, result_chars)}" if s.error else _clip(s.result, result_chars)
        lines.append(f"{i}. {s.tool or 'none'} -> {outcome}")
    text = template("plan_compact").substitute(
        question=question, steps="\n".join(lines) if steps else " none", step=step.group(1) if step else "?",
        max_steps=step.group(2) if step else "?", tool_names=", ".join(tools))
    return [{"role": "user", "content": text.strip()}]


def tool_schema(tools: Sequence[str]) -> dict:
    """The planner's action in this profile: one closed choice."""
    return {"type": "object", "properties": {"tool": {"type": "string", "enum": list(tools)}},
            "required": ["tool"], "additionalProperties": False}


# --- profiles ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    """How an Agent's modules get their engines. ``name`` goes into every report the profile produces."""

    name: str
    description: str

    def engines(self, planner_engine: Engine, llm_engine: Engine | None = None, *, compact: bool = True,
                knowledge: Sequence[str] = (), noise: Noise | None = None) -> dict[str, Engine]:
        """One engine per role (``planner`` and ``FROZEN_ROLES``) for ``build_agent(..., engines=...)``.

        ``tiny-deterministic``: the planner is ``planner_engine`` behind a ``PlannerAdapter``, each frozen role its
        own ``FrozenEngine`` (``knowledge``: what the generalist knows; ``noise``: how they err). ``llm``: the
        planner is ``planner_engine``, every frozen role shares ``llm_engine`` (default: the planner's)."""
        if self.name == TINY_DETERMINISTIC:
            return {"planner": PlannerAdapter(planner_engine, compact=compact),
                    **{role: FrozenEngine(role, knowledge, noise) for role in FROZEN_ROLES}}
        return {"planner": planner_engine, **{role: llm_engine or planner_engine for role in FROZEN_ROLES}}

    def build_agent(self, planner_engine: Engine, tool_names: Sequence[str], loop=None, *,
                    planner_temperature: float = 0.0, tools_config=None, llm_engine: Engine | None = None,
                    call_timeout_s: float = 120.0, tool_timeout_s: float = 30.0, compact: bool = True,
                    knowledge: Sequence[str] = (), noise: Noise | None = None):
        """An Agent under this profile (see ``agentflow.flow.build.build_agent``); ``knowledge`` is what the
        deterministic generalist knows and ``noise`` how the frozen modules err (both ignored by ``llm``)."""
        from agentflow.flow.build import build_agent
        from agentflow.flow.loop import LoopConfig

        engines = self.engines(planner_engine, llm_engine, compact=compact, knowledge=knowledge, noise=noise)
        return build_agent(engines, list(tool_names), loop or LoopConfig(), planner_temperature=planner_temperature,
                           tools_config=tools_config, call_timeout_s=call_timeout_s, tool_timeout_s=tool_timeout_s)


PROFILES = {
    TINY_DETERMINISTIC: Profile(TINY_DETERMINISTIC, "trained planner chooses the tool; executor, verifier, "
                                "generator, generalist tool and the planner's analysis are deterministic rules"),
    LLM: Profile(LLM, "every module is LLM-backed (e.g. SmolLM2); nothing is a rule"),
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise InvalidInput(f"unknown profile {name!r}; choose one of {', '.join(sorted(PROFILES))}") from None
