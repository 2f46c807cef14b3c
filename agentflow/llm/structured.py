"""JSON-schema-guided decoding for the embedded engine, for the flat schemas the modules use.

A supported schema is an object whose properties are strings: free one-line strings, or closed choices (``enum``).
The output is built field by field in declaration order: the scaffolding (``{"name": "``) is forced, a free string
is sampled until its closing quote or a newline, and a choice is decoded token by token among the options'
allowed tokens (argmax at temperature 0, sampled at temperature > 0 so the planner still explores). The result is
always valid JSON.

The returned token ids are the tokenisation of the final text, and their logprobs come from one forward pass of the
model over prompt + response (raw log-softmax, as the trainer recomputes them).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import torch

from agentflow.errors import EngineTimeout
from agentflow.llm.base import Completion, Sampling

STRING_STOPS = ('"', "\n")


def supports(schema: dict | None) -> bool:
    if not schema or schema.get("type") != "object" or not schema.get("properties"):
        return False
    return all(isinstance(p, dict) and p.get("type") == "string" for p in schema["properties"].values())


def decode(engine, prompt_ids: list[int], schema: dict, sampling: Sampling, deadline: float) -> Completion:
    """Fill ``schema`` field by field; ``engine`` is an EmbeddedEngine (model, tokenizer, generate)."""
    properties = schema["properties"]
    budget = max(8, sampling.max_tokens // len(properties))
    text = "{"
    for i, (name, spec) in enumerate(properties.items()):
        if time.monotonic() >= deadline:
            raise EngineTimeout("structured decoding ran past its deadline")
        text += ("" if i == 0 else ", ") + json.dumps(name) + ": "
        if "enum" in spec:
            text += json.dumps(_choose(engine, prompt_ids, text, list(spec["enum"]), sampling))
        else:
            value = _free_string(engine, prompt_ids, text + '"', sampling, budget, deadline)
            text += json.dumps(value)
    text += "}"
    eos = engine.model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, (list, tuple)) else eos
    response = engine.tokenizer.encode(text, add_special_tokens=False) + ([eos] if eos is not None else [])
    return Completion(text=text, prompt_token_ids=list(prompt_ids), token_ids=response,
                      logprobs=_logprobs(engine.model, prompt_ids, response), model_version=engine.version,
                      finish_reason="stop")


def _free_string(engine, prompt_ids, text: str, sampling: Sampling, budget: int, deadline: float) -> str:
    ids = prompt_ids + engine.tokenizer.encode(text, add_special_tokens=False)
    stops = tuple(dict.fromkeys(sampling.stop + STRING_STOPS))
    out = engine.generate([ids], replace(sampling, stop=stops), max_new_tokens=[budget],
                          max_time=deadline - time.monotonic())[0]
    return out.text.strip()


def _choose(engine, prompt_ids, text: str, options: list[str], sampling: Sampling) -> str:
    """Walk the options' token trie after ``text``: at each fork, sample (or argmax) among the allowed next tokens.

    This is what grammar-guided decoding does: the model's distribution renormalised over the allowed tokens, so a
    long option is not penalised for its length.
    """
    encoded = {o: engine.tokenizer.encode(text + json.dumps(o), add_special_tokens=False) for o in options}
    pos = _common_prefix(list(encoded.values()))
    context = prompt_ids + encoded[options[0]][:pos]
    alive = list(options)
    while len(alive) > 1:
        allowed = sorted({encoded[o][pos] for o in alive})
        if len(allowed) > 1:
            with torch.inference_mode():
                logits = engine.model(input_ids=torch.tensor([context])).logits[0, -1].float()
            scores = logits[allowed].log_softmax(-1)
            if sampling.temperature <= 0:
                token = allowed[int(scores.argmax())]
            else:
                token = allowed[int(torch.multinomial(torch.softmax(scores / sampling.temperature, -1), 1))]
        else:
            token = allowed[0]
        alive = [o for o in alive if encoded[o][pos] == token]
        context.append(token)
        pos += 1
    return alive[0]


def _logprobs(model, prompt_ids: list[int], response: list[int]) -> list[float]:
    ids = torch.tensor([prompt_ids + response])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1: -1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1).tolist()


def _common_prefix(seqs: list[list[int]]) -> int:
    n = 0
    while all(len(s) > n for s in seqs) and len({s[n] for s in seqs}) == 1:
        n += 1
    return min(n, min(map(len, seqs)) - 1)  # every option keeps at least one token to tell it apart
