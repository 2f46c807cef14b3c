"""The service ring for real: tansu, the LLM server and six service processes on 127.0.0.1 (what `agentflow up`
starts), driven through the gateway's gRPC API with the fast tiny model."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from agentflow.bus import topics
from agentflow.bus.clients import Publisher, TopicReader
from agentflow.bus.config import BusConfig
from agentflow.services.cluster import start_cluster
from agentflow.domain import trajectory
from agentflow.domain.convert import record_from_proto
from agentflow.proto.v1 import events_pb2, gateway_pb2, gateway_pb2_grpc
from agentflow.rpc.client import health_status
from agentflow.services.gateway.keys import new_key

pytestmark = pytest.mark.slow
TRAINER, TRAINER_ENTRY = new_key("trainer", ["solve", "train"])  # the rollout driver's key
# A generous budget: the tests check delivery, not speed, and must hold on a loaded 2-core machine. "test-key" is an
# older plain-text key: it keeps working, with the scopes solve and feedback.
RING_ENV = {"AGENTFLOW_LOOP_MAX_STEPS": "2", "AGENTFLOW_LOOP_MAX_TIME_S": "600", "AGENTFLOW_RPC_MAX_WORKERS": "64",
            "AGENTFLOW_GATEWAY_API_KEYS": f"test-key,{TRAINER_ENTRY}"}


@pytest.fixture(scope="module")
def cluster(tiny_model_dir, tmp_path_factory):
    c = start_cluster(log_dir=tmp_path_factory.mktemp("ring-logs"), model=str(tiny_model_dir), env=RING_ENV,
                      progress=lambda *_: None)
    yield c
    c.stop()


def solve_all(cluster, count: int, prefix: str, during=None) -> list[gateway_pb2.SolveResponse]:
    """``count`` concurrent Solve calls; ``during()`` runs once they are in flight."""
    with grpc.insecure_channel(cluster.endpoint("gateway")) as ch:
        stub = gateway_pb2_grpc.AgentFlowStub(ch)

        def ask(i):
            return stub.Solve(gateway_pb2.SolveRequest(query=f"{prefix} question {i}: what is {i} + {i}?"),
                              timeout=900, metadata=[("x-api-key", "test-key")])

        with ThreadPoolExecutor(count) as pool:
            futures = [pool.submit(ask, i) for i in range(count)]
            if during:
                time.sleep(1.0)
                during()
            return [f.result() for f in futures]


def trajectories_for(cluster, ids: set[str], settle_s: float = 2.0) -> list:
    """Every record on `trajectories` whose id is in ``ids`` (duplicates included)."""
    with TopicReader(BusConfig(bootstrap_servers=cluster.bootstrap), topics.TRAJECTORIES) as reader:
        deadline = time.monotonic() + 60
        while {r.key.decode() for r in reader.records} < ids and time.monotonic() < deadline:
            reader.poll(0.2)
        reader.read(0, settle_s=settle_s)
        return [r.envelope() for r in reader.records if r.key.decode() in ids]


def test_fifty_queries_each_answered_exactly_once(cluster):
    responses = solve_all(cluster, 50, "ring")
    ids = {r.trajectory_id for r in responses}
    assert len(ids) == 50 and all(r.status in ("answered", "max_steps", "timeout") for r in responses)
    records = trajectories_for(cluster, ids)
    assert sorted(e.trajectory_id for e in records) == sorted(ids)  # each exactly once
    for envelope in records:
        record = record_from_proto(envelope.trajectory)
        trajectory.validate(record)
        assert 1 <= len(record["turns"]) <= 2 and record["trace_id"]
        assert record["turns"][0]["planner"]["token_ids"]  # the planner's tokens made it into the record


def test_bad_requests_are_refused_before_anything_is_published(cluster):
    with grpc.insecure_channel(cluster.endpoint("gateway")) as ch:
        stub = gateway_pb2_grpc.AgentFlowStub(ch)
        key = [("x-api-key", "test-key")]
        cases = [(gateway_pb2.SolveRequest(query=""), key, grpc.StatusCode.INVALID_ARGUMENT),
                 (gateway_pb2.SolveRequest(query="x" * 70_000), key, grpc.StatusCode.INVALID_ARGUMENT),
                 (gateway_pb2.SolveRequest(query="hi", options=events_pb2.QueryOptions(max_steps=1000)), key,
                  grpc.StatusCode.INVALID_ARGUMENT),
                 (gateway_pb2.SolveRequest(query="hi", source="bogus"), [("x-api-key", TRAINER)],
                  grpc.StatusCode.INVALID_ARGUMENT),
                 (gateway_pb2.SolveRequest(query="hi", source="training"), [("x-api-key", TRAINER)],
                  grpc.StatusCode.INVALID_ARGUMENT),  # a rollout needs its group
                 (gateway_pb2.SolveRequest(query="hi", source="training", group_id="g"), key,
                  grpc.StatusCode.PERMISSION_DENIED),  # only a train key sends rollouts
                 (gateway_pb2.SolveRequest(query="hi", group_id="g" * 129), [("x-api-key", TRAINER)],
                  grpc.StatusCode.INVALID_ARGUMENT),
                 (gateway_pb2.SolveRequest(query="hi", options=events_pb2.QueryOptions(planner_version="v1\r\nX: y")),
                  key, grpc.StatusCode.INVALID_ARGUMENT),
                 (gateway_pb2.SolveRequest(query="hi", options=events_pb2.QueryOptions(planner_version="vé")), key,
                  grpc.StatusCode.INVALID_ARGUMENT),
                 (gateway_pb2.SolveRequest(query="hi", options=events_pb2.QueryOptions(background=True)), key,
                  grpc.StatusCode.INVALID_ARGUMENT),  # the gateway's to set, on training rollouts
                 (gateway_pb2.SolveRequest(query="hi", options=events_pb2.QueryOptions(tools=["python"] * 33)), key,
                  grpc.StatusCode.INVALID_ARGUMENT),
                 (gateway_pb2.SolveRequest(query="hi", options=events_pb2.QueryOptions(tools=["t" * 129])), key,
                  grpc.StatusCode.INVALID_ARGUMENT),
                 (gateway_pb2.SolveRequest(query="hi", ground_truth="x" * 600_000), [("x-api-key", TRAINER)],
                  grpc.StatusCode.RESOURCE_EXHAUSTED),  # over the gateway's request bound: not even parsed
                 (gateway_pb2.SolveRequest(query="hi"), [("x-api-key", "wrong")], grpc.StatusCode.UNAUTHENTICATED),
                 (gateway_pb2.SolveRequest(query="hi"), [], grpc.StatusCode.UNAUTHENTICATED)]
        for request, metadata, code in cases:
            with pytest.raises(grpc.RpcError) as info:
                stub.Solve(request, timeout=10, metadata=metadata)
            assert info.value.code() == code, info.value.details()
        raw = ch.unary_unary("/agentflow.v1.AgentFlow/Solve", request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\xff\xff\xff not protobuf", timeout=10, metadata=key)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "SolveRequest" in info.value.details()


def test_the_gateway_memory_stays_flat_under_oversized_fields(cluster):
    """A stream of requests whose names are oversized (refused by the field bounds) or whose body is over the
    gateway's request bound (refused by gRPC before parsing): each answered at once, and the gateway's resident
    memory grows by far less than the bytes sent (about 200 MB here)."""
    def rss_mb() -> float:
        status = open(f"/proc/{cluster.child('gateway').process.pid}/status").read()
        return int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1]) / 1024

    with grpc.insecure_channel(cluster.endpoint("gateway"), options=[("grpc.max_send_message_length", -1)]) as ch:
        stub = gateway_pb2_grpc.AgentFlowStub(ch)
        trainer = [("x-api-key", TRAINER)]
        big_name = gateway_pb2.SolveRequest(query="hi", group_id="g" * 400_000)
        big_body = gateway_pb2.SolveRequest(query="hi", ground_truth="x" * 2_000_000)
        before = rss_mb()
        codes = set()
        for i in range(300):
            request = big_body if i % 5 == 0 else big_name
            with pytest.raises(grpc.RpcError) as info:
                stub.Solve(request, timeout=30, metadata=trainer)
            codes.add(info.value.code())
        grown = rss_mb() - before
    assert codes == {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
    print(f"\ngateway RSS {before:.0f} MB before, +{grown:.1f} MB after 300 oversized requests (~200 MB sent)")
    assert grown < 50, f"the gateway's memory grew by {grown:.0f} MB"


def test_stream_shows_each_step_then_the_answer(cluster):
    with grpc.insecure_channel(cluster.endpoint("gateway")) as ch:
        events = list(gateway_pb2_grpc.AgentFlowStub(ch).SolveStream(
            gateway_pb2.SolveRequest(query="What is 2 + 2?"), timeout=600, metadata=[("x-api-key", "test-key")]))
    stages = [e.stage for e in events]
    assert stages[0] == "plan" and stages[-1] == "answer" and "verdict" in stages
    assert all(e.summary for e in events)


@pytest.mark.parametrize("victim", ["executor", "planner", "memory"])
def test_a_killed_service_loses_nothing(cluster, victim):
    def kill_and_restart():
        os.killpg(cluster.child(victim).process.pid, signal.SIGKILL)
        cluster.child(victim).process.wait()
        time.sleep(1.0)
        cluster.restart(victim)

    responses = solve_all(cluster, 50, f"fault-{victim}", during=kill_and_restart)
    ids = {r.trajectory_id for r in responses}
    assert len(ids) == 50
    records = trajectories_for(cluster, ids)
    assert sorted(e.trajectory_id for e in records) == sorted(ids)  # none lost, none answered twice


@pytest.mark.parametrize("topic", [topics.QUERIES, topics.MEMORY_UPDATED, topics.PLANS, topics.EXECUTIONS,
                                   topics.VERDICTS, topics.FINALIZE, topics.ANSWERS, topics.FEEDBACK])
def test_a_poison_record_goes_to_deadletter_and_the_service_keeps_serving(cluster, topic):
    bus = BusConfig(bootstrap_servers=cluster.bootstrap)
    publisher = Publisher(bus)
    marker = f"poison-{topic}".encode()
    publisher.send_raw(topic, b"\xff\x00 not a protobuf envelope " + marker, key=marker)
    publisher.flush()
    publisher.close()
    with TopicReader(bus, topics.DEADLETTER) as reader:
        deadline = time.monotonic() + 30
        while not any(r.envelope().dead_letter.key == marker for r in reader.records):
            assert time.monotonic() < deadline, f"no dead letter for {topic}"
            reader.poll(0.2)
        letter = next(r.envelope().dead_letter for r in reader.records if r.envelope().dead_letter.key == marker)
    assert letter.origin_topic.endswith(topic) and letter.error
    assert len(solve_all(cluster, 2, f"after-poison-{topic}")) == 2


def test_services_report_serving(cluster):
    for child in cluster.children:
        if "grpc_port" in child.info:
            assert health_status(cluster.endpoint(child.name)) == 1, child.name  # SERVING


def test_metrics_endpoints_report_latency_lag_and_dead_letters(cluster):
    import httpx

    solve_all(cluster, 2, "metrics")
    planner = httpx.get(f"http://127.0.0.1:{cluster.child('planner').info['metrics_port']}/metrics", timeout=10).text
    count = next(line for line in planner.splitlines()
                 if line.startswith('agentflow_stage_latency_seconds_count{service="planner",stage="memory_updated"}'))
    assert float(count.split()[-1]) >= 2
    assert 'agentflow_consumer_lag{service="planner"}' in planner
    assert 'agentflow_worker_deadlettered_total{service="planner"}' in planner


def test_ask_cli_prints_the_record_and_streams_steps(cluster):
    import json
    import subprocess
    import sys

    base = [sys.executable, "-m", "agentflow.cli", "ask", "--gateway", cluster.endpoint("gateway"),
            "--api-key", "test-key"]
    done = subprocess.run([*base, "--json", "What is 3 + 4?"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    trajectory.validate(json.loads(done.stdout))
    streamed = subprocess.run([*base, "--stream", "What is 3 + 4?"], capture_output=True, text=True, timeout=600)
    assert streamed.returncode == 0 and streamed.stdout.splitlines()[-1].startswith("answer (")
    refused = subprocess.run([*base[:-2], "What?"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "UNAUTHENTICATED" in refused.stderr and "Traceback" not in refused.stderr


def test_drive_sends_groups_of_training_rollouts(cluster, tmp_path):
    """`agentflow drive`'s loop: G rollouts per query share a group id and carry source, ground truth, sampling."""
    from agentflow.trainer.drive import DriveSettings, drive

    dataset = tmp_path / "tasks.jsonl"
    dataset.write_text('{"question": "What is 3 + 4?", "answer": "7"}\n{"query": "What is 5 * 6?", "answer": "30"}\n')
    lines = []
    result = drive(DriveSettings(gateway=cluster.endpoint("gateway"), dataset=str(dataset), group_size=3, groups=2,
                                 concurrency=6, max_time_s=600, api_key=TRAINER), progress=lines.append)
    assert (result["sent"], result["answered"], result["failed"], result["groups"]) == (6, 6, 0, 2)
    with TopicReader(BusConfig(bootstrap_servers=cluster.bootstrap), topics.TRAJECTORIES) as reader:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            reader.poll(0.2)
            training = [record_from_proto(r.envelope().trajectory) for r in reader.records
                        if r.envelope().trajectory.source == "training"]
            if len(training) >= 6:
                break
    groups = {}
    for record in training:
        groups.setdefault(record["group_id"], []).append(record)
    assert sorted(len(g) for g in groups.values()) == [3, 3]
    assert {r["ground_truth"] for r in training} == {"7", "30"}
    assert all(len({r["query"] for r in g}) == 1 for g in groups.values())
    assert '"drive_done"' in lines[-1]
    # each rollout went round the ring in the background: its modules' LLM calls yield to users' (docs/serving.md)
    user = solve_all(cluster, 1, "foreground")[0].trajectory_id
    wanted, plans = {user} | {record["trajectory_id"] for record in training}, {}
    with TopicReader(BusConfig(bootstrap_servers=cluster.bootstrap), topics.PLANS) as reader:
        for r in reader.read(0, settle_s=2.0):  # only these trajectories' (another test writes poison records here)
            if r.key and r.key.decode(errors="replace") in wanted:
                plans.setdefault(r.key.decode(), []).append(r.envelope().plan.options.background)
    assert all(plans[record["trajectory_id"]] and all(plans[record["trajectory_id"]]) for record in training)
    assert plans[user] and not any(plans[user])


