"""How often the agent answers with what its own prompts showed it; prints JSON (last line: the summary).

  .venv/bin/python bench/answer_copy.py [--benchmarks ../shared/benchmarks] [--per-set 4] [--out DIR]

Runs ``agentflow eval`` (the default SmolLM2 engine, in-process) on the first ``--per-set`` items of five bundled
benchmark sets (20 items by default) and counts the answers that are a *showcase value*: a number printed by a tool
card's example program or a worked example's program, or a tool result or answer in a worked example
(``agentflow/prompts/examples.json``), when the gold answer is not that number; or that repeat a worked example's
calculation (``12 * 34``) the question does not ask. A model that copies its examples shows up here; the target is
0 copies. The executor and the generator refuse such copies (a step error, no answer), so this counts what gets past
them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from importlib.resources import files

from agentflow.modules.prompting import repeats_an_example
from agentflow.tools.python_tool import PythonTool

SETS = (("bamboogle", "search"), ("2wiki", "search"), ("hotpotqa", "search"), ("aime24", "math"),
        ("gameof24", "gameof24"))
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
FENCED = re.compile(r"```python\n(.*?)```", re.S)
RESULT = re.compile(r"(?:Result|Answer): (-?\d+(?:\.\d+)?)")  # a value a worked example shows as found


def showcase_values() -> set[str]:
    """The numbers a module sees as results in its prompts: what the python card's example programs and the worked
    examples' programs print, and the tool results and answers the worked examples show."""
    shots = json.loads(files("agentflow").joinpath("prompts", "examples.json").read_text())
    replies = [example["reply"] for examples in shots.values() if isinstance(examples, list) for example in examples]
    programs = [*PythonTool().spec.examples, *(code for reply in replies for code in FENCED.findall(reply))]
    values: set[str] = set()
    for program in programs:
        run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=30)
        values.update(NUMBER.findall(run.stdout))
    for text in (json.dumps(examples) for examples in shots.values()):
        values.update(RESULT.findall(text))
    return values


def copied(prediction: str, gold, values: set[str], question: str = "") -> str:
    """The showcase value ``prediction`` consists of, or the worked examples' calculation it repeats (``12 * 34``)
    although the question does not ask it; '' when it is anything else or the gold answer itself."""
    if expression := repeats_an_example(prediction or "", question):
        return expression
    found = NUMBER.findall(prediction or "")
    if len(found) != 1 or found[0] not in values:
        return ""
    golds = gold if isinstance(gold, list) else [gold]
    return "" if any(found[0] in NUMBER.findall(str(g)) for g in golds) else found[0]


def evaluate(data: Path, kind: str, limit: int, out: Path) -> list[dict]:
    command = [sys.executable, "-m", "agentflow.cli", "eval", "--data", str(data), "--kind", kind, "--limit",
               str(limit), "--out", str(out), "--no-progress", "--concurrency", "4"]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, timeout=3600)
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmarks", type=Path,
                        default=Path(os.environ.get("AGENTFLOW_BENCHMARKS", "../shared/benchmarks")))
    parser.add_argument("--per-set", type=int, default=4)
    parser.add_argument("--out", type=Path, help="keep the eval runs here (default: a temporary folder)")
    args = parser.parse_args()
    values = showcase_values()
    rows, started = [], time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        for name, kind in SETS:
            for row in evaluate(args.benchmarks / f"{name}.json", kind, args.per_set, root / name):
                copy = copied(row.get("prediction", ""), row.get("answer"), values, row.get("query", ""))
                rows.append({"set": name, "pid": row["pid"], "prediction": str(row.get("prediction", ""))[:80],
                             "correct": row["correct"], "copied": copy})
                print(json.dumps(rows[-1]), flush=True)
    copies = [r for r in rows if r["copied"]]
    print(json.dumps({"items": len(rows), "copies": len(copies), "copy_rate": round(len(copies) / len(rows), 3),
                      "copied_values": sorted({r["copied"] for r in copies}), "showcase_values": sorted(values),
                      "correct": sum(r["correct"] for r in rows), "wall_s": round(time.monotonic() - started)}))


if __name__ == "__main__":
    main()
