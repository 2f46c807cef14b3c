"""A bundled synthetic environment where tools are necessary (issue 4, item 4).

The world: towns of Veloria (generated names) with four numeric attributes. Three (bridges, population,
elevation) are *local statistics*: only the generated search corpus states them. One (the founding year) is
*history*: it is in the generalist model's knowledge (``env.knowledge()``, the documents a general-purpose model was
trained on), and the corpus does not state it. Four kinds of task, all with integer answers scored by the ``math``
reward rule (numeric equivalence):

* ``arithmetic`` — ``What is 4817 * 263 - 1290?``: operands of 3-4 digits (never round), so an estimate or a
  guess is wrong; python computes it.
* ``lookup`` — ``How many bridges does Kerrowick have?``: search finds it.
* ``history`` — ``In which year was Kerrowick founded?``: the generalist knows it; search does not.
* ``two_hop`` — ``What is the number of bridges in Kerrowick times 37?``: search, then python with the value
  found. Both turns earn the one reward, so credit must flow across turns.

Tasks cycle arithmetic, lookup, history, arithmetic, two_hop, history, so each first tool (python, search,
generalist) is the right one for a third of the tasks, and with the deterministic frozen modules
(``agentflow/envs/profiles.py``) a wrong first tool usually ends the query with a wrong answer: no fixed tool
sequence solves more than about a third; the planner has to route by the question, then by the steps so far.

The world, the corpus passages, the generalist's knowledge and every task come from one seeded ``random.Random``:
ground truth is computed from the same values the texts print, never typed in. The corpus (generated passages +
the bundled ``agentflow/data/corpus.jsonl`` as distractors) is written to a cache file and the search tool is
pointed at it with ``env.tools_config()``.

Train / held-out split (deterministic for a seed): the (town, attribute) facts of each attribute are shuffled and
split 80/20; held-out questions about towns ask about held-out facts only, held-out arithmetic uses fresh operands,
and no query text appears in both sets. Each task carries its expected tool sequence (``tools``) for analysis only:
neither the agent nor the reward sees it.

``EnvConfig(mode="hard")`` (issue 35): successes are rare and noisy. A third of the tasks are ``three_hop``
(``What is the population of Corford plus the number of bridges in Dunby?``: search, search, python); the frozen
modules err with ``error_rate`` (a search for a near-miss of the town's name finds only distractors, a program
slips a digit) and the generalist half-remembers local statistics (right with ``recall_rate``, so a wrong tool can
succeed by luck); a step that found nothing or asked back no longer ends the query, so a wrong tool costs a turn
against the deadline (``HARD_MAX_TURNS``) instead. ``env.rules()`` gives the profile those settings; every draw is
seeded by the environment's seed and the trajectory id (``agentflow/envs/profiles.py``, ``Noise``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agentflow.errors import InvalidInput
from agentflow.tools.registry import ToolsConfig
from agentflow.tools.search import DEFAULT_CORPUS

KINDS = ("arithmetic", "lookup", "history", "two_hop", "three_hop")
CYCLE = ("arithmetic", "lookup", "history", "arithmetic", "two_hop", "history")  # task i is of kind CYCLE[i % 6]
HARD_CYCLE = ("three_hop", "lookup", "two_hop", "history", "three_hop", "arithmetic")  # mode="hard"
EXPECTED_TOOLS = {"arithmetic": ("python",), "lookup": ("search",), "history": ("generalist",),
                  "two_hop": ("search", "python"), "three_hop": ("search", "search", "python")}
MODES = ("standard", "hard")
HARD_MAX_TURNS = 4  # the deadline of mode="hard": three_hop needs 3 turns, so one wasted turn at most
TOOLS = ("python", "search", "generalist")  # what the agent is given: the project's default tool set
REWARD_KIND = "math"  # agentflow.rewards kind used to score every task

_ONSETS = ("Ker", "Ash", "Mol", "Tav", "Bren", "Dun", "Sel", "Orm", "Ith", "Cal", "Mar", "Fen", "Gal", "Hald",
           "Lun", "Pell", "Quor", "Rus", "Thal", "Wen", "Yar", "Zel", "Brim", "Cor")
_CODAS = ("wick", "ford", "holm", "mere", "stead", "by", "ton", "gard", "wyn", "rick", "moor", "haven")
_COASTS = ("north", "south", "east", "west")


@dataclass(frozen=True)
class Attribute:
    """One numeric property of a town: how the corpus states it and how questions ask for it."""

    name: str
    low: int
    high: int
    sentence: str  # the corpus sentence, with {town} and {value}
    questions: tuple[str, ...]  # lookup questions, with {town}
    phrase: str  # how a two-hop question names the quantity, with {town}
    source: str = "corpus"  # where the fact is stated: the search corpus, or the generalist's "knowledge"


ATTRIBUTES = (
    Attribute("bridges", 12, 480, "{town} has {value} bridges.",
              ("How many bridges does {town} have?", "What is the number of bridges in {town}?"),
              "the number of bridges in {town}"),
    Attribute("population", 1200, 98000, "The population of {town} is {value} people.",
              ("What is the population of {town}?", "How many people live in {town}?"),
              "the population of {town}"),
    Attribute("founded", 1102, 1899, "{town} was founded in the year {value}.",
              ("In which year was {town} founded?", "When was {town} founded? Give the year.",
               "What year was {town} founded in?"),
              "the founding year of {town}", source="knowledge"),
    Attribute("elevation", 40, 2900, "{town} lies at an elevation of {value} metres above sea level.",
              ("What is the elevation of {town} in metres?", "How many metres above sea level is {town}?"),
              "the elevation of {town} in metres"),
)
_ATTR = {a.name: a for a in ATTRIBUTES}

# Two-hop operations: (word in the question, symbol, range of the second operand).
_HOP_OPS = {"times": ("*", (12, 97)), "plus": ("+", (103, 987)), "minus": ("-", (11, 99))}


@dataclass(frozen=True)
class Task:
    """One query with its computed ground truth. ``tools`` is the expected tool sequence (analysis only)."""

    id: str
    query: str
    answer: str
    kind: str
    tools: tuple[str, ...]
    split: str  # "train" | "heldout"
    reward_kind: str = REWARD_KIND

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Town:
    name: str
    coast: str
    values: dict = field(hash=False)  # attribute name -> int

    def passage(self) -> dict:
        """The corpus passage: the town's local statistics (the only place they exist)."""
        sentences = [f"{self.name} is a town on the {self.coast} coast of Greater Velor, in Veloria.",
                     *self.statistics()]
        return {"title": self.name, "text": " ".join(sentences)}

    def statistics(self) -> list[str]:
        """The town's local statistics, one sentence per fact (what the corpus states about it)."""
        return [_ATTR[name].sentence.format(town=self.name, value=value) for name, value in self.values.items()
                if _ATTR[name].source == "corpus"]

    def knowledge(self) -> list[str]:
        """What the generalist model knows about the town (its history), one sentence per fact."""
        return [_ATTR[name].sentence.format(town=self.name, value=value) for name, value in self.values.items()
                if _ATTR[name].source == "knowledge"]


