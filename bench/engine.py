"""Embedded-engine throughput and loop overhead; prints JSON (last line: the summary).

  .venv/bin/python bench/engine.py [--model smollm2|DIR] [--repeats 3] [--max-tokens 48]

* tokens/s of EmbeddedEngine at 1 and 8 concurrent requests vs plain sequential ``model.generate`` on the same
  prompts (greedy, same budget), median of ``--repeats`` runs, and the ratios against that baseline;
* the same runs per CPU second of this process (``tokens_per_cpu_s``, ``cpu_ratio_c8_vs_generate``): steadier than
  wall time on a shared machine;
* the loop's own overhead per step with a zero-latency scripted engine and an instant tool (µs/step).

``--first-run`` instead times what a new user runs: ``agentflow run QUESTION --json`` as a process (model loading
included) on simple arithmetic, with the weights in float32 and with ``--dtype auto`` (the default: bfloat16 on CPUs
with AVX512-BF16/AMX), each question ``--repeats`` times: median wall time and loop latency, the share answered
correctly, and the ratio auto/float32.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

import torch

from agentflow.llm.base import Sampling
from agentflow.llm.embedded import EmbeddedEngine
from agentflow.llm.models import smollm2_dir

PROMPTS = [f"In two sentences, explain why {topic}." for topic in (
    "the sky is blue", "ice floats on water", "leaves change colour", "bread rises", "magnets attract iron",
    "the moon has phases", "salt melts ice", "metal feels cold")]


def baseline_generate(engine: EmbeddedEngine, max_tokens: int) -> tuple[float, float]:
    """(tokens/s, tokens per CPU second) of plain model.generate, one prompt at a time."""
    tokens, started, cpu = 0, time.perf_counter(), time.process_time()
    for prompt in PROMPTS:
        ids = torch.tensor([engine.encode_chat([{"role": "user", "content": prompt}])])
        with torch.inference_mode():
            out = engine.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                        max_new_tokens=max_tokens, pad_token_id=engine.tokenizer.pad_token_id)
        tokens += out.shape[1] - ids.shape[1]
    return tokens / (time.perf_counter() - started), tokens / max(time.process_time() - cpu, 1e-9)


def engine_throughput(engine: EmbeddedEngine, max_tokens: int, concurrency: int) -> tuple[float, float]:
    """(tokens/s, tokens per CPU second) when the prompts arrive ``concurrency`` at a time from separate threads."""
    counts: list[int] = []

    def ask(prompt: str) -> None:
        c = engine.complete([{"role": "user", "content": prompt}], Sampling(max_tokens=max_tokens), timeout=600)
        counts.append(len(c.token_ids))

    started, cpu = time.perf_counter(), time.process_time()
    for i in range(0, len(PROMPTS), concurrency):
        threads = [threading.Thread(target=ask, args=(p,)) for p in PROMPTS[i:i + concurrency]]
        [t.start() for t in threads]
        [t.join() for t in threads]
    return sum(counts) / (time.perf_counter() - started), sum(counts) / max(time.process_time() - cpu, 1e-9)


def loop_overhead_us_per_step(steps: int = 4, queries: int = 200) -> float:
    from agentflow.flow.loop import Agent, LoopConfig
    from agentflow.llm.scripted import ScriptedEngine
    from agentflow.modules.executor import Executor
    from agentflow.modules.generator import Generator
    from agentflow.modules.planner import Planner
    from agentflow.modules.verifier import Verifier
    from agentflow.tools.base import ToolResult, ToolSpec

    class Instant:
        spec = ToolSpec("calc", "instant", "anything")

        def run(self, command, timeout):
            return ToolResult(output="1")

    def respond(messages):
        prompt = messages[-1]["content"]
        if "Choose the next step" in prompt:
            return "Context: -\nSub-Goal: compute\nTool Name: calc"
        if "Is this enough" in prompt:
            return "Analysis: more\nConclusion: CONTINUE"
        return "Answer: 1"

    engine, s = ScriptedEngine(respond), Sampling()
    tool = Instant()
    agent = Agent(Planner(engine, s, tools=(tool.spec,)), Executor(engine, s, tools={"calc": tool}),
                  Verifier(engine, s), Generator(engine, s), LoopConfig(max_steps=steps))
    started = time.perf_counter()
    for _ in range(queries):
        agent.solve("What is 1?")
    return (time.perf_counter() - started) / (queries * steps) * 1e6


ARITHMETIC = ("What is 2468 * 1357?", "What is 2+2?", "What is 81 / 9?", "What is 17 + 25?")


def first_run(question: str, dtype: str) -> dict:
    """One ``agentflow run`` process: wall seconds, the loop's own latency, whether the answer is right."""
    expected = eval(question.removeprefix("What is ").rstrip("?"))  # the bench's own literals
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "agentflow.cli", "run", question, "--json", "--dtype", dtype],
                          capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    record = json.loads(proc.stdout)
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", record["answer"])]
    return {"wall_s": wall, "latency_s": record["totals"]["latency_s"], "exit": proc.returncode,
            "correct": bool(numbers) and abs(numbers[-1] - expected) < 1e-6, "status": record["status"]}