def test_drive_waits_for_the_trainer_at_max_ahead_groups(cluster):
    """With max_ahead_groups the driver stops at that many groups the trainer has not finished, and goes on as the
    trainer's trainer.progress records report groups finished (trainer/pace.py); here the test plays the trainer."""
    import json
    import threading

    from agentflow.bus.codec import new_envelope
    from agentflow.trainer.drive import DriveSettings, drive

    bus = BusConfig(bootstrap_servers=cluster.bootstrap)
    publisher = Publisher(bus)

    def trainer_finished(groups_done: int) -> None:
        publisher.publish(topics.TRAINER_PROGRESS, new_envelope("trainer", 0, events_pb2.TrainerProgress(
            groups_done=groups_done)))
        publisher.flush(timeout_s=30)

    trainer_finished(100)  # a trainer that ran before the driver: its count is the base, not progress
    lines: list[dict] = []
    settings = DriveSettings(gateway=cluster.endpoint("gateway"), dataset="synthetic", group_size=2, groups=3,
                             concurrency=4, max_time_s=600, api_key=TRAINER, max_ahead_groups=2,
                             bootstrap=cluster.bootstrap)
    result: dict = {}
    driver = threading.Thread(target=lambda: result.update(drive(
        settings, progress=lambda line: lines.append(json.loads(line)), progress_every_s=0.3)))
    driver.start()
    try:
        deadline = time.monotonic() + 300
        while not any(line.get("waiting") for line in lines) and time.monotonic() < deadline and driver.is_alive():
            time.sleep(0.2)
        waiting = [line for line in lines if line.get("waiting")]
        assert waiting and waiting[0]["ahead"] == 2 and waiting[0]["sent"] == 4, lines
        time.sleep(2)  # held: nothing more is sent while the trainer reports nothing
        assert driver.is_alive() and lines[-1]["waiting"] == "trainer" and lines[-1]["sent"] == 4, lines[-3:]
        trainer_finished(101)
        driver.join(300)
    finally:
        publisher.close(timeout_s=5)
    assert not driver.is_alive() and (result["groups"], result["sent"], result["failed"]) == (3, 6, 0), result


