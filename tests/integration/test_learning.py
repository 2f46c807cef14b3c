"""The trainer on the tiny model: a few Flow-GRPO steps change the planner, make rewarded actions more likely, and
write loadable, versioned checkpoints; the store, the scorer and the memo tool on their own."""

import json
from dataclasses import replace

import pytest
import torch

from agentflow.envs.synthetic import TOOLS, EnvConfig, SyntheticEnv
from agentflow.errors import InvalidInput
from agentflow.rewards import score_records
from agentflow.tools.base import ToolResult
from agentflow.trainer.batch import build_batch, sequence_logprobs
from agentflow.trainer.checkpoint import METADATA, ModelStore, load
from agentflow.trainer.grpo import GRPOConfig
from agentflow.trainer.logprobs import unique_row_logprobs
from agentflow.trainer.loop import RESUME, TrainConfig, Trainer
from agentflow.trainer.warmup import format_warmup, planner_prompts, tool_responses
from bench._harness import InProcessRollouts, MemoTool, task_batches, train

# --- small parts ---------------------------------------------------------------------------------------------------


def test_score_records_adds_one_rule_reward():
    records = [{"answer": "The value is 1,266,871.", "ground_truth": "1266871", "turns": [{}]},
               {"answer": "12", "ground_truth": "13", "turns": [{}]},
               {"answer": "5", "ground_truth": "", "turns": []}]
    score_records(records)
    assert [r["rewards"][0]["value"] for r in records[:2]] == [1.0, 0.0]
    assert records[0]["rewards"][0]["source"] == "rule" and records[2].get("rewards") is None
    score_records(records)  # idempotent: a scored record is not scored twice
    assert len(records[0]["rewards"]) == 1
    shaped = score_records([{"answer": "7", "ground_truth": "7", "turns": [{}, {}, {}]}], turn_cost=0.1)
    assert shaped[0]["rewards"][0]["value"] == pytest.approx(0.8)
    with pytest.raises(InvalidInput, match="turn_cost"):
        score_records([], turn_cost=1.0)


def test_memo_tool_caches_program_outcomes_only():
    class Counting:
        spec = object()

        def __init__(self):
            self.calls = 0

        def run(self, command, timeout):
            self.calls += 1
            return ToolResult(error="timeout: slow") if command == "slow" else ToolResult(output=command.upper())

    inner = Counting()
    memo = MemoTool(inner)
    assert memo.run("a", 1).output == "A" and memo.run("a", 1).output == "A" and inner.calls == 1
    memo.run("slow", 1), memo.run("slow", 1)
    assert inner.calls == 3 and (memo.hits, memo.misses) == (1, 3)


def test_task_batches_cycle_through_every_task():
    tasks = list(range(10))
    batches = task_batches(tasks, 4, seed=1)
    seen = [t for _ in range(5) for t in next(batches)]
    assert sorted(seen[:10]) == tasks and len(seen) == 20


def test_train_needs_a_bound():
    with pytest.raises(InvalidInput, match="budget_s or max_steps"):
        train(None, lambda: [])


# --- the model store -----------------------------------------------------------------------------------------------


