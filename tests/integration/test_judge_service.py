"""The judge service for real: a real small model judging records, the service between the memory service and a real
broker (the join, and no loop on the re-emitted record), `agentflow serve judge` with its engine unreachable (the
record is retried and dead-lettered, never rewarded by default), and `agentflow serve judge` behind a scripted
endpoint: a judge that says CORRECT to everything is refused by the calibration gate (nothing published, its gRPC
name NOT_SERVING), one right by construction is accepted (its verdicts published)."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from prometheus_client import CollectorRegistry

from agentflow.bus import Publisher, TopicReader, topics
from agentflow.bus.codec import new_envelope
from agentflow.bus.worker import Worker
from agentflow.domain.convert import from_dict, record_from_proto
from agentflow.llm.scripted import ScriptedEngine
from agentflow.proto.v1 import events_pb2, trajectory_pb2
from agentflow.rewards.calibration import load_items
from agentflow.services.judge import GRPC_SERVICE, JudgeMetrics, JudgeService, JudgeSettings
from tests.standins.judge import ChatStandin, always, labelled

READY_S = 30
CORRECT = "Analysis: the search result says Paris\nVerdict: CORRECT"


def record(tid: str, *, answer: str = "Paris", ground_truth: str = "Paris", result: str = "",
           query: str = "What is the capital of France?") -> dict:
    steps = [{"step": 0, "tool": "search", "command": "capital of France",
              "result": result or "Paris is the capital and largest city of France."}]
    return {"trajectory_id": tid, "query": query, "ground_truth": ground_truth, "source": "traffic",
            "status": "answered", "answer": answer, "started_at_unix": time.time(),
            "turns": [{"step": 0, "result": steps[0]["result"]}], "memory": {"query": query, "steps": steps}}


def envelope(data: dict) -> events_pb2.Envelope:
    return new_envelope(data["trajectory_id"], len(data["turns"]), from_dict(data, trajectory_pb2.Trajectory))


def metric(registry, name, **labels) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def wait_for(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


# --- (a) a real small model ------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)  # 100-150 s measured on a busy 2-core machine; over 600 s once it was overloaded
def test_a_real_small_model_gives_each_record_a_parsed_verdict_or_a_judge_error(smollm2_model_dir):
    """SmolLM2-135M is too weak to trust its verdicts; what must hold is the plumbing: every judged record gets a
    readable "judge" reward or a "judge_error" one, with the call's real token counts, never nothing."""
    from agentflow.llm.embedded import EmbeddedEngine

    engine = EmbeddedEngine(smollm2_model_dir)
    registry = CollectorRegistry()
    # generous deadline, one try: a loaded 2-core machine is slow, and a timeout must fail the test, not hide
    # calibration off: the 135M judge is refused by the gate (docs/judge.md, "Calibration"); this is about parsing
    svc = JudgeService(engine, JudgeSettings(traffic_share=1.0, max_calls_per_s=0, timeout_s=400, attempts=1,
                                             max_tokens=48, calibrate=False), metrics=JudgeMetrics(registry))
    records = [record("smol-reference", answer="Berlin"), record("smol-rubric", ground_truth="")]  # two calls
    try:
        outcomes = []
        for data in records:
            outputs = svc.handle(envelope(data))
            assert len(outputs) == 1 and outputs[0][0] == topics.FEEDBACK, outputs
            reward = outputs[0][1].feedback.reward
            outcomes.append(reward.source)
            assert reward.author == "llm-judge" and reward.detail
            if reward.source == "judge":
                assert reward.value in (0.0, 1.0)
                assert reward.detail.startswith("CORRECT" if reward.value else "INCORRECT")
            else:
                assert reward.source == "judge_error" and reward.value == 0.0 and "parse_error" in reward.detail
    finally:
        engine.close()
    print("SmolLM2 judge outcomes:", outcomes, [r["trajectory_id"] for r in records])
    calls = {o: metric(registry, "agentflow_judge_calls_total", outcome=o)
             for o in ("correct", "incorrect", "parse_error", "engine_error")}
    assert calls["engine_error"] == 0 and sum(calls.values()) == len(records), calls
    assert calls["parse_error"] == outcomes.count("judge_error")
    assert metric(registry, "agentflow_judge_prompt_tokens_total", counted="exact") > len(records) * 150  # real prompts
    assert metric(registry, "agentflow_judge_completion_tokens_total", counted="exact") > 0