@dataclass(frozen=True)
class EnvConfig:
    seed: int = 0
    towns: int = 48
    train_size: int = 300  # tasks, split evenly over KINDS
    heldout_size: int = 60
    heldout_fraction: float = 0.2  # share of (town, attribute) facts reserved for held-out questions
    mode: str = "standard"  # or "hard": three-hop tasks, modules that err, a generalist that half-remembers
    error_rate: float = 0.15  # mode="hard": chance that a search or a program of the executor goes wrong
    recall_rate: float = 0.3  # mode="hard": chance that the generalist recalls a local statistic right

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidInput(f"env.mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not (0 <= self.error_rate < 1 and 0 <= self.recall_rate <= 1):
            raise InvalidInput(f"env.error_rate must be in [0, 1) and env.recall_rate in [0, 1], got "
                               f"{self.error_rate} and {self.recall_rate}")
        if not 4 <= self.towns <= len(_ONSETS) * len(_CODAS):
            raise InvalidInput(f"env.towns must be in [4, {len(_ONSETS) * len(_CODAS)}], got {self.towns}")
        if self.train_size < len(CYCLE) or self.heldout_size < len(CYCLE):
            raise InvalidInput(f"env.train_size and env.heldout_size must be at least {len(CYCLE)}")
        if not 0 < self.heldout_fraction < 1:
            raise InvalidInput(f"env.heldout_fraction must be in (0, 1), got {self.heldout_fraction}")


class SyntheticEnv:
    """The world, its corpus and the train / held-out tasks, all from ``config.seed``."""

    def __init__(self, config: EnvConfig = EnvConfig()):
        self.config = config
        rng = random.Random(f"agentflow-synthetic-env/{config.seed}")
        self.towns = _make_towns(rng, config.towns)
        self.train_facts, self.heldout_facts = [], []
        for attribute in ATTRIBUTES:  # stratified: every attribute has held-out facts
            facts = [(t.name, attribute.name) for t in self.towns]
            rng.shuffle(facts)
            cut = max(1, round(len(facts) * config.heldout_fraction))
            self.heldout_facts += facts[:cut]
            self.train_facts += facts[cut:]
        self.train = _make_tasks(rng, self, "train", self.train_facts, config.train_size, avoid=set())
        self.heldout = _make_tasks(rng, self, "heldout", self.heldout_facts, config.heldout_size,
                                   avoid={t.query for t in self.train})
        self._corpus_path: Path | None = None

    # --- facts ------------------------------------------------------------------------------------------------
    def value(self, town: str, attribute: str) -> int:
        return next(t.values[attribute] for t in self.towns if t.name == town)

    def knowledge(self) -> list[str]:
        """The generalist's knowledge: documents a general-purpose model was trained on (the towns' history)."""
        return [sentence for t in self.towns for sentence in t.knowledge()]

    @property
    def cycle(self) -> tuple[str, ...]:
        return HARD_CYCLE if self.config.mode == "hard" else CYCLE

    @property
    def max_turns(self) -> int | None:
        """The planner's deadline in turns when the mode sets one (hard), else None (the caller's own)."""
        return HARD_MAX_TURNS if self.config.mode == "hard" else None

    def rules(self) -> dict:
        """What the deterministic profile's frozen modules need from this world, as ``build_agent`` keywords:
        the generalist's knowledge and, in the hard mode, the noise (``profiles.Noise``)."""
        from agentflow.envs.profiles import Noise

        if self.config.mode != "hard":
            return {"knowledge": self.knowledge()}
        rumours = tuple(sentence for t in self.towns for sentence in t.statistics())
        return {"knowledge": self.knowledge(),
                "noise": Noise(seed=self.config.seed, error_rate=self.config.error_rate,
                               recall_rate=self.config.recall_rate, rumours=rumours)}

    def passages(self) -> list[dict]:
        """Generated passages (one per town) followed by the bundled corpus, which serves as distractors."""
        generated = [t.passage() for t in self.towns]
        bundled = [json.loads(line) for line in DEFAULT_CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
        return generated + bundled

    # --- the search corpus --------------------------------------------------------------------------------------
    def corpus_path(self, directory: str | Path | None = None) -> Path:
        """Write the corpus (once per content) and return its path: ``directory`` or the agentflow cache."""
        if self._corpus_path is not None and directory is None and self._corpus_path.is_file():
            return self._corpus_path
        text = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in self.passages())
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        if directory is None:
            from agentflow.storage import cache_dir

            directory = cache_dir() / "synthetic-env"
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"corpus-seed{self.config.seed}-{digest}.jsonl"
        if not path.is_file():
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".corpus-", suffix=".jsonl")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)  # atomic: concurrent writers produce the same bytes
        self._corpus_path = path
        return path

    def tools_config(self, directory: str | Path | None = None, base: ToolsConfig | None = None) -> ToolsConfig:
        """Tool settings whose search tool reads this environment's corpus."""
        from dataclasses import replace

        base = base or ToolsConfig()
        return replace(base, search=replace(base.search, corpus_path=str(self.corpus_path(directory))))

    def summary(self) -> dict:
        count = {s: {k: sum(t.kind == k for t in tasks) for k in KINDS}
                 for s, tasks in (("train", self.train), ("heldout", self.heldout))}
        return {"seed": self.config.seed, "mode": self.config.mode, "towns": len(self.towns),
                "facts_train": len(self.train_facts), "facts_heldout": len(self.heldout_facts), "tasks": count}


