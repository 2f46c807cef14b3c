"""How far the log-probs a server returns are from the trainer's own, with matching weights, per backend; prints JSON.

  .venv/bin/python bench/behaviour_mismatch.py [--model smollm2|tiny|DIR] [--samples 16] [--max-tokens 32] [--no-vllm]

The trainer's proof of the sampling version (trainer/behaviour.py) quarantines a group whose served log-probs differ
from its recomputed ones by more than ``--behaviour-bound`` nats per token on rows of the version being trained.
This measures what matching weights give, which the bound must stay well above: for each backend (serve-llm in
float32 and in bfloat16, vLLM in float32 and in bfloat16), ``--samples`` chat completions at temperature 1 with
their log-probs (``OpenAIEngine``, as the planner calls them), recomputed by the trainer's ``sequence_logprobs`` in
float32 on the same folder. Per backend: mean and p99 |Δ| per token, the largest, and the mean sequence-level
KL(served ‖ trainer) (k3). Every server this starts is stopped however the script ends.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
from agentflow.children import stop_group
from _proc import start_announcing  # bench/_proc.py: this script's folder is on sys.path

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["Which tool answers: what is 17 times 23?", "Plan the next step: find the population of the largest town.",
           "Sub-goal: search the corpus for the river's length, then STOP.", "Name one tool and say why.",
           "You are the planner. The question: who founded the oldest town? Choose a tool."]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="smollm2 (SmolLM2-135M-Instruct), tiny (random) or a folder")
    p.add_argument("--samples", type=int, default=16, help="completions per backend")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--no-vllm", action="store_true", help="serve-llm only")
    return p.parse_args(argv)


def model_folder(name: str, work: Path) -> Path:
    from agentflow.llm.models import build_tiny, smollm2_dir

    return smollm2_dir() if name == "smollm2" else build_tiny(work / "tiny", seed=0) if name == "tiny" else Path(name)


def sample(url: str, n: int, max_tokens: int) -> list:
    from agentflow.llm.base import Sampling
    from agentflow.llm.openai_engine import OpenAIEngine, OpenAIEngineConfig

    engine = OpenAIEngine(OpenAIEngineConfig(endpoint=url, timeout_s=600.0))
    try:
        return [engine.complete([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                Sampling(temperature=1.0, max_tokens=max_tokens, seed=i), timeout=600)
                for i in range(n)]
    finally:
        engine.close()


def mismatch(model, pad_id: int, completions) -> dict:
    """The trainer's float32 log-probs of the completions' tokens against the served ones."""
    from agentflow.trainer.batch import sequence_logprobs
    from agentflow.trainer.behaviour import row_mismatch

    rows = [(c.prompt_token_ids, c.token_ids, c.logprobs) for c in completions if c.token_ids]
    width = max(len(p) + len(r) for p, r, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    response = torch.zeros_like(ids, dtype=torch.bool)
    served = torch.zeros(len(rows), width)
    for b, (p, r, lp) in enumerate(rows):
        ids[b, : len(p) + len(r)] = torch.tensor(p + r)
        attention[b, : len(p) + len(r)] = 1
        response[b, len(p): len(p) + len(r)] = True
        served[b, len(p): len(p) + len(r)] = torch.tensor(lp)
    with torch.no_grad():
        ours = sequence_logprobs(model, ids, attention, response)
    found = row_mismatch(ours, served, response, torch.zeros(len(rows), dtype=torch.bool))
    deltas = (ours.double() - served.double()).abs()[response]
    return {"tokens": int(found.tokens.sum()), "mean_abs": float(found.abs_sum.sum() / found.tokens.sum()),
            "p99_abs": float(deltas.quantile(0.99)), "max_abs": float(deltas.max()),
            "seq_kl_mean": float(found.seq_kl.mean())}


def serve_llm(folder: Path, dtype: str, log) -> tuple:
    exe = Path(sys.executable).with_name("agentflow")
    cmd = [str(exe), "serve-llm", "--model", str(folder), "--port", "0", "--dtype", dtype]
    process, ready = start_announcing(cmd, log, timeout_s=600, cwd=REPO)
    return ready["url"], lambda: stop_group(process)


def vllm(folder: Path, dtype: str, log) -> tuple:
    from agentflow.llm.vllm_server import start_vllm

    server = start_vllm(folder, served_model_name="bench", dtype=dtype, max_model_len=1024, startup_timeout_s=600,
                        extra_args=["--logprobs-mode", "raw_logprobs"], log_path=log.name)
    return server.url, server.stop


def main(argv=None) -> dict:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="behaviour-mismatch-"))
    folder = model_folder(args.model, work)
    model, tokenizer = _plain(folder)
    backends = [("serve-llm", "float32", serve_llm), ("serve-llm", "bfloat16", serve_llm)]
    if not args.no_vllm:
        backends += [("vllm", "float32", vllm), ("vllm", "bfloat16", vllm)]
    results = {}
    for name, dtype, start in backends:
        key = f"{name}-{dtype}"
        with (work / f"{key}.log").open("w") as log:
            try:
                url, stop = start(folder, dtype, log)
            except Exception as e:  # noqa: BLE001 - one backend that cannot start is reported, the others measured
                results[key] = {"error": f"{type(e).__name__}: {e}"[:300]}
                print(json.dumps({"backend": key, **results[key]}), flush=True)
                continue
            try:
                results[key] = mismatch(model, tokenizer.pad_token_id or 0, sample(url, args.samples, args.max_tokens))
            finally:
                stop()
        print(json.dumps({"backend": key, **results[key]}), flush=True)
    summary = {"event": "summary", "model": args.model, "samples": args.samples, "max_tokens": args.max_tokens,
               "trainer_dtype": "float32", "backends": results}
    print(json.dumps(summary), flush=True)
    return summary


def _plain(folder: Path):
    from transformers import AutoTokenizer

    from agentflow.llm.models import load_causal_lm

    return load_causal_lm(folder).eval(), AutoTokenizer.from_pretrained(folder)


if __name__ == "__main__":
    main(sys.argv[1:])