def test_store_versions(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    store = ModelStore(tmp_path / "store")
    assert store.latest() is None
    v0 = store.save(model, tok, parent=None, extra={"profile": "tiny-deterministic"})
    v1 = store.save(model, tok, parent=0, metrics={"reward": 0.5})
    assert (v0.version, v1.version, store.versions()) == (0, 1, [0, 1])
    assert (v1.path / "model.safetensors").is_file() and (v1.path / "tokenizer.json").is_file()
    meta = json.loads((v1.path / METADATA).read_text())
    assert meta["version"] == 1 and meta["parent"] == 0 and meta["metrics"] == {"reward": 0.5}
    assert store.get(0).metadata["profile"] == "tiny-deterministic"
    with pytest.raises(InvalidInput, match="next version is 2"):
        store.save(model, tok, parent=1, version=5)
    (tmp_path / "store" / ".v000002-crashed").mkdir()  # a half-written folder is not a version
    assert store.versions() == [0, 1]
    for _ in range(3):
        store.save(model, tok, parent=store.latest().version)
    assert store.prune(keep_last=2) == [1, 2] and store.versions() == [0, 3, 4]
    with pytest.raises(InvalidInput, match="no version 9"):
        store.get(9)


# --- a few real steps ----------------------------------------------------------------------------------------------


def test_a_few_steps_learn_and_checkpoint(tiny_model_dir, tmp_path):
    from agentflow.llm.embedded import EmbeddedEngine

    torch.manual_seed(0)
    env = SyntheticEnv(EnvConfig(seed=0, towns=8, train_size=30, heldout_size=6))
    grpo = GRPOConfig(group_size=6, batch_trajectories=24, lr=1e-3, beta=0.01, updates_per_batch=2, max_staleness=0)
    store = ModelStore(tmp_path / "store")
    trainer = Trainer(tiny_model_dir, store, TrainConfig(grpo=grpo, micro_batch_rows=16),
                      metadata={"profile": "tiny-deterministic"})
    engine = EmbeddedEngine(tiny_model_dir, version="v0", batch_wait_s=0.0)
    try:
        rollouts = InProcessRollouts(engine, TOOLS, tools_config=env.tools_config(tmp_path), knowledge=env.knowledge())
        rollouts.sync(trainer.policy, trainer.version)
        before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
        batches = task_batches(env.train, grpo.queries_per_batch, seed=0)

        first = rollouts.collect(next(batches), grpo.group_size)
        assert all(r["turns"][0]["planner"]["model_version"] == "v0" for r in first)
        batch = build_batch(first, pad_id=trainer.pad_id)
        assert len(batch) > 0, "the first batch has no group with signal"
        metrics = trainer.step(first)
        for name in ("reward", "kl", "clip_frac_low", "clip_frac_high", "entropy", "grad_norm", "tokens_per_s",
                     "loss", "checkpoint"):
            assert name in metrics, name
        assert metrics["version"] == 1 and not metrics.get("skipped")

        # the action of this profile is the tool: rewarded tool choices became more likely, punished ones less
        before_p = chosen_tool_logprob(trainer.reference.lm, trainer.tokenizer, first)
        after_p = chosen_tool_logprob(trainer.policy, trainer.tokenizer, first)
        adv = {tid: a for tid, a in advantages_by_trajectory(first).items()}
        up = [after_p[k] - before_p[k] for k in after_p if adv[k[0]] > 0]
        down = [after_p[k] - before_p[k] for k in after_p if adv[k[0]] < 0]
        assert up and down
        assert sum(up) / len(up) > 0 > sum(down) / len(down)

        # two more steps through the loop, syncing the engine like the bench does
        rollouts.sync(trainer.policy, trainer.version)
        history = train(trainer, lambda: rollouts.collect(next(batches), grpo.group_size), max_steps=2,
                        after_step=lambda m: rollouts.sync(trainer.policy, trainer.version))
        assert engine.version == f"v{trainer.version}"
        changed = sum(not torch.equal(before[k], v) for k, v in trainer.policy.state_dict().items())
        assert changed > 0
    finally:
        engine.close()

    steps = 1 + sum(not m.get("skipped") for m in history)
    assert store.versions() == list(range(steps + 1))
    model, tokenizer, meta = load(store.latest())
    assert meta["version"] == steps and meta["parent"] == steps - 1 and meta["profile"] == "tiny-deterministic"
    assert "reward" in meta["metrics"] and tokenizer.pad_token_id == trainer.pad_id
    for k, v in model.state_dict().items():
        assert torch.equal(v, trainer.policy.state_dict()[k]), k
    # a restarted trainer resumes from the store: the next step is the next version
    assert (store.latest().path / RESUME / ".metadata").is_file()
    again = Trainer(tiny_model_dir, store, TrainConfig(grpo=grpo))
    assert again.version == steps
    state = again.optimizer.state_dict()["state"]  # AdamW's moments came back with the weights
    assert state and all(torch.equal(state[i]["exp_avg"], trainer.optimizer.state_dict()["state"][i]["exp_avg"])
                         for i in state)


def test_groups_without_spread_train_on_the_kl_alone_when_kept(tiny_model_dir, tmp_path):
    """A policy that moved away from the reference and then sees only groups rewarded alike: kept, they pull it
    back (the KL to the reference falls step by step); dropped, the step trains nothing."""
    from agentflow.llm.embedded import EmbeddedEngine

    torch.manual_seed(0)
    env = SyntheticEnv(EnvConfig(seed=0, towns=8, train_size=30, heldout_size=6))
    engine = EmbeddedEngine(tiny_model_dir, version="v0", batch_wait_s=0.0)
    try:
        rollouts = InProcessRollouts(engine, TOOLS, tools_config=env.tools_config(tmp_path), knowledge=env.knowledge())
        records = rollouts.collect(env.train[:2], 4)
    finally:
        engine.close()

    def rewarded(values):
        return [{**r, "rewards": [{"value": float(v), "source": "rule"}]} for r, v in zip(records, values)]

    grpo = GRPOConfig(group_size=4, batch_trajectories=8, lr=2e-3, beta=0.5, max_staleness=None)
    config = TrainConfig(grpo=grpo, behaviour_bound=None)
    trainers = {keep: Trainer(tiny_model_dir, ModelStore(tmp_path / f"store-{keep}"),
                              replace(config, grpo=replace(grpo, keep_flat_groups=keep))) for keep in (True, False)}
    for trainer in trainers.values():  # away from the reference, on groups with a spread
        assert trainer.step(rewarded([1, 0] * 4))["version"] == 1
    flat = rewarded([1] * 8)
    dropped = trainers[False].step(flat)
    assert dropped["skipped"] and dropped["batch_groups_no_signal"] == 2 and trainers[False].version == 1
    kept = trainers[True]
    kls = [kept.step(flat) for _ in range(4)]
    assert [m["batch_groups_kl_only"] for m in kls] == [2] * 4 and kept.version == 5
    assert kls[0]["kl"] > 0 and kls[-1]["kl"] < kls[0]["kl"] / 2, [m["kl"] for m in kls]


def advantages_by_trajectory(records) -> dict:
    from agentflow.domain.trajectory import Record
    from agentflow.trainer.grpo import group_advantages

    groups: dict = {}
    for r in records:
        groups.setdefault(r["group_id"], []).append(r)
    out = {}
    for members in groups.values():
        adv = group_advantages(torch.tensor([Record(r).reward() for r in members]))
        out.update({r["trajectory_id"]: float(a) for r, a in zip(members, adv)})
    return out


def tool_logprobs(model, tokenizer, prompt: list[int]) -> dict:
    """log π(tool | prompt) for every tool as the structured decoder samples it: at each fork of the tools' token
    trie, the model's distribution renormalised over the allowed tokens."""
    responses = dict(zip(TOOLS, tool_responses(tokenizer, TOOLS)))
    out = {}
    for tool in TOOLS:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + responses[tool]])).logits[0].float()
        alive, pos, logp = list(TOOLS), 0, 0.0
        while len(alive) > 1:
            allowed = sorted({responses[t][pos] for t in alive})
            token = responses[tool][pos]
            if len(allowed) > 1:
                logp += float(logits[len(prompt) + pos - 1, allowed].log_softmax(-1)[allowed.index(token)])
            alive = [t for t in alive if responses[t][pos] == token]
            pos += 1
        out[tool] = logp
    return out


