"""The trajectory record (docs/architecture.md) as a plain dict shaped exactly like ``agentflow.v1.Trajectory``.

``trajectory.schema.json`` (beside this file) is its JSON Schema; tests check both against each other.
"""

from __future__ import annotations

import json
import logging
import math
from functools import lru_cache
from importlib.resources import files

from agentflow.llm.base import Completion

log = logging.getLogger(__name__)
SCHEMA_VERSION = 1
SOURCES = ("traffic", "training", "eval")
FINISHED = ("answered", "max_steps")  # the statuses of a trajectory that ran its course (not cut by time or errors)


def llm_call(completion: Completion | None) -> dict:
    """The record of one LLM call. Log-probs with a non-finite value (a faulty server) are left out as a whole:
    the trainer recomputes missing ones, while a NaN would break the record's encoding and the importance ratio."""
    if completion is None:
        return {}
    logprobs = list(completion.logprobs)
    if not all(math.isfinite(lp) for lp in logprobs):
        log.warning("dropping non-finite logprobs returned by %s", completion.model_version or "the engine")
        logprobs = []
    return {
        "text": completion.text,
        "prompt_token_ids": list(completion.prompt_token_ids),
        "token_ids": list(completion.token_ids),
        "logprobs": logprobs,
        "model_version": completion.model_version,
        "finish_reason": completion.finish_reason,
        "latency_s": round(completion.latency_s, 6),
    }


def new_record(tid: str, group_id: str, query: str, ground_truth: str, source: str, started_at_unix: float,
               train_ok: bool = False, owner: str = "") -> dict:
    return {
        "schema_version": SCHEMA_VERSION, "trajectory_id": tid, "group_id": group_id, "query": query,
        "ground_truth": ground_truth, "source": source, "analysis": "", "status": "", "answer": "", "error": "",
        "trace_id": "", "started_at_unix": started_at_unix, "turns": [], "memory": {}, "rewards": [], "totals": {},
        "analysis_call": {}, "generator": {}, "train_ok": train_ok, "owner": owner,
    }


def may_branch(record: dict, turn: int | None = None) -> bool:
    """Whether a shadow branch may start from this record after ``turn`` turns (any turn when None): a finished
    record the trainer may learn from (a training rollout, or traffic whose user allowed it: ``train_ok``; never
    opted-out traffic), with 1 <= turn < its turns and a memory that holds every one of its steps (not compacted,
    not itself a branch, whose memory also holds the steps it started from)."""
    memory = record.get("memory") or {}
    turns = len(record.get("turns") or [])
    allowed = record.get("source") == "training" or (record.get("source") == "traffic" and record.get("train_ok"))
    return (bool(allowed) and record.get("status") in FINISHED and turns >= 2
            and (turn is None or 1 <= turn < turns)
            and not memory.get("compacted_steps") and not memory.get("summary")
            and len(memory.get("steps") or []) == turns)


def finish(record: dict, memory, latency_s: float) -> dict:
    """Close a record: the final memory and the totals."""
    record["memory"] = memory.to_dict()
    record["totals"] = totals(record, latency_s)
    return record


def totals(record: dict, latency_s: float) -> dict:
    """Turn, token and latency totals over every LLM call the record holds."""
    calls = [record["analysis_call"], record["generator"]]
    calls += [turn[k] for turn in record["turns"] for k in ("planner", "executor", "verifier")]
    return {
        "turns": len(record["turns"]),
        "prompt_tokens": sum(len(c.get("prompt_token_ids", [])) for c in calls),
        "completion_tokens": sum(len(c.get("token_ids", [])) for c in calls),
        "latency_s": round(latency_s, 6),
    }


# --- reading a record ---------------------------------------------------------------------------------------------

#: Reward sources, most trusted first: a rule against the ground truth, people's feedback, the group's majority
#: vote, an LLM judge. Records name feedback ``human``; ``feedback`` is read as the same source. A rating never
#: outranks the ground truth unless a deployment says so (``RATINGS_FIRST``: the trainer's ``ratings_over_rule``).
REWARD_PRECEDENCE = ("rule", "human", "vote", "judge")
RATINGS_FIRST = ("human", "rule", "vote", "judge")
_SOURCE_ALIASES = {"feedback": "human"}