# --- (b) over the broker, with the memory service --------------------------------------------------------------------


def test_over_the_broker_a_finished_record_gets_one_judge_feedback_and_its_reemission_no_other(bus_config):
    from agentflow.services.memory import MemoryService

    engine = ScriptedEngine([CORRECT])
    registry = CollectorRegistry()
    # calibration off: an always-CORRECT script is refused by the gate, tested in (d)
    judge = JudgeService(engine, JudgeSettings(traffic_share=1.0, max_calls_per_s=0, calibrate=False),
                         metrics=JudgeMetrics(registry))
    memory = MemoryService()
    finished = record("broker-1", ground_truth="")
    state = events_pb2.MemoryState(record=from_dict(finished, trajectory_pb2.Trajectory), phase="done")
    memory.restore([new_envelope("broker-1", 1, state, stage="state-done")])  # the trajectory it just finished

    with Worker("memory", bus_config, memory.input_topics, memory.handle) as memory_worker, \
            Worker("judge", bus_config, judge.input_topics, judge.handle, concurrency=4) as judge_worker, \
            Publisher(bus_config) as publisher, TopicReader(bus_config, topics.FEEDBACK) as feedback:
        assert memory_worker.wait_ready(READY_S) and judge_worker.wait_ready(READY_S)
        publisher.publish(topics.TRAJECTORIES, envelope(finished))
        publisher.flush()

        got = feedback.read(1, timeout_s=30)[0].envelope()
        assert got.trajectory_id == "broker-1" and got.event_id == "broker-1:1:judge-llm-judge"
        reward = got.feedback.reward
        assert (reward.value, reward.source, reward.author) == (1.0, "judge", "llm-judge")
        assert "search result says Paris" in reward.detail
        # the memory service joins the reward and re-emits the record; the judge reads it and stays quiet
        with TopicReader(bus_config, topics.TRAJECTORIES) as trajectories:
            emitted = [r.envelope() for r in trajectories.read(2, timeout_s=30)]
        joined = record_from_proto(emitted[-1].trajectory)
        assert [(r["source"], r["value"], r["author"]) for r in joined["rewards"]] == [("judge", 1.0, "llm-judge")]
        assert wait_for(lambda: metric(registry, "agentflow_judge_records_total", outcome="skip_judged") == 1)
        assert len(feedback.read(1, settle_s=2.0)) == 1 and len(engine.calls) == 1
    assert judge_worker.metrics()["deadlettered"] == 0


# --- (c) the engine is down: `agentflow serve judge` publishes no reward ---------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_judge_with_its_engine_unreachable_dead_letters_the_record_and_rewards_nothing(bus_config, tmp_path):
    from agentflow.services.cluster import Cluster

    env = {"AGENTFLOW_KAFKA_TOPIC_PREFIX": bus_config.topic_prefix, "AGENTFLOW_KAFKA_PARTITIONS": "4",
           "AGENTFLOW_KAFKA_MAX_ATTEMPTS": "2", "AGENTFLOW_KAFKA_RETRY_BACKOFF_MS": "50",
           "AGENTFLOW_RETRIES": "0",  # the OpenAI client's own retries
           "AGENTFLOW_JUDGE_TRAFFIC_SHARE": "1", "AGENTFLOW_JUDGE_ATTEMPTS": "2", "AGENTFLOW_JUDGE_BACKOFF_S": "0.05"}
    cluster = Cluster(log_dir=tmp_path, env=env)
    try:
        child = cluster.spawn("judge", ["serve", "judge", "--port", "0", "--metrics-port", "0", "--bootstrap",
                                        bus_config.bootstrap_servers, "--endpoint",
                                        f"http://127.0.0.1:{_closed_port()}/v1"], timeout_s=120)
        assert child.info["service"] == "judge"
        cluster.wait_serving(child, 60)  # health follows the worker: it has joined its group
        with Publisher(bus_config) as publisher, TopicReader(bus_config, topics.DEADLETTER) as letters, \
                TopicReader(bus_config, topics.FEEDBACK) as feedback:
            publisher.publish(topics.TRAJECTORIES, envelope(record("outage-1")))
            publisher.flush()
            letter = letters.read(1, timeout_s=60)[0].envelope().dead_letter
            assert letter.origin_topic == bus_config.topic(topics.TRAJECTORIES) and letter.key == b"outage-1"
            assert letter.attempts == 2 and "EngineError" in letter.error, letter.error
            assert feedback.read(0, settle_s=2.0) == []  # no "judge" reward, no default, nothing
        scrape = httpx.get(f"http://127.0.0.1:{child.info['metrics_port']}/metrics", timeout=10).text
        # the gate's first check fails before consuming (2 tries of its first item), then again in each of the
        # record's 2 tries: the record never reaches a judging call, and nothing is decided
        assert 'agentflow_judge_calibration_calls_total{outcome="engine_error"} 6.0' in scrape, child.log_tail()
        assert 'agentflow_judge_calibration_checks_total{result="engine_error"} 3.0' in scrape
        assert 'outcome="correct"' not in scrape and "agentflow_judge_calibrated 0.0" in scrape
    finally:
        cluster.stop()