# --- generation -----------------------------------------------------------------------------------------------


def _make_towns(rng: random.Random, n: int) -> list[Town]:
    bundled = DEFAULT_CORPUS.read_text(encoding="utf-8").lower()
    names = sorted({o + c for o in _ONSETS for c in _CODAS if (o + c).lower() not in bundled})
    rng.shuffle(names)
    towns = []
    for name in names[:n]:
        values = {a.name: _no_round(rng, a.low, a.high) for a in ATTRIBUTES}
        towns.append(Town(name, rng.choice(_COASTS), values))
    return towns


def _no_round(rng: random.Random, low: int, high: int) -> int:
    """A value that is not a multiple of 10: round numbers are what an estimate would hit."""
    while True:
        v = rng.randint(low, high)
        if v % 10:
            return v


def _arithmetic(rng: random.Random) -> tuple[str, int]:
    a, b, c = _no_round(rng, 103, 9899), _no_round(rng, 103, 989), _no_round(rng, 103, 9899)
    form = rng.randrange(4)
    if form == 0:
        return f"What is {a} * {b}?", a * b
    if form == 1:
        return f"What is {a} times {b} plus {c}?", a * b + c
    if form == 2:
        return f"Calculate {a} * {b} - {c}.", a * b - c
    return f"What is ({a} + {c}) * {b}?", (a + c) * b


