"""The second degraded version of `agentflow demo --inject-bad-version`: one that asks the user back instead of
answering, the reward hack the ``refusal_rate`` tripwire is there for (agentflow/rollout/tripwires.py).

It is the stable planner after a few supervised steps that make it send every question naming a town to the
generalist first, and arithmetic to python. The generalist knows the towns' history and nothing else about them: on
a lookup or a two-hop question it hedges a guess and asks the user back (agentflow/envs/profiles.py), and that
reply is the answer.
So the version answers history and arithmetic as well as the stable one and asks back on a third of the queries:
on the labelled demo's rule reward it is about 0.2 worse, which the reward test cannot tell from the margin (0.15)
for a long time, while the tripwire sees a third of its answers ask back against at most a sixth of the stable
version's (one at the target, 0.8, may still send two-hop questions to the generalist after its search).

The demo builds it in a process of its own (``python -m agentflow.demo.asks_back``), started as the first degraded
version is published: in the demo's process, among its traffic and consumer threads, the same 30 steps took 6 to 9
minutes (each of thousands of small torch calls waits for the GIL), against 7 s alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

from agentflow.demo.injection import ASKS_BACK
from agentflow.envs.profiles import compact_plan_messages, entities
from agentflow.storage import replace_folder

QUESTIONS = 120  # train-split questions it is fine-tuned on
SFT_STEPS, SFT_BATCH = 30, 32  # a near-certain choice, from the untrained tiny planner too (its unit test)
SFT_LR = 3e-3


def first_turn_messages(question: str, tools: Sequence[str], max_steps: int) -> list[dict]:
    """What the planner model is shown on a query's first turn under the tiny-deterministic profile (the planner
    service's own rendering, ``PlannerAdapter``: no steps yet)."""
    return compact_plan_messages(f"Question: {question}\n\nThis is step 1 of at most {max_steps}.", tools)


def asks_back_tool(question: str) -> str:
    """The first tool the degraded version picks: the generalist for anything about a town, python otherwise."""
    return "generalist" if entities(question) else "python"


def build_asks_back(stable: Path, out: Path, questions: Sequence[str], tools: Sequence[str], *, max_steps: int,
                    seed: int = 0) -> dict:
    """Fine-tune the stable planner at ``stable`` on ``questions``' first turns towards ``asks_back_tool`` and save
    it at ``out`` (full weights, a model folder the LLM server loads as it is), which appears whole or not at all.
    The training metrics."""
    import torch

    from transformers import AutoTokenizer

    from agentflow.llm.embedded import encode_chat
    from agentflow.llm.models import load_checkpoint
    from agentflow.trainer.warmup import supervised_steps, tool_responses
    from agentflow.versions import CHECKPOINT_METADATA

    torch.manual_seed(seed)
    model, tokenizer = load_checkpoint(stable), AutoTokenizer.from_pretrained(stable)  # a LoRA version merged
    responses = dict(zip(tools, tool_responses(tokenizer, tools)))
    rows = [(encode_chat(tokenizer, first_turn_messages(q, tools, max_steps)), responses[asks_back_tool(q)])
            for q in questions]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    losses = supervised_steps(model, rows, pad_id=pad_id, steps=SFT_STEPS, lr=SFT_LR, seed=seed, batch=SFT_BATCH)
    metrics = {"sft_loss_first": round(losses[0], 4), "sft_loss_last": round(losses[-1], 4), "sft_steps": SFT_STEPS,
               "questions": len(questions)}
    partial = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        model.save_pretrained(partial, safe_serialization=True)
        tokenizer.save_pretrained(partial)
        (partial / CHECKPOINT_METADATA).write_text(json.dumps(
            {"parent": stable.name, "stage": ASKS_BACK, "export": "full", "metrics": metrics}, indent=1))
        replace_folder(partial, out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return metrics


def main(argv: Sequence[str] | None = None) -> None:
    """Build the version from the stable planner's folder on the environment's first train-split questions."""
    from agentflow.envs.synthetic import TOOLS, EnvConfig, SyntheticEnv

    parser = argparse.ArgumentParser(prog="python -m agentflow.demo.asks_back", description=main.__doc__)
    parser.add_argument("--stable", type=Path, required=True, help="the stable planner's model folder")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write (replaced if it exists)")
    parser.add_argument("--seed", type=int, default=0, help="the environment's seed, and the fine-tuning's")
    parser.add_argument("--max-steps", type=int, required=True, help="planner turns per query (the prompt says it)")
    args = parser.parse_args(argv)
    questions = [task.query for task in SyntheticEnv(EnvConfig(seed=args.seed)).train[:QUESTIONS]]
    metrics = build_asks_back(args.stable, args.out, questions, TOOLS, max_steps=args.max_steps, seed=args.seed)
    print(json.dumps({"event": "built", "out": str(args.out), **metrics}), flush=True)


if __name__ == "__main__":
    main()

