"""Do training rollouts yield to users at a busy vLLM? Users' latency while training calls flood the server, with
vLLM's default first-come-first-served scheduling and with ``--scheduling-policy priority`` plus the ring's
background priority on training calls (``llm.priorityScheduling``; docs/serving.md, "Training yields to users").

One real vLLM (CPU build) per policy, on the same model, restarted for each round (policies alternate). In each
round: ``--background`` closed-loop clients send training calls (``llm_priority(True)``, as a ring service handling a
training rollout's event) and one client sends users' calls one after another; the server batches at most
``--max-num-seqs`` calls, so the rest queue. Prints one JSON object: per policy the median over rounds of the
users' median and 95th-percentile latency and the training calls completed per second, the users' latency alone
(no training load) as the baseline, and the ratios.

    .venv/bin/python bench/llm_priority.py [--rounds 3] [--seconds 30] [--background 6] [--max-num-seqs 2]

Everything it started stops with it (Ctrl-C, SIGTERM, an error).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MESSAGES = [{"role": "user", "content": "Count from one to twenty in words, one per line."}]


def progress(**fields) -> None:
    print(json.dumps(fields), file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(url: str, *, scheduling: bool, background: int, seconds: float, max_tokens: int) -> dict:
    """Users' latencies and the training calls done while ``background`` clients flood the server."""
    from agentflow.llm.base import Sampling, llm_priority
    from agentflow.llm.openai_engine import OpenAIEngine, OpenAIEngineConfig

    config = OpenAIEngineConfig(endpoint=url, timeout_s=120, token_details=False, structured_output=False,
                                priority_scheduling=scheduling)
    sampling = Sampling(temperature=0.0, max_tokens=max_tokens)
    stop, done = threading.Event(), [0]

    def training() -> None:
        engine = OpenAIEngine(config)
        with llm_priority(True):
            while not stop.is_set():
                engine.complete(MESSAGES, Sampling(temperature=1.0, max_tokens=max_tokens), timeout=120)
                done[0] += 1

    threads = [threading.Thread(target=training, daemon=True) for _ in range(background)]
    for thread in threads:
        thread.start()
    user, latencies = OpenAIEngine(config), []
    time.sleep(1.0 if background else 0.0)  # the queue fills
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        call = time.monotonic()
        user.complete(MESSAGES, sampling, timeout=120)
        latencies.append(time.monotonic() - call)
    elapsed, before = time.monotonic() - started, done[0]
    stop.set()
    for thread in threads:
        thread.join(timeout=130)
    return {"user_p50_s": statistics.median(latencies), "user_p95_s": percentile(latencies, 0.95),
            "user_calls": len(latencies), "training_calls_per_s": before / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 (SmolLM2-135M-Instruct; default), tiny (a random "
                                                            "tiny model: its calls are mostly HTTP and scheduling "
                                                            "overhead on a CPU, not generation) or a model folder")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0, help="users' calls per measurement, in seconds")
    parser.add_argument("--background", type=int, default=6, help="closed-loop training clients")
    parser.add_argument("--max-num-seqs", type=int, default=2, help="vLLM's batch: the rest of the calls queue")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()

    import tempfile

    from agentflow.llm.models import build_tiny, smollm2_dir
    from agentflow.llm.vllm_server import start_vllm

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # through the finally blocks: the servers stop
    with tempfile.TemporaryDirectory(prefix="llm-priority-") as scratch:
        model = {"tiny": lambda: build_tiny(Path(scratch) / "tiny", seed=0), "smollm2": smollm2_dir}.get(
            args.model, lambda: Path(args.model))()
        runs: dict[str, list[dict]] = {"alone": [], "fcfs": [], "priority": []}
        load_before = os.getloadavg()[0]
        for round_ in range(args.rounds):
            for policy in ("fcfs", "priority") if round_ % 2 == 0 else ("priority", "fcfs"):
                server = start_vllm(model, served_model_name="bench", dtype="float32", max_model_len=1024,
                                    startup_timeout_s=600,
                                    extra_args=["--max-num-seqs", str(args.max_num_seqs), "--scheduling-policy",
                                                policy])
                try:
                    scheduling = policy == "priority"
                    measure(server.url, scheduling=scheduling, background=0, seconds=2, max_tokens=args.max_tokens)
                    if policy == "fcfs":
                        alone = measure(server.url, scheduling=False, background=0, seconds=args.seconds,
                                        max_tokens=args.max_tokens)
                        runs["alone"].append(alone)
                        progress(round=round_, policy="alone", **alone)
                    loaded = measure(server.url, scheduling=scheduling, background=args.background,
                                     seconds=args.seconds, max_tokens=args.max_tokens)
                    runs[policy].append(loaded)
                    progress(round=round_, policy=policy, **loaded)
                finally:
                    server.stop()

    def median(policy: str, key: str) -> float:
        return round(statistics.median(r[key] for r in runs[policy]), 4)

    result = {"bench": "llm_priority", "model": args.model, "rounds": args.rounds, "seconds": args.seconds,
              "background_clients": args.background, "max_num_seqs": args.max_num_seqs,
              "max_tokens": args.max_tokens, "cpus": os.cpu_count(),
              "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    for policy in runs:
        result[policy] = {key: median(policy, key) for key in runs[policy][0]}
    result["user_p50_ratio_fcfs_to_alone"] = round(result["fcfs"]["user_p50_s"] / result["alone"]["user_p50_s"], 2)
    result["user_p50_ratio_priority_to_alone"] = round(
        result["priority"]["user_p50_s"] / result["alone"]["user_p50_s"], 2)
    result["user_p95_ratio_priority_to_fcfs"] = round(
        result["priority"]["user_p95_s"] / result["fcfs"]["user_p95_s"], 2)
    result["training_throughput_ratio_priority_to_fcfs"] = round(
        result["priority"]["training_calls_per_s"] / max(result["fcfs"]["training_calls_per_s"], 1e-9), 2)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