# --- (d) the calibration gate: `agentflow serve judge` behind a scripted endpoint -----------------------------------


def _serve_judge(cluster, bus_config, endpoint: str):
    child = cluster.spawn("judge", ["serve", "judge", "--port", "0", "--metrics-port", "0", "--bootstrap",
                                    bus_config.bootstrap_servers, "--endpoint", endpoint], timeout_s=120)
    cluster.wait_serving(child, 60)  # "": the process and its worker, whatever the gate decided
    return child


@pytest.mark.parametrize("judge", ["always-correct", "right-by-construction"])
def test_serve_judge_publishes_only_the_verdicts_of_a_judge_that_passed_calibration(bus_config, tmp_path, judge):
    from agentflow.rpc.client import health_status
    from agentflow.services.cluster import Cluster

    accepted = judge == "right-by-construction"
    env = {"AGENTFLOW_KAFKA_TOPIC_PREFIX": bus_config.topic_prefix, "AGENTFLOW_KAFKA_PARTITIONS": "4",
           "AGENTFLOW_JUDGE_TRAFFIC_SHARE": "1", "AGENTFLOW_JUDGE_MAX_CALLS_PER_S": "0", "AGENTFLOW_RETRIES": "0"}
    cluster = Cluster(log_dir=tmp_path, env=env)
    with ChatStandin(labelled(load_items()) if accepted else always(True)) as endpoint:
        try:
            child = _serve_judge(cluster, bus_config, endpoint.url)
            target = f"127.0.0.1:{child.info['grpc_port']}"
            calibration_calls = endpoint.calls
            assert calibration_calls == sum(1 for i in load_items() if i.attack != "answer")  # checked first
            named = health_status(target, GRPC_SERVICE)
            assert named == (1 if accepted else 2), (named, child.log_tail())  # SERVING / NOT_SERVING
            metrics = f"http://127.0.0.1:{child.info['metrics_port']}/metrics"
            with Publisher(bus_config) as publisher, TopicReader(bus_config, topics.FEEDBACK) as feedback:
                publisher.publish(topics.TRAJECTORIES, envelope(record("gate-1", ground_truth="")))
                publisher.flush()
                outcome = "judged" if accepted else "skip_uncalibrated"
                assert wait_for(lambda: f'agentflow_judge_records_total{{outcome="{outcome}"}} 1.0' in
                                httpx.get(metrics, timeout=10).text), child.log_tail()
                got = [r.envelope() for r in feedback.read(1 if accepted else 0, timeout_s=30, settle_s=2.0)]
            scrape = httpx.get(metrics, timeout=10).text
            if accepted:
                assert [(g.trajectory_id, g.feedback.reward.source, g.feedback.reward.value) for g in got] == [
                    ("gate-1", "judge", 1.0)]
                assert endpoint.calls == calibration_calls + 1
                assert "agentflow_judge_calibrated 1.0" in scrape
                assert "agentflow_judge_calibration_accuracy 1.0" in scrape
            else:
                assert got == [] and endpoint.calls == calibration_calls  # refused: no call, no reward
                assert "agentflow_judge_calibrated 0.0" in scrape
                assert "agentflow_judge_calibration_accept_rate_on_wrong 1.0" in scrape
                log = child.log_tail(10_000)
                assert log.count("judge refused as a reward source") == 1, log
        finally:
            cluster.stop()