def bench_first_run(repeats: int) -> None:
    results: dict[str, list[dict]] = {"float32": [], "auto": []}
    for r in range(repeats):
        for question in ARITHMETIC:
            for dtype in results:
                results[dtype].append(one := first_run(question, dtype))
                print(json.dumps({"repeat": r, "question": question, "dtype": dtype,
                                  **{k: round(v, 2) if isinstance(v, float) else v for k, v in one.items()}}),
                      flush=True)
    summary = {dtype: {"wall_s_median": round(statistics.median(x["wall_s"] for x in runs), 1),
                       "latency_s_median": round(statistics.median(x["latency_s"] for x in runs), 1),
                       "correct_share": round(sum(x["correct"] for x in runs) / len(runs), 2),
                       "timed_out": sum(x["exit"] == 3 for x in runs)} for dtype, runs in results.items()}
    print(json.dumps({"bench": "first_run", "questions": len(ARITHMETIC), "repeats": repeats, **summary,
                      "ratio_wall_auto_vs_float32": round(summary["auto"]["wall_s_median"]
                                                          / summary["float32"]["wall_s_median"], 2),
                      "load_avg_1m": round(os.getloadavg()[0], 2)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--first-run", action="store_true", help="time `agentflow run` on arithmetic instead")
    args = parser.parse_args()
    if args.first_run:
        return bench_first_run(args.repeats)
    engine = EmbeddedEngine(smollm2_dir() if args.model == "smollm2" else args.model, max_batch=8, dtype=args.dtype)
    engine_throughput(engine, 4, 8)  # warm-up
    runs: dict[str, list[float]] = {"generate_sequential": [], "engine_c1": [], "engine_c8": []}
    cpu_runs: dict[str, list[float]] = {k: [] for k in runs}  # tokens per CPU second of this process
    for r in range(args.repeats):
        for key, measure in (("generate_sequential", lambda: baseline_generate(engine, args.max_tokens)),
                             ("engine_c1", lambda: engine_throughput(engine, args.max_tokens, 1)),
                             ("engine_c8", lambda: engine_throughput(engine, args.max_tokens, 8))):
            wall, cpu = measure()
            runs[key].append(wall)
            cpu_runs[key].append(cpu)
        print(json.dumps({"repeat": r, **{k: round(v[-1], 1) for k, v in runs.items()}}), flush=True)
    median = {k: statistics.median(v) for k, v in runs.items()}
    cpu_median = {k: statistics.median(v) for k, v in cpu_runs.items()}
    overhead = statistics.median(loop_overhead_us_per_step() for _ in range(3))
    print(json.dumps({
        "bench": "engine", "model": args.model, "dtype": args.dtype, "max_tokens": args.max_tokens, "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "tokens_per_s": {k: round(v, 1) for k, v in median.items()},
        "ratio_c1_vs_generate": round(median["engine_c1"] / median["generate_sequential"], 2),
        "ratio_c8_vs_generate": round(median["engine_c8"] / median["generate_sequential"], 2),
        # per CPU second: steadier than wall time when other work shares the machine
        "tokens_per_cpu_s": {k: round(v, 1) for k, v in cpu_median.items()},
        "cpu_ratio_c8_vs_generate": round(cpu_median["engine_c8"] / cpu_median["generate_sequential"], 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "loop_overhead_us_per_step": round(overhead, 1),
    }))


if __name__ == "__main__":
    main()
