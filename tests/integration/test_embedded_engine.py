"""The embedded transformers engine on a real (tiny, random) model: batching, token details, deadlines."""

import threading
import time

import pytest
import torch

from agentflow.errors import EngineTimeout
from agentflow.llm.base import Sampling
from agentflow.llm.embedded import EmbeddedEngine


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = EmbeddedEngine(tiny_model_dir, max_batch=8, batch_wait_s=0.05)
    yield e
    e.close()


def msgs(i: int):
    return [{"role": "user", "content": f"Question number {i}: what is {i} plus {i}?"}]


def test_token_ids_and_logprobs_match_a_forward_pass(engine):
    c = engine.complete(msgs(1), Sampling(temperature=1.0, max_tokens=12, seed=0), timeout=30)
    assert len(c.token_ids) == len(c.logprobs) > 0 and all(lp <= 0 for lp in c.logprobs)
    assert c.prompt_token_ids == engine.encode_chat(msgs(1))
    ids = torch.tensor([c.prompt_token_ids + c.token_ids])
    with torch.no_grad():
        logits = engine.model(ids).logits[0, len(c.prompt_token_ids) - 1: -1]
    recomputed = logits.log_softmax(-1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(recomputed, torch.tensor(c.logprobs), atol=1e-4)
    assert c.model_version == engine.version


def test_concurrent_requests_are_batched(engine, monkeypatch):
    calls = []  # rows in each prefill (several columns) and decode step (one column) forward pass
    real = engine._forward

    def counting(ids, *a, **k):
        calls.append(ids.shape)
        return real(ids, *a, **k)

    monkeypatch.setattr(engine, "_forward", counting)
    results = [None] * 8

    def go(i):
        results[i] = engine.complete(msgs(i), Sampling(max_tokens=8), timeout=60)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert all(r is not None and r.token_ids for r in results)
    prefills = [rows for rows, width in calls if width > 1]
    assert len(prefills) < 8 and max(rows for rows, _ in calls) > 1  # requests shared forward passes
    # each caller got its own prompt back, whatever its padding in the batch
    assert [r.prompt_token_ids for r in results] == [engine.encode_chat(msgs(i)) for i in range(8)]


def test_batched_greedy_equals_single_greedy(engine):
    single = engine.generate([engine.encode_chat(msgs(3))], Sampling(max_tokens=10), max_new_tokens=[10])[0]
    batch = engine.generate([engine.encode_chat(msgs(3)), engine.encode_chat(msgs(12345))], Sampling(max_tokens=10),
                            max_new_tokens=[10, 10])[0]
    assert single.token_ids == batch.token_ids


def test_per_request_token_budget(engine):
    out = engine.generate([engine.encode_chat(msgs(1)), engine.encode_chat(msgs(2))], Sampling(temperature=1.0),
                          max_new_tokens=[3, 9])
    assert len(out[0].token_ids) <= 3 and len(out[0].logprobs) == len(out[0].token_ids)


def test_deadline_is_enforced(engine):
    started = time.monotonic()
    with pytest.raises(EngineTimeout):
        engine.complete(msgs(1), Sampling(max_tokens=4000, temperature=1.0), timeout=0.02)
    assert time.monotonic() - started < 0.5
    # the engine keeps serving afterwards
    assert engine.complete(msgs(2), Sampling(max_tokens=4), timeout=30).token_ids


PLAN_SCHEMA = {"type": "object", "properties": {"context": {"type": "string"}, "sub_goal": {"type": "string"},
                                                 "tool": {"type": "string", "enum": ["python", "search", "generalist"]}},
               "required": ["context", "sub_goal", "tool"], "additionalProperties": False}


def test_structured_output_is_valid_json_with_an_allowed_choice(engine):
    import json

    import jsonschema

    for seed in range(3):
        c = engine.complete(msgs(seed), Sampling(temperature=1.0, max_tokens=60, seed=seed), timeout=30,
                            json_schema=PLAN_SCHEMA)
        value = json.loads(c.text)
        jsonschema.validate(value, PLAN_SCHEMA)
        assert list(value) == ["context", "sub_goal", "tool"]
        assert len(c.token_ids) == len(c.logprobs) > 0 and all(lp <= 0 for lp in c.logprobs)
        assert engine.tokenizer.decode(c.token_ids, skip_special_tokens=True) == c.text


def test_structured_choice_is_sampled_at_temperature_and_fixed_at_zero(engine):
    import json

    def tools(temperature):
        return {json.loads(engine.complete(msgs(1), Sampling(temperature=temperature, max_tokens=24, seed=s),
                                           timeout=30, json_schema=PLAN_SCHEMA).text)["tool"] for s in range(12)}

    assert len(tools(0.0)) == 1
    assert len(tools(1.0)) > 1  # a random tiny model spreads its probability over the options: sampling explores


def test_unsupported_schema_falls_back_to_free_text(engine):
    nested = {"type": "object", "properties": {"a": {"type": "object"}}}
    c = engine.complete(msgs(1), Sampling(max_tokens=5), timeout=30, json_schema=nested)
    assert c.token_ids  # generated freely, no error


# --- continuous batching ---------------------------------------------------------------------------------------------


def alone(engine, i: int, max_tokens: int):
    """What request ``i`` decodes by itself, greedy."""
    return engine.generate([engine.encode_chat(msgs(i))], Sampling(max_tokens=max_tokens),
                           max_new_tokens=[max_tokens])[0]


def test_requests_arriving_mid_batch_get_their_solo_greedy_output(engine, monkeypatch):
    steps = []  # rows of every decode step
    decoding = threading.Event()
    real = engine._forward

    def watching(ids, *a, **k):
        if ids.shape[1] == 1:
            steps.append(ids.shape[0])
            if len(steps) >= 3:
                decoding.set()
        return real(ids, *a, **k)

    monkeypatch.setattr(engine, "_forward", watching)
    results = {}

    def go(i, max_tokens):
        results[i] = engine.complete(msgs(i), Sampling(max_tokens=max_tokens), timeout=60)

    first = threading.Thread(target=go, args=(7, 40))
    first.start()
    assert decoding.wait(30)  # the first request is decoding on its own ...
    budgets = {7: 40, 1: 6, 22: 12, 333: 20}
    late = [threading.Thread(target=go, args=(i, budgets[i])) for i in (1, 22, 333)]  # ... when three more arrive
    [t.start() for t in late]
    [t.join() for t in [first, *late]]
    assert steps[0] == 1 and max(steps) > 1  # they joined the running batch
    assert len(results[7].token_ids) == 40 and steps[-1] == 1  # it outlived them and ended alone
    monkeypatch.undo()
    for i, max_tokens in budgets.items():
        solo = alone(engine, i, max_tokens)
        assert results[i].token_ids == solo.token_ids, i
        assert results[i].prompt_token_ids == solo.prompt_token_ids
        assert results[i].logprobs == pytest.approx(solo.logprobs, abs=1e-4)


def test_a_slot_freed_early_is_refilled_while_the_batch_runs(tiny_model_dir):
    e = EmbeddedEngine(tiny_model_dir, max_batch=2, batch_wait_s=0.2)
    try:
        finished = []

        def go(name, max_tokens):
            e.complete(msgs(len(name)), Sampling(max_tokens=max_tokens), timeout=60)
            finished.append(name)

        threads = [threading.Thread(target=go, args=args) for args in (("long", 60), ("s", 2), ("third", 4))]
        for t in threads:
            t.start()
            time.sleep(0.02)  # in this order, within the batching window
        [t.join() for t in threads]
        # a static batch of two would run "third" only after "long" ended; here it takes the slot "s" freed
        assert finished == ["s", "third", "long"]
    finally:
        e.close()


def test_greedy_and_sampled_requests_share_a_batch_and_seeds_reproduce(engine):
    seeded = Sampling(temperature=1.0, max_tokens=16, seed=42)
    solo = engine.complete(msgs(5), seeded, timeout=60)
    results = {}

    def go(key, i, sampling):
        results[key] = engine.complete(msgs(i), sampling, timeout=60)

    jobs = [("seeded", 5, seeded), ("greedy", 3, Sampling(max_tokens=10)), ("other", 8, Sampling(temperature=0.7))]
    threads = [threading.Thread(target=go, args=job) for job in jobs]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert results["seeded"].token_ids == solo.token_ids  # its own generator: batch-mates do not change its draws
    assert results["greedy"].token_ids == alone(engine, 3, 10).token_ids
    assert all(lp <= 0 for r in results.values() for lp in r.logprobs)


def test_stop_string_ends_the_row_and_is_cut_from_the_text(engine):
    free = alone(engine, 4, 24)
    text = free.text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assert len(stop) == 3 and stop.strip()
    c = engine.complete(msgs(4), Sampling(max_tokens=24, stop=(stop,)), timeout=60)
    assert c.text == text[: text.index(stop)] and c.finish_reason == "stop"
    assert c.token_ids == free.token_ids[: len(c.token_ids)] and len(c.token_ids) < len(free.token_ids)
    assert stop in engine.tokenizer.decode(c.token_ids)  # the token that completed the stop string is kept


def test_a_closed_engine_refuses_calls(tiny_model_dir):
    from agentflow.errors import EngineError

    e = EmbeddedEngine(tiny_model_dir)
    assert e.complete(msgs(1), Sampling(max_tokens=3), timeout=30).token_ids
    e.close()
    with pytest.raises(EngineError, match="closed"):
        e.complete(msgs(1), Sampling(max_tokens=3), timeout=30)


# --- prefix cache --------------------------------------------------------------------------------------------------


def hf_greedy(engine, prompt, n):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = engine.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                                    pad_token_id=engine.pad_id)
    return out[0, len(prompt):].tolist()


