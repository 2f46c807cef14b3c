"""`agentflow train` against a real broker: it groups training trajectories, steps, checkpoints, announces each
version on planner.versions, commits after the checkpoint, and after `kill -9` resumes with no version gap or
repeat and no group trained twice. `serve-llm --follow-versions` then serves the newest version."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from agentflow.bus import topics
from agentflow.bus.broker import free_port
from agentflow.bus.clients import Publisher, TopicReader
from agentflow.bus.codec import new_envelope
from agentflow.children import spawn_tied
from agentflow.domain.convert import from_dict
from agentflow.envs.synthetic import TOOLS, EnvConfig, SyntheticEnv
from agentflow.llm.embedded import EmbeddedEngine
from agentflow.llm.models import build_tiny
from agentflow.proto.v1 import trajectory_pb2
from agentflow.trainer.checkpoint import ModelStore
from agentflow.trainer.service import GroupCollector
from bench._harness import InProcessRollouts

G = 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=3)


@pytest.fixture(scope="module")
def rollouts(tiny, tmp_path_factory):
    env = SyntheticEnv(EnvConfig(seed=3))
    engine = EmbeddedEngine(tiny, version="v0", batch_wait_s=0.0)
    driver = InProcessRollouts(engine, TOOLS, tools_config=env.tools_config(tmp_path_factory.mktemp("env")),
                               knowledge=env.knowledge())
    yield driver, env
    engine.close()


def training_groups(rollouts, n: int) -> list[list[dict]]:
    """``n`` groups of G real planner trajectories, with rewards alternating 1/0 so every group has signal."""
    driver, env = rollouts
    groups = []
    for task in env.train[:n]:
        records = driver.collect([task], G)
        group = f"{task.id}/{uuid.uuid4().hex[:8]}"
        for i, record in enumerate(records):
            record.update(group_id=group, source="training",
                          rewards=[{"source": "rule", "value": float(i % 2), "detail": "test"}])
        groups.append(records)
    return groups


def publish(bus_config, groups) -> None:
    with Publisher(bus_config) as publisher:
        for group in groups:
            for record in group:
                message = from_dict(record, trajectory_pb2.Trajectory)
                publisher.publish(topics.TRAJECTORIES, new_envelope(record["trajectory_id"], 99, message))
        publisher.flush(10)


def start_trainer(bus_config, tiny, store, metrics, launcher=(sys.executable,), extra=()):
    env = {**os.environ, "AGENTFLOW_KAFKA_TOPIC_PREFIX": bus_config.topic_prefix, "OMP_NUM_THREADS": "1"}
    return spawn_tied(
        [*launcher, "-m", "agentflow.cli", "train", "--bootstrap", bus_config.bootstrap_servers,
         "--model-store", str(store), "--base-model", str(tiny), "--grpo-group-size", str(G),
         "--grpo-batch-trajectories", str(2 * G), "--grpo-lr", "1e-3", "--grpo-max-staleness", "100",
         "--metrics-file", str(metrics), *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def scrape(url: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(httpx.get(url, timeout=10).text) for s in f.samples}


def wait_for(predicate, timeout_s: float, what: str, process=None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the trainer exited ({process.returncode}) while waiting for {what}:\n"
                                 f"{process.stdout.read()[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def read_topic(bus_config, topic: str, field: str) -> list:
    with TopicReader(bus_config, topic) as reader:
        end = time.monotonic() + 2
        while time.monotonic() < end:
            reader.poll(0.2)
        return [getattr(r.envelope(), field) for r in reader.records]


def announced(bus_config) -> list[str]:
    return [event.version for event in read_topic(bus_config, topics.PLANNER_VERSIONS, "planner_version")]


def test_trainer_steps_announces_and_resumes_after_kill(bus_config, tiny, rollouts, tmp_path):
    store, metrics = tmp_path / "store", tmp_path / "metrics.jsonl"
    groups = training_groups(rollouts, 8)
    rated = {**groups[0][0], "trajectory_id": uuid.uuid4().hex, "group_id": "", "source": "traffic", "train_ok": True,
             "answer": "42", "rewards": [{"source": "human", "value": 1.0, "author": "alice", "detail": "test"}]}
    topics.ensure_topics(bus_config)
    publish(bus_config, [[rated], *groups[:4]])  # a rated production answer goes into the feedback ledger
    trainer = start_trainer(bus_config, tiny, store, metrics)
    try:
        wait_for(lambda: ModelStore(store).versions() == [0, 1, 2], 120, "versions 1 and 2", trainer)
        trainer.send_signal(signal.SIGKILL)  # hard: no drain, no commit beyond what was checkpointed
        trainer.wait(10)
        publish(bus_config, groups[4:])
        port, started = free_port(), time.time()
        trainer = start_trainer(bus_config, tiny, store, metrics, extra=("--metrics-port", str(port)))
        wait_for(lambda: ModelStore(store).versions()[-1] >= 4, 120, "versions 3 and 4", trainer)
        time.sleep(3)  # nothing more to train: no fifth version may appear
        scraped = scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        trainer.send_signal(signal.SIGTERM)
        output = trainer.communicate(timeout=30)[0]
    assert trainer.returncode == 0, output[-3000:]
    assert ModelStore(store).versions() == [0, 1, 2, 3, 4]
    assert sorted(p.parent.name for p in store.glob("v*/resume")) == ["v000003", "v000004"]  # --keep-resume 2
    latest = ModelStore(store).latest().metadata
    trained = latest["trained_groups"]
    assert sorted(trained) == sorted({g[0]["group_id"] for g in groups}) and len(trained) == len(set(trained))
    assert announced(bus_config) == ["v000000", "v000001", "v000002", "v000003", "v000004"]
    # the groups finished, as the drivers read them: from 0, and again from v2's count after the restart, to all 8
    progress = [event.groups_done for event in read_topic(bus_config, topics.TRAINER_PROGRESS, "trainer_progress")]
    assert progress[0] == 0 and progress[-1] == 8 and progress == sorted(progress) and 4 in progress, progress
    steps = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [s["version"] for s in steps] == [1, 2, 3, 4] and all(s["batch_groups_kept"] == 2 for s in steps)
    assert ": v4 reward" in output  # the progress line of the step that wrote v4
    # the ledger is saved with each version, and the restarted trainer started from v2's
    assert "feedback ledger: 1 rated queries from v000002" in output, output[-3000:]
    assert (Path(ModelStore(store).latest().path) / "feedback-ledger.json").is_file()
    # the restarted trainer's Prometheus endpoint: its two steps, the last one's numbers
    assert scraped[("agentflow_trainer_steps_total", (("outcome", "trained"),))] == 2
    assert scraped[("agentflow_trainer_version", ())] == 4
    assert scraped[("agentflow_trainer_last_step_timestamp_seconds", ())] >= started
    for key, name in (("reward", "agentflow_trainer_reward_mean"), ("kl", "agentflow_trainer_kl"),
                      ("grad_norm", "agentflow_trainer_grad_norm"),
                      ("tokens_per_s", "agentflow_trainer_tokens_per_second"),
                      ("peak_host_rss_gb", "agentflow_trainer_peak_host_rss_gigabytes")):
        assert scraped[(name, ())] == pytest.approx(steps[-1][key]), name
    assert scraped[("agentflow_trainer_consumer_lag", ())] == 0


def test_lora_trainer_warms_up_full_weights_then_trains_adapters_on_them(bus_config, tiny, rollouts, tmp_path):
    """With LoRA and a format warm-up: the warm-up is a full version, every later one an adapter whose base is the
    warmed version; a restarted trainer goes on training the adapters (their resume state), not the base again."""
    import torch

    from agentflow.llm.models import ADAPTER_CONFIG, adapter_base, load_checkpoint

    store, metrics = tmp_path / "store", tmp_path / "metrics.jsonl"
    topics.ensure_topics(bus_config)
    publish(bus_config, training_groups(rollouts, 2))  # the warm-up's prompts
    lora = ("--lora-rank", "4", "--format-warmup-steps", "3")
    trainer = start_trainer(bus_config, tiny, store, metrics, extra=lora)
    try:
        wait_for(lambda: ModelStore(store).versions() == [0, 1], 120, "the format warm-up", trainer)
        # RL trains on turns sampled from the warmed version on (the reference): roll out on it
        engine = EmbeddedEngine(ModelStore(store).get(1).path, version="v000001", batch_wait_s=0.0)
        try:
            env = rollouts[1]
            driver = InProcessRollouts(engine, TOOLS, tools_config=env.tools_config(tmp_path / "env"),
                                       knowledge=env.knowledge())
            groups = training_groups((driver, env), 4)
        finally:
            engine.close()
        publish(bus_config, groups[:2])
        wait_for(lambda: ModelStore(store).versions() == [0, 1, 2], 120, "a LoRA step", trainer)
        trainer.send_signal(signal.SIGTERM)
        trainer.wait(30)
        publish(bus_config, groups[2:])
        trainer = start_trainer(bus_config, tiny, store, metrics, extra=lora)
        wait_for(lambda: ModelStore(store).versions()[-1] >= 3, 120, "a LoRA step after the restart", trainer)
    finally:
        trainer.send_signal(signal.SIGTERM)
        output = trainer.communicate(timeout=30)[0]
    assert trainer.returncode == 0, output[-3000:]
    models = ModelStore(store)
    assert models.versions() == [0, 1, 2, 3], output[-3000:]
    warmed = models.get(1)
    assert warmed.metadata["stage"] == "format_warmup" and warmed.metadata["export"] == "full"
    for version in (2, 3):
        adapter = models.get(version)
        assert adapter.metadata["export"] == "adapter" and (adapter.path / ADAPTER_CONFIG).is_file()
        assert adapter_base(adapter.path).resolve() == warmed.path.resolve()
    steps = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [s.get("stage", "rl") for s in steps] == ["format_warmup", "rl", "rl"], steps
    base, tuned = load_checkpoint(warmed.path), load_checkpoint(models.get(3).path)  # the adapters trained
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        assert not torch.allclose(base(ids).logits, tuned(ids).logits)


def test_torchrun_ranks_train_together_and_restart_after_a_rank_is_killed(bus_config, tiny, rollouts, tmp_path):
    """`agentflow train` under torchrun with 2 ranks (FSDP2 over gloo): rank 0 consumes and hands each step's
    records to rank 1; kill -9 of rank 1 makes torchrun restart both, and they resume from the newest version."""
    store, metrics = tmp_path / "store", tmp_path / "metrics.jsonl"
    groups = training_groups(rollouts, 8)
    topics.ensure_topics(bus_config)
    publish(bus_config, groups[:4])
    torchrun = (os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone", "--nproc-per-node", "2",
                "--max-restarts", "1")
    trainer = start_trainer(bus_config, tiny, store, metrics, torchrun)
    try:
        wait_for(lambda: ModelStore(store).versions() == [0, 1, 2], 300, "versions 1 and 2", trainer)
        ranks = subprocess.run(["pgrep", "-P", str(trainer.pid)], capture_output=True, text=True).stdout.split()
        assert len(ranks) == 2, ranks
        os.kill(int(max(ranks, key=int)), signal.SIGKILL)  # one rank, hard
        publish(bus_config, groups[4:])
        wait_for(lambda: ModelStore(store).versions()[-1] >= 4, 300, "versions 3 and 4 after the restart", trainer)
        time.sleep(3)
    finally:
        os.killpg(trainer.pid, signal.SIGTERM)
        output = trainer.communicate(timeout=60)[0]
    assert ModelStore(store).versions() == [0, 1, 2, 3, 4], output[-3000:]
    latest = ModelStore(store).latest().metadata
    trained = latest["trained_groups"]
    assert sorted(trained) == sorted({g[0]["group_id"] for g in groups}) and len(trained) == len(set(trained))
    assert announced(bus_config) == ["v000000", "v000001", "v000002", "v000003", "v000004"]
    # the groups finished, as the drivers read them: from 0, and again from v2's count after the restart, to all 8
    progress = [event.groups_done for event in read_topic(bus_config, topics.TRAINER_PROGRESS, "trainer_progress")]
    assert progress[0] == 0 and progress[-1] == 8 and progress == sorted(progress) and 4 in progress, progress
    steps = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [s["version"] for s in steps] == [1, 2, 3, 4] and {s["ranks"] for s in steps} == {2}
    assert all(s["batch_groups_kept"] == 2 for s in steps)


def test_follow_versions_serves_the_newest(bus_config, tiny, tmp_path):
    """serve-llm --follow-versions loads each announced version and routes every new call to it."""
    from agentflow.proto.v1 import events_pb2

    store = ModelStore(tmp_path / "store")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny), AutoTokenizer.from_pretrained(tiny)
    for _ in range(2):
        store.save(model, tokenizer, parent=None)
    topics.ensure_topics(bus_config)
    env = {**os.environ, "AGENTFLOW_KAFKA_TOPIC_PREFIX": bus_config.topic_prefix, "OMP_NUM_THREADS": "1",
           "AGENTFLOW_LLM_ADMIN_TOKEN": "t0ken"}
    server = spawn_tied([sys.executable, "-m", "agentflow.cli", "serve-llm", "--model", str(tiny),
                         "--version", "v000000", "--follow-versions", "--bootstrap",
                         bus_config.bootstrap_servers, "--model-store", str(tmp_path / "store")], env=env,
                        stdout=subprocess.PIPE, text=True)
    try:
        url = json.loads(server.stdout.readline())["url"]
        admin = url[: -len("/v1")] + "/admin/versions"
        token = {"Authorization": "Bearer t0ken"}
        with Publisher(bus_config) as publisher:
            for v in (1, "broken", 1):  # a bad checkpoint is skipped; a repeated announcement changes nothing
                uri = str(store.get(1).path) if v == 1 else str(tmp_path / "missing")
                event = events_pb2.PlannerVersion(version="v000001" if v == 1 else "v000002", checkpoint_uri=uri)
                publisher.publish(topics.PLANNER_VERSIONS, new_envelope("planner", 1, event))
                publisher.flush(10)
                if v == 1:
                    wait_for(lambda: {d["name"]: d["weight"] for d in httpx.get(admin, headers=token)
                                      .json()["versions"]}.get("v000001") == 100, 60, "v000001 to take all traffic")
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
        response = httpx.post(url + "/chat/completions", json=body, headers={"x-trajectory-id": "t1"}, timeout=30)
        assert response.status_code == 200 and response.headers["x-model-version"] == "v000001"
        assert {d["name"] for d in httpx.get(admin, headers=token).json()["versions"]} == {"v000000", "v000001"}
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


def test_group_collector_completes_times_out_and_resumes():
    c = GroupCollector(group_size=3, timeout_s=10.0)

    def rec(gid, n, source="training"):
        return {"trajectory_id": f"{gid}-{n}", "group_id": gid, "source": source}

    c.add(rec("a", 0), 0, 5, now=0.0)
    c.add(rec("b", 0), 1, 7, now=0.0)
    c.add(rec("a", 1), 0, 6, now=1.0)
    c.add(rec("a", 1), 0, 8, now=1.0)  # the same trajectory again (feedback joined): replaces, does not count twice
    c.add(rec("x", 0, source="traffic"), 0, 9, now=1.0)
    assert c.ready_count(now=2.0) == 0 and c.counts["ignored"] == 1
    c.add(rec("a", 2), 1, 8, now=2.0)
    assert c.ready_count(now=2.0) == 1
    assert c.resume_offsets() == {0: 5, 1: 7}  # the oldest record of a group not handed out yet
    assert [r["trajectory_id"] for r in c.take(1)[0]] == ["a-0", "a-1", "a-2"]
    assert c.resume_offsets() == {0: 10, 1: 7}
    c.add(rec("a", 3), 0, 10, now=3.0)  # a late member of a trained group is not trained again
    assert c.counts["already_trained"] == 1
    c.add(rec("b", 1), 1, 11, now=3.0)
    assert c.ready_count(now=10.5) == 1 and c.counts["groups_timed_out"] == 1  # b: 2 of 3 after the timeout
    c.take(1)
    c.add(rec("c", 0), 0, 12, now=11.0)
    assert c.ready_count(now=30.0) == 0 and c.counts["groups_dropped"] == 1  # one record is no group
    state = c.checkpoint_state()
    assert state["consumer_offsets"] == {"0": 13, "1": 12} and state["trained_groups"] == ["a", "b", "c"]
    assert state["groups_done"] == c.groups_done == 3  # taken or dropped: what trainer.progress publishes