def chosen_tool_logprob(model, tokenizer, records) -> dict:
    """{(trajectory_id, step): log π(chosen tool | prompt)} over every planner turn of ``records``."""
    responses = dict(zip(TOOLS, tool_responses(tokenizer, TOOLS)))
    out = {}
    for r in records:
        for turn in r["turns"]:
            chosen = turn["decision"]["tool"]
            assert turn["planner"]["token_ids"] == responses[chosen]
            out[(r["trajectory_id"], turn["step"])] = tool_logprobs(model, tokenizer,
                                                                    turn["planner"]["prompt_token_ids"])[chosen]
    return out


@pytest.mark.slow
def test_format_warmup_makes_the_choice_uniform(tiny_model_dir, tmp_path):
    import math

    from agentflow.llm.embedded import EmbeddedEngine

    env = SyntheticEnv(EnvConfig(seed=1, towns=8, train_size=30, heldout_size=6))
    grpo = GRPOConfig(group_size=4, batch_trajectories=16, lr=1e-3, beta=0.01, max_staleness=0)
    store = ModelStore(tmp_path / "store")
    trainer = Trainer(tiny_model_dir, store, TrainConfig(grpo=grpo))
    engine = EmbeddedEngine(tiny_model_dir, version="v0", batch_wait_s=0.0)
    try:
        rollouts = InProcessRollouts(engine, TOOLS, tools_config=env.tools_config(tmp_path), knowledge=env.knowledge())
        prompts = planner_prompts(rollouts.collect(env.train[:8], 2))
        heldout = planner_prompts(rollouts.collect(env.heldout, 1))
    finally:
        engine.close()
    metrics = format_warmup(trainer, prompts, tool_responses(trainer.tokenizer, TOOLS), steps=30)
    assert metrics["warmup_loss_last"] < metrics["warmup_loss_first"] / 5
    for prompt in heldout:  # prompts it never saw: every tool about equally likely
        probs = [math.exp(v) for v in tool_logprobs(trainer.policy, trainer.tokenizer, prompt).values()]
        assert max(probs) - min(probs) < 0.2, probs
    assert trainer.version == 1 and store.get(1).metadata["stage"] == "format_warmup"
    assert Trainer(tiny_model_dir, store, TrainConfig(grpo=grpo)).reference_version == 1  # the RL starting point


def test_unique_rows_give_the_same_logprobs_and_gradients(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from agentflow.trainer.batch import TrainBatch

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    rows = torch.randint(5, 200, (3, 12))
    ids = torch.cat([rows, rows[:1], rows[1:2]])  # rows 3, 4 repeat rows 0, 1
    attn = torch.ones_like(ids)
    resp = torch.zeros_like(ids, dtype=torch.bool)
    resp[:, 8:] = True
    batch = TrainBatch(ids, attn, resp, torch.zeros(5, 12), torch.zeros(5, dtype=torch.bool), torch.zeros(5),
                       torch.arange(5), [None] * 5, [str(i) for i in range(5)], torch.zeros(5))
    weights = torch.rand(5, 12)

    fast, _ = unique_row_logprobs(model, batch)
    (fast * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    slow = sequence_logprobs(model, ids, attn, resp)
    (slow * weights).sum().backward()
    assert torch.allclose(fast, slow, atol=1e-5)
    for n, p in model.named_parameters():
        if p.grad is not None:
            assert torch.allclose(grads[n], p.grad, atol=1e-5, rtol=1e-4), n