def assert_exact(engine, prompt, completion):
    """Greedy tokens as transformers' own generate, logprobs as one forward pass over prompt + response."""
    assert completion.token_ids == hf_greedy(engine, prompt, len(completion.token_ids))
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + completion.token_ids])).logits[0, len(prompt) - 1: -1]
    recomputed = logits.log_softmax(-1).gather(-1, torch.tensor(completion.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(recomputed, torch.tensor(completion.logprobs), atol=1e-4)


def test_prompts_sharing_a_prefix_reuse_its_cache_exactly(tiny_model_dir):
    e = EmbeddedEngine(tiny_model_dir)
    try:
        first = e.encode_chat(msgs(1))
        e.generate([first], Sampling(max_tokens=4), max_new_tokens=[4])
        assert e._prefix.hits == 0 and e._prefix.tokens == len(first)
        # a longer prompt that starts with the whole first one, next to one that shares only the chat template
        longer = first + e.generate([first], Sampling(max_tokens=6), max_new_tokens=[6])[0].token_ids
        other = e.encode_chat([{"role": "system", "content": "Be brief."}, *msgs(2)])
        hits = e._prefix.hits
        out = e.generate([longer, other], Sampling(max_tokens=12), max_new_tokens=[12, 12])
        assert e._prefix.hits - hits >= len(first)  # the first prompt's columns were not computed again
        assert_exact(e, longer, out[0])
        assert_exact(e, other, out[1])
        # through the worker too, several rows with different cached lengths in one prefill
        results = {}
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, e.complete(
            msgs(i), Sampling(max_tokens=10), timeout=60))) for i in (1, 2, 3)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        for i in (1, 2, 3):
            assert_exact(e, e.encode_chat(msgs(i)), results[i])
    finally:
        e.close()


