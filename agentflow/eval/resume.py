"""Resuming an interrupted eval run (``agentflow eval --resume DIR``).

A run writes ``run.json`` into its folder before its first item: the flags that define it (resolved: the engine and
model the environment chose too), the hash of its items and when the session started. A resumed run reads them back,
refuses if the data no longer hashes the same, skips the items already in ``results.jsonl`` and appends the rest.
API keys are never written; a resumed run takes them from its own flags or environment.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from agentflow.errors import InvalidInput
from agentflow.eval.data import Item
from agentflow.eval.items import read_results
from agentflow.eval.runner import RESULTS_FILE, RUN_FILE

RUN_SCHEMA = "agentflow.eval.run/1"
# The flags (argparse names) that define a run; --out, the display flags and the API keys are a session's own.
SETTINGS = ("data", "kind", "limit", "concurrency", "max_steps", "max_time", "engine", "model", "endpoint",
            "planner_endpoint", "planner_model", "tools", "corpus", "retriever", "temperature", "judge_endpoint",
            "judge_model", "gateway")
PATHS = ("data", "corpus")


def run_settings(args, *, limit, concurrency, loop, tool_names, shared, planner) -> dict:
    """The SETTINGS of a validated run, as flag values that rebuild it: paths absolute, engines as resolved."""
    separate = planner != shared
    return {"data": str(Path(args.data).resolve()), "kind": args.kind, "limit": limit, "concurrency": concurrency,
            "max_steps": loop.max_steps, "max_time": loop.max_time_s, "engine": shared.engine, "model": shared.model,
            "endpoint": shared.endpoint, "planner_endpoint": planner.endpoint if separate else None,
            "planner_model": planner.model if separate else None, "tools": ",".join(tool_names),
            "corpus": str(Path(args.corpus).resolve()) if getattr(args, "corpus", None) else None,
            "retriever": getattr(args, "retriever", None), "temperature": getattr(args, "temperature", 0.0),
            "judge_endpoint": getattr(args, "judge_endpoint", None), "judge_model": getattr(args, "judge_model", None),
            "gateway": getattr(args, "gateway", None)}


def write_run_file(out_dir: Path, *, run_id: str, data_sha256: str, settings: dict, wall_s_before: float) -> Path:
    """Write ``run.json`` (replacing it whole, so a crash leaves the old one) at the start of a session."""
    body = {"schema": RUN_SCHEMA, "run_id": run_id, "data_sha256": data_sha256, "settings": settings,
            "session_started_unix": round(time.time(), 3), "wall_s_before": round(wall_s_before, 3)}
    path, scratch = out_dir / RUN_FILE, out_dir / f".{RUN_FILE}.tmp"
    scratch.write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(scratch, path)
    return path


def read_run_file(folder: Path) -> dict:
    """The ``run.json`` of the run in ``folder``; InvalidInput (naming --resume) when ``folder`` holds no such run."""
    path = Path(folder) / RUN_FILE
    if not Path(folder).is_dir():
        raise InvalidInput(f"--resume {folder}: no such folder")
    if not path.is_file():
        raise InvalidInput(f"--resume {folder}: not a resumable eval run (no {RUN_FILE}; runs made before --resume "
                           "existed lack it)")
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidInput(f"--resume {folder}: cannot read {RUN_FILE}: {e}") from None
    if not isinstance(body, dict) or body.get("schema") != RUN_SCHEMA:
        raise InvalidInput(f"--resume {folder}: {RUN_FILE} is not an eval run file (schema {RUN_SCHEMA})")
    return body


def resumed_args(args: argparse.Namespace, stored: dict, defaults: dict) -> argparse.Namespace:
    """``args`` with the stored run's SETTINGS; a defining flag given with another value than the run's (and than
    its default) is an InvalidInput naming it, as is --out."""
    folder = args.resume
    if getattr(args, "out", None) is not None:
        raise InvalidInput(f"--resume {folder} writes into {folder}; drop --out")
    settings = stored["settings"]
    for key in SETTINGS:
        given = getattr(args, key, None)
        if given is not None and given != defaults.get(key) and not _same(key, given, settings.get(key)):
            flag = "--" + key.replace("_", "-")
            raise InvalidInput(f"--resume {folder} runs with the run's own settings: {flag} {given} differs from "
                               f"its {settings.get(key)!r} ({RUN_FILE}); drop {flag}")
    resumed = argparse.Namespace(**vars(args))
    for key in SETTINGS:
        value = settings.get(key)
        setattr(resumed, key, Path(value) if key in PATHS and value is not None else value)
    return resumed


def _same(key: str, given, stored) -> bool:
    if key in PATHS and stored is not None:
        return Path(given).resolve() == Path(stored).resolve()
    return given == stored


def resume_point(folder: Path, stored: dict, items: list[Item],
                 data_sha256: str) -> tuple[list[dict], list[Item], float]:
    """(rows finished before, items still to run, seconds the earlier sessions took) of the run in ``folder``;
    InvalidInput when the data changed since it started.

    An earlier session ran from its start (``run.json``) until its last row was written (the results' mtime).
    """
    if stored.get("data_sha256") != data_sha256:
        raise InvalidInput(f"--resume {folder}: the data file {stored['settings'].get('data')} changed since the run "
                           f"started (its items hash differently); start a new run instead")
    results = Path(folder) / RESULTS_FILE
    previous = read_results(results) if results.is_file() else []
    done = {str(row["pid"]) for row in previous}
    last_session = results.stat().st_mtime - stored.get("session_started_unix", 0) if results.is_file() else 0.0
    wall_before = stored.get("wall_s_before", 0.0) + max(last_session, 0.0)
    return previous, [item for item in items if item.pid not in done], wall_before