def _lookup(rng: random.Random, env: SyntheticEnv, fact: tuple[str, str]) -> tuple[str, int]:
    town, attribute = fact
    return rng.choice(_ATTR[attribute].questions).format(town=town), env.value(town, attribute)


def _two_hop(rng: random.Random, env: SyntheticEnv, fact: tuple[str, str]) -> tuple[str, int]:
    town, attribute = fact
    value = env.value(town, attribute)
    word = rng.choice(sorted(_HOP_OPS))
    symbol, (low, high) = _HOP_OPS[word]
    k = _no_round(rng, low, high)
    phrase = _ATTR[attribute].phrase.format(town=town)
    answer = {"*": value * k, "+": value + k, "-": value - k}[symbol]
    return f"What is {phrase} {word} {k}?", answer


def _three_hop(rng: random.Random, env: SyntheticEnv, facts: list) -> tuple[str, int]:
    """Two local facts of two towns, added or subtracted: search each town, then compute."""
    (town_a, attr_a), (town_b, attr_b) = rng.sample(facts, 2)
    for _ in range(100):  # bounded: a world whose facts are all one town's has no three-hop task
        if town_b != town_a:
            break
        town_b, attr_b = rng.choice(facts)
    else:
        raise InvalidInput("env: three-hop tasks need facts about two towns; use more towns")
    word = rng.choice(("plus", "minus"))
    a, b = env.value(town_a, attr_a), env.value(town_b, attr_b)
    phrase_a, phrase_b = _ATTR[attr_a].phrase.format(town=town_a), _ATTR[attr_b].phrase.format(town=town_b)
    return f"What is {phrase_a} {word} {phrase_b}?", a + b if word == "plus" else a - b


def _make_tasks(rng: random.Random, env: SyntheticEnv, split: str, facts: list, size: int,
                avoid: set[str]) -> list[Task]:
    local = [f for f in facts if _ATTR[f[1]].source == "corpus"]
    history = [f for f in facts if _ATTR[f[1]].source == "knowledge"]
    if not local or not history:
        raise InvalidInput(f"env: the {split} facts need both local and history facts; use more towns")
    tasks: list[Task] = []
    seen = set(avoid)
    for _ in range(size * 50):  # bounded: gives up long before this on a too-small world
        if len(tasks) == size:
            break
        kind = env.cycle[len(tasks) % len(env.cycle)]
        if kind == "arithmetic":
            query, answer = _arithmetic(rng)
        elif kind in ("lookup", "history"):
            query, answer = _lookup(rng, env, rng.choice(local if kind == "lookup" else history))
        elif kind == "two_hop":
            query, answer = _two_hop(rng, env, rng.choice(local))
        else:
            query, answer = _three_hop(rng, env, local)
        if query in seen:
            continue
        seen.add(query)
        tasks.append(Task(id=f"{split}-{len(tasks):04d}", query=query, answer=str(answer), kind=kind,
                          tools=EXPECTED_TOOLS[kind], split=split))
    if len(tasks) < size:
        raise InvalidInput(f"env: could not make {size} distinct {split} tasks from {len(facts)} facts; "
                           f"use more towns or fewer tasks")
    return tasks


def environment_from_spec(spec: str) -> SyntheticEnv | None:
    """``""`` -> None; ``"synthetic"`` or ``"synthetic:SEED"`` -> that environment (what services are told to serve).
    The services serve the standard mode: the hard mode is the in-process learning bench's."""
    if not spec:
        return None
    name, _, seed = spec.partition(":")
    if name != "synthetic" or (seed and not seed.lstrip("-").isdigit()):
        raise InvalidInput(f"environment must be 'synthetic' or 'synthetic:SEED', got {spec!r}")
    return SyntheticEnv(EnvConfig(seed=int(seed or 0)))