def test_the_prefix_cache_is_dropped_when_the_weights_change(tiny_model_dir):
    e = EmbeddedEngine(tiny_model_dir)
    try:
        prompt = e.encode_chat(msgs(9))
        before = e.generate([prompt], Sampling(max_tokens=10), max_new_tokens=[10])[0]
        assert e._prefix.tokens > 0
        with torch.no_grad():  # what the trainer's sync does: new weights copied into the serving model
            e.model.load_state_dict({k: v + 0.05 * torch.randn_like(v) for k, v in e.model.state_dict().items()})
        after = e.generate([prompt], Sampling(max_tokens=10), max_new_tokens=[10])[0]
        assert_exact(e, prompt, after)  # computed with the new weights, not from the stale cache
        assert after.logprobs != before.logprobs
    finally:
        e.close()


def test_the_prefix_cache_can_be_turned_off(tiny_model_dir):
    e = EmbeddedEngine(tiny_model_dir, prefix_cache_tokens=0)
    try:
        prompt = e.encode_chat(msgs(4))
        for _ in range(2):
            assert_exact(e, prompt, e.generate([prompt], Sampling(max_tokens=6), max_new_tokens=[6])[0])
        assert e._prefix.tokens == 0 and e._prefix.hits == 0
    finally:
        e.close()