def _source(name: str) -> str:
    return _SOURCE_ALIASES.get(name, name)


def reward_value(reward: dict) -> float | None:
    """A reward's value clipped to [0, 1]; None when it is not a finite number (such a reward counts as absent)."""
    value = reward.get("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return min(1.0, max(0.0, float(value)))


class Record:
    """A read-only view of one trajectory record: the reads that the trainer, the batch builder and the rollout
    controller share. The dict (shaped like ``agentflow.v1.Trajectory``) stays the wire and JSON form.

    **Reward** (``reward``): the most trusted source present wins, in ``REWARD_PRECEDENCE`` order — a rule against
    the ground truth, then human feedback, then a group vote, then an LLM judge (``RATINGS_FIRST`` when a deployment
    puts ratings above the rule); sources not listed there are ignored.
    Within the winning source the *latest* reward wins (rewards are appended as they arrive: a person who changes
    their mind, or a re-scored rule, replaces the earlier value instead of being averaged with it). Values are
    clipped to [0, 1]; a value that is not a finite number counts as absent. No reward: None.
    """

    __slots__ = ("data",)

    def __init__(self, data: dict):
        self.data = data

    @property
    def turns(self) -> list[dict]:
        return self.data.get("turns") or []

    def rewards(self, source: str) -> list[float]:
        """The clipped values of ``source``'s rewards, in arrival order."""
        source = _source(source)
        values = [reward_value(r) for r in self.data.get("rewards") or [] if _source(r.get("source", "")) == source]
        return [v for v in values if v is not None]

    def reward(self, sources=None, precedence: tuple[str, ...] = REWARD_PRECEDENCE) -> float | None:
        """R of the record by ``precedence``, counting only ``sources`` (names from ``REWARD_PRECEDENCE``; None: all
        of them). The order of ``sources`` does not matter: only ``precedence`` orders them."""
        wanted = set(REWARD_PRECEDENCE) if sources is None else {_source(s) for s in sources}
        if unknown := wanted - set(REWARD_PRECEDENCE):
            raise ValueError(f"unknown reward source(s) {sorted(unknown)}; known: {', '.join(REWARD_PRECEDENCE)}")
        for source in precedence:
            values = self.rewards(source) if source in wanted else []
            if values:
                return values[-1]
        return None

    def planner_calls(self) -> list[dict]:
        """Each turn's planner call ({} for a turn without one), in turn order; the query analysis is not a turn."""
        return [turn.get("planner") or {} for turn in self.turns]

    def planner_versions(self) -> set[str]:
        """The serving versions on the planner's calls (the analysis and every turn's plan), empty ones left out."""
        calls = [self.data.get("analysis_call") or {}, *self.planner_calls()]
        return {call.get("model_version") or "" for call in calls} - {""}

    def tools(self) -> list[str]:
        """The tool the planner chose at each turn ("" where it chose none)."""
        return [(turn.get("decision") or {}).get("tool") or "" for turn in self.turns]

    def error_rate(self) -> float:
        """Share of the turns that ended in a tool error or a planner parse error; 1.0 for status "error"."""
        if self.data.get("status") == "error":
            return 1.0
        turns = self.turns
        return sum(1 for t in turns if t.get("tool_error") or t.get("parse_error")) / len(turns) if turns else 0.0

    def latency_s(self) -> float:
        """The end-to-end latency from the totals (0.0 when absent)."""
        return max(0.0, float((self.data.get("totals") or {}).get("latency_s") or 0.0))


@lru_cache(maxsize=1)
def schema() -> dict:
    return json.loads(files("agentflow").joinpath("domain", "trajectory.schema.json").read_text())


def validate(record: dict) -> None:
    """Raise jsonschema.ValidationError when ``record`` is not a well-formed trajectory."""
    import jsonschema

    jsonschema.validate(record, schema())
