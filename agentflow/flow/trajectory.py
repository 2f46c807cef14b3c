"""The trajectory record (DESIGN §4) as a plain dict shaped exactly like ``agentflow.v1.Trajectory``.

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


def new_record(tid: str, group_id: str, query: str, ground_truth: str, source: str, started_at_unix: float) -> dict:
    return {
        "schema_version": SCHEMA_VERSION, "trajectory_id": tid, "group_id": group_id, "query": query,
        "ground_truth": ground_truth, "source": source, "analysis": "", "status": "", "answer": "", "error": "",
        "trace_id": "", "started_at_unix": started_at_unix, "turns": [], "memory": {}, "rewards": [], "totals": {},
        "analysis_call": {}, "generator": {},
    }


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


@lru_cache(maxsize=1)
def schema() -> dict:
    return json.loads(files("agentflow").joinpath("flow", "trajectory.schema.json").read_text())


def validate(record: dict) -> None:
    """Raise jsonschema.ValidationError when ``record`` is not a well-formed trajectory."""
    import jsonschema

    jsonschema.validate(record, schema())