def test_shadow_branches_go_on_from_finished_rollouts(cluster, tmp_path):
    """SolveRequest.branch through the gateway: the memory service rebuilds a finished training rollout's state after
    turn 1, and the branch's record holds only its own turn (numbered 1) on top of the origin's first step. Refused
    without the train scope; an origin the memory service does not keep ends at once as an error record. Then
    `agentflow drive --branch-share` mixes such groups in by itself."""
    from agentflow.trainer.drive import DriveSettings, drive

    with grpc.insecure_channel(cluster.endpoint("gateway")) as ch:
        stub = gateway_pb2_grpc.AgentFlowStub(ch)

        def solve(group_id, key=TRAINER, branch=None):
            request = gateway_pb2.SolveRequest(query="What is 3 + 4?", ground_truth="7", source="training",
                                               group_id=group_id, branch=branch)
            return stub.Solve(request, timeout=600, metadata=[("x-api-key", key)])

        origin = record_from_proto(solve("origin").trajectory)
        assert origin["status"] == "max_steps" and len(origin["turns"]) == 2  # the tiny planner never stops early
        point = events_pb2.BranchPoint(trajectory_id=origin["trajectory_id"], turn=1)
        record = record_from_proto(solve(f"branch/{origin['trajectory_id']}/1", branch=point).trajectory)
        trajectory.validate(record)
        assert [t["step"] for t in record["turns"]] == [1] and record["status"] == "max_steps", record["error"]
        assert record["analysis"] == origin["analysis"] and record["turns"][0]["planner"]["token_ids"]
        assert record["memory"]["steps"][0] == origin["memory"]["steps"][0]
        with pytest.raises(grpc.RpcError) as refused:
            solve("b", key="test-key", branch=point)  # solve and feedback only
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        unknown = solve("b", branch=events_pb2.BranchPoint(trajectory_id="nobody", turn=1))
        assert unknown.status == "error" and "no finished trajectory 'nobody'" in unknown.trajectory.error

    dataset = tmp_path / "tasks.jsonl"
    dataset.write_text('{"question": "What is 3 + 4?", "answer": "7"}\n')
    result = drive(DriveSettings(gateway=cluster.endpoint("gateway"), dataset=str(dataset), group_size=2, groups=4,
                                 concurrency=2, max_steps=2, max_time_s=600, api_key=TRAINER, branch_share=0.5,
                                 temperature=0.0),  # greedy, as above: sampled, the tiny planner can stop at once
                   progress=lambda line: None)
    assert result["failed"] == 0 and result["groups"] == 4 and result["branch_groups"] >= 1, result
    with TopicReader(BusConfig(bootstrap_servers=cluster.bootstrap), topics.TRAJECTORIES) as reader:
        deadline, driven = time.monotonic() + 60, []
        while len(driven) < 2 * result["branch_groups"] and time.monotonic() < deadline:
            reader.poll(0.2)
            trajectories = (r.envelope().trajectory for r in reader.records)
            driven = [record_from_proto(t) for t in trajectories
                      if t.group_id.startswith("branch/") and origin["trajectory_id"] not in t.group_id]
    assert len(driven) == 2 * result["branch_groups"], [r["group_id"] for r in driven]
    assert all([t["step"] for t in r["turns"]] == [1] and r["status"] == "max_steps" for r in driven)
