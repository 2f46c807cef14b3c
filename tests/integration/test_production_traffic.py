"""Production traffic that trains, for real: ``Feedback`` through the gateway of a running ring (tansu, the LLM
server, six service processes), joined onto the record by the memory service; and ``drive --from-traffic``, which
replays only the queries that may be trained on."""

from __future__ import annotations

import math
import threading
import time

import grpc
import pytest

from agentflow.bus import topics
from agentflow.bus.clients import TopicReader
from agentflow.bus.config import BusConfig
from agentflow.domain.convert import record_from_proto
from agentflow.domain.trajectory import Record
from agentflow.proto.v1 import gateway_pb2, gateway_pb2_grpc
from agentflow.services.cluster import start_cluster
from agentflow.services.gateway.keys import new_key
from agentflow.trainer.drive import DriveSettings, drive

pytestmark = pytest.mark.slow
# The keys of this ring (docs/deploy.md, "API keys"): an application's backend that rates for its users, the rollout
# driver, a user with a key of their own, and a labelling team.
APP, APP_ENTRY = new_key("app", ["solve", "feedback", "delegate"])
TRAINER, TRAINER_ENTRY = new_key("trainer", ["solve", "train"])
MALLORY, MALLORY_ENTRY = new_key("mallory", ["solve", "feedback"])
REVIEWER, REVIEWER_ENTRY = new_key("reviewer", ["feedback", "review"])
KEY = [("x-api-key", APP)]
MAX_RATINGS = 3  # ratings that change one trajectory, accepted by the gateway
ENV = {"AGENTFLOW_LOOP_MAX_STEPS": "1", "AGENTFLOW_LOOP_MAX_TIME_S": "600",
       "AGENTFLOW_GATEWAY_API_KEYS": ",".join([APP_ENTRY, TRAINER_ENTRY, MALLORY_ENTRY, REVIEWER_ENTRY]),
       "AGENTFLOW_GATEWAY_MAX_RATINGS_PER_TRAJECTORY": str(MAX_RATINGS)}


@pytest.fixture(scope="module")
def cluster(tiny_model_dir, tmp_path_factory):
    c = start_cluster(log_dir=tmp_path_factory.mktemp("traffic-logs"), model=str(tiny_model_dir), env=ENV,
                      progress=lambda *_: None)
    yield c
    c.stop()


@pytest.fixture()
def stub(cluster):
    with grpc.insecure_channel(cluster.endpoint("gateway")) as ch:
        yield gateway_pb2_grpc.AgentFlowStub(ch)


def solve(stub, query: str, metadata=KEY, **fields) -> gateway_pb2.SolveResponse:
    return stub.Solve(gateway_pb2.SolveRequest(query=query, **fields), timeout=600, metadata=metadata)


def records_of(cluster, topic: str, keys: set[str], settle_s: float = 3.0) -> list:
    with TopicReader(BusConfig(bootstrap_servers=cluster.bootstrap), topic) as reader:
        reader.read(0, settle_s=settle_s)
        return [r.envelope() for r in reader.records if r.key.decode() in keys]


def wait_for_records(cluster, tid: str, count: int, until=None) -> list[dict]:
    """The records of ``tid`` once there are ``count`` (or, with ``until``, once one of them passes it), or all there
    are after 60 s."""
    deadline = time.monotonic() + 60
    while True:
        found = [record_from_proto(e.trajectory) for e in records_of(cluster, topics.TRAJECTORIES, {tid}, 1.0)]
        if (any(until(r) for r in found) if until else len(found) >= count) or time.monotonic() > deadline:
            return found


def human_ratings(record: dict) -> list[tuple[str, float]]:
    return [(r["author"], r["value"]) for r in record["rewards"] if r["source"] == "human"]


def test_feedback_joins_the_record_once_per_labeller(cluster, stub):
    tid = solve(stub, "What is 12 + 30?").trajectory_id
    with pytest.raises(grpc.RpcError) as info:
        stub.Feedback(gateway_pb2.FeedbackRequest(trajectory_id=tid, score=1.0), timeout=10)  # no API key
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    first = stub.Feedback(gateway_pb2.FeedbackRequest(trajectory_id=tid, score=0.8, labeller="alice",
                                                      comment="close"), timeout=30, metadata=KEY)
    again = stub.Feedback(gateway_pb2.FeedbackRequest(trajectory_id=tid, score=0.8, labeller="alice",
                                                      comment="close"), timeout=30, metadata=KEY)
    assert first.event_id == again.event_id and first.trajectory_id == tid
    stub.Feedback(gateway_pb2.FeedbackRequest(trajectory_id=tid, thumbs_up=False, labeller="alice"), timeout=30,
                  metadata=KEY)  # alice changes her mind
    stub.Feedback(gateway_pb2.FeedbackRequest(trajectory_id=tid, thumbs_up=True, labeller="bob"), timeout=30,
                  metadata=KEY)
    # The ratings of one trajectory go to one partition of `feedback` and are joined in order; the records they make
    # go to one partition of `trajectories`, in that order. So once bob's rating (the last one sent) is on a record,
    # whatever the repeat made is already there too; the settle then catches any record that comes after.
    wait_for_records(cluster, tid, 4, until=lambda r: ("app/bob", 1.0) in human_ratings(r))
    records = [record_from_proto(e.trajectory) for e in records_of(cluster, topics.TRAJECTORIES, {tid}, 3.0)]
    assert len(records) == 4, [r["rewards"] for r in records]  # the record, then once per change; the repeat: none
    final = records[-1]["rewards"]
    human = human_ratings(records[-1])
    assert human == [("app/alice", 0.0), ("app/bob", 1.0)], final  # the key speaks for its users (delegate)
    assert Record(records[-1]).reward(["feedback"]) == 1.0  # the latest rating


def test_one_trajectory_takes_a_bounded_number_of_rating_changes(cluster, stub):
    """Each rating that changes a trajectory makes the memory service emit the record again: a rater alternating
    scores is stopped after MAX_RATINGS changes (RESOURCE_EXHAUSTED, nothing written), while a retry of their current
    rating still passes."""
    mallory = [("x-api-key", MALLORY)]
    tid = solve(stub, "What is 21 + 4?", metadata=mallory).trajectory_id
    ratings = [gateway_pb2.FeedbackRequest(trajectory_id=tid, score=s) for s in (0.0, 1.0, 0.0, 1.0)]
    events = [stub.Feedback(r, timeout=30, metadata=mallory).event_id for r in ratings[:MAX_RATINGS]]
    with pytest.raises(grpc.RpcError) as info:
        stub.Feedback(ratings[MAX_RATINGS], timeout=30, metadata=mallory)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "rated" in info.value.details()
    assert stub.Feedback(ratings[2], timeout=30, metadata=mallory).event_id == events[2]  # a retry gets through
    assert len(records_of(cluster, topics.FEEDBACK, {tid})) == 1 + MAX_RATINGS  # the retry is published again
    assert len(wait_for_records(cluster, tid, 1 + MAX_RATINGS)) == 1 + MAX_RATINGS  # the record, once per change


def test_a_key_rates_only_its_own_trajectories_and_only_as_itself(cluster, stub):
    """Ratings carry ownership: a key rates what it asked for (or anything, with `review`), always under its own name:
    a labeller the caller chose is a note, and nobody replaces another rater's rating."""
    mallory, reviewer = [("x-api-key", MALLORY)], [("x-api-key", REVIEWER)]
    theirs = solve(stub, "What is 31 + 1?").trajectory_id  # asked by the app
    own = solve(stub, "What is 31 + 2?", metadata=mallory).trajectory_id
    with pytest.raises(grpc.RpcError) as info:
        stub.Feedback(gateway_pb2.FeedbackRequest(trajectory_id=theirs, score=0.0, labeller="app/alice"), timeout=30,
                      metadata=mallory)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED and "review" in info.value.details()
    stub.Feedback(gateway_pb2.FeedbackRequest(trajectory_id=theirs, score=1.0, labeller="alice"), timeout=30,
                  metadata=KEY)
    stub.Feedback(gateway_pb2.FeedbackRequest(trajectory_id=theirs, score=0.5), timeout=30, metadata=reviewer)
    stub.Feedback(gateway_pb2.FeedbackRequest(trajectory_id=own, score=1.0, labeller="reviewer"), timeout=30,
                  metadata=mallory)  # a forged name
    stub.Feedback(gateway_pb2.FeedbackRequest(trajectory_id=own, score=0.0), timeout=30, metadata=reviewer)
    with pytest.raises(grpc.RpcError) as info:
        stub.Feedback(gateway_pb2.FeedbackRequest(trajectory_id=own, score=1.0), timeout=30, metadata=KEY)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED  # the app did not ask for it
    human = {tid: [(r["author"], r["value"]) for r in wait_for_records(cluster, tid, 3)[-1]["rewards"]
                   if r["source"] == "human"] for tid in (theirs, own)}
    assert human[theirs] == [("app/alice", 1.0), ("reviewer", 0.5)], human
    assert human[own] == [("mallory", 1.0), ("reviewer", 0.0)], human  # the forged name replaced nobody
    assert records_of(cluster, topics.FEEDBACK, {theirs, own}) and not any(
        e.feedback.reward.author.startswith("app/") for e in records_of(cluster, topics.FEEDBACK, {own}))


def test_only_a_train_key_sends_what_teaches_the_planner(cluster, stub):
    """`source`, `group_id` and `ground_truth` teach the planner directly: a key without the `train` scope is refused
    (PERMISSION_DENIED) and nothing reaches `queries`; the driver's key gets through."""
    import uuid

    marker = f"poison {uuid.uuid4().hex}"
    mallory = [("x-api-key", MALLORY)]
    attempts = [dict(source="training", group_id="g1"), dict(ground_truth="666"), dict(group_id="g2"),
                dict(source="eval"), dict(source="training", group_id="g3", ground_truth="666")]
    for fields in attempts:
        for metadata in (mallory, KEY):
            with pytest.raises(grpc.RpcError) as info:
                stub.Solve(gateway_pb2.SolveRequest(query=f"{marker}: what is 1 + 1?", **fields), timeout=30,
                           metadata=metadata)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED and "train" in info.value.details()
    labelled = solve(stub, "What is 3 + 4?", ground_truth="7", source="eval", metadata=[("x-api-key", TRAINER)])
    with TopicReader(BusConfig(bootstrap_servers=cluster.bootstrap), topics.QUERIES) as reader:
        reader.read(0, settle_s=2.0)
        queries = [e.query for r in reader.records if (e := r.envelope()).WhichOneof("payload") == "query"]
    assert not [q for q in queries if marker in q.query]
    assert [q.owner for q in queries if q.ground_truth == "7"] == ["trainer"]
    # a rating never overrides the ground truth under the default precedence
    rule = Record(wait_for_records(cluster, labelled.trajectory_id, 1)[0]).rewards("rule")[-1]
    stub.Feedback(gateway_pb2.FeedbackRequest(trajectory_id=labelled.trajectory_id, score=1.0 - rule), timeout=30,
                  metadata=[("x-api-key", REVIEWER)])
    record = wait_for_records(cluster, labelled.trajectory_id, 2)[-1]
    assert Record(record).rewards("human") == [1.0 - rule] and Record(record).reward() == rule


def test_bad_feedback_is_refused_and_nothing_is_written(cluster, stub):
    tid = solve(stub, "What is 5 + 6?").trajectory_id
    cases = [gateway_pb2.FeedbackRequest(trajectory_id="f" * 32, score=1.0),  # never solved here
             gateway_pb2.FeedbackRequest(trajectory_id=tid, score=1.5),
             gateway_pb2.FeedbackRequest(trajectory_id=tid, score=-0.1),
             gateway_pb2.FeedbackRequest(trajectory_id=tid, score=math.nan),
             gateway_pb2.FeedbackRequest(trajectory_id=tid),  # no rating
             gateway_pb2.FeedbackRequest(trajectory_id=tid, score=1.0, comment="x" * 2001),
             gateway_pb2.FeedbackRequest(trajectory_id=tid, score=1.0, labeller="l" * 129),
             gateway_pb2.FeedbackRequest(trajectory_id="", score=1.0)]
    codes = []
    for request in cases:
        with pytest.raises(grpc.RpcError) as info:
            stub.Feedback(request, timeout=10, metadata=KEY)
        codes.append(info.value.code())
    assert codes == [grpc.StatusCode.NOT_FOUND] + [grpc.StatusCode.INVALID_ARGUMENT] * 7
    with grpc.insecure_channel(cluster.endpoint("gateway")) as ch:
        raw = ch.unary_unary("/agentflow.v1.AgentFlow/Feedback", request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\xff\xff\xff not protobuf", timeout=10, metadata=KEY)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "FeedbackRequest" in info.value.details()
    assert records_of(cluster, topics.FEEDBACK, {tid, "f" * 32}) == []


def test_an_opted_out_query_never_reaches_a_training_group(cluster, stub):
    """Three production queries: one opted out, one allowed, one unsaid (this gateway's policy: not trained on).
    The opted-out text, sent again later *with* train_ok, stays out too. Checked on `trajectories`."""
    private, allowed, unsaid = "What is 701 + 1?", "What is 702 + 2?", "What is 703 + 3?"
    solve(stub, private, train_ok=False)
    solve(stub, allowed, train_ok=True)
    solve(stub, unsaid)
    solve(stub, private, train_ok=True)  # the same text from someone else: the opt-out is not crossed
    stop = threading.Event()
    settings = DriveSettings(gateway=cluster.endpoint("gateway"), api_key=TRAINER, from_traffic=True,
                             bootstrap=cluster.bootstrap, group_size=2, groups=3, concurrency=2, max_steps=1)
    result = drive(settings, stop=stop, progress=lambda *_: None)
    stop.set()
    assert result["groups"] == 3 and result["answered"] == 6, result
    with TopicReader(BusConfig(bootstrap_servers=cluster.bootstrap), topics.TRAJECTORIES) as reader:
        reader.read(0, settle_s=3.0)
        training = [e.trajectory for r in reader.records if (e := r.envelope()).trajectory.source == "training"]
    assert {t.query for t in training} == {allowed}, {t.query for t in training}
    assert len({t.group_id for t in training}) == 3 and all(t.group_id.startswith("replay/") for t in training)


def test_feedback_cli_rates_an_answer_and_names_what_went_wrong(cluster, stub):
    import json
    import subprocess
    import sys

    tid = solve(stub, "What is 8 + 9?").trajectory_id
    base = [sys.executable, "-m", "agentflow.cli", "feedback", "--gateway", cluster.endpoint("gateway"),
            "--api-key", APP]
    ok = subprocess.run([*base, tid, "--up", "--labeller", "carol"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["event_id"].startswith(f"{tid}:0:feedback-")
    unknown = subprocess.run([*base, "0" * 32, "--down"], capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "NOT_FOUND" in unknown.stderr, unknown.stderr
    bad = subprocess.run([*base, tid, "--score", "2"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "argument --score: must be a finite number in [0, 1]" in bad.stderr, bad.stderr
    human = [r for r in wait_for_records(cluster, tid, 2)[-1]["rewards"] if r["source"] == "human"]
    assert [(r["author"], r["value"]) for r in human] == [("app/carol", 1.0)]


def test_gateway_and_llm_server_metrics_count_real_calls(cluster, stub):
    """Scraped after real calls: the gateway's calls by method and code, latency, in-flight and refused keys; the
    memory service's finished trajectories, turns, tool calls and rewards by source and version; the LLM server's
    requests and tokens per version."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    def scrape(url):
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(httpx.get(url, timeout=10).text) for s in f.samples}

    gateway = f"http://127.0.0.1:{cluster.child('gateway').info['metrics_port']}/metrics"
    memory = f"http://127.0.0.1:{cluster.child('memory').info['metrics_port']}/metrics"
    before, memory_before = scrape(gateway), scrape(memory)
    record = solve(stub, "What is 3 + 4?").trajectory
    with pytest.raises(grpc.RpcError):
        stub.Solve(gateway_pb2.SolveRequest(query="hi"), timeout=10, metadata=[("x-api-key", "wrong")])
    after = scrape(gateway)
    solve_labels = (("grpc_method", "Solve"), ("grpc_service", "agentflow.v1.AgentFlow"))

    def delta(name, *extra):
        key = (name, tuple(sorted(solve_labels + extra)))
        return after.get(key, 0) - before.get(key, 0)

    assert delta("agentflow_grpc_server_handled_total", ("grpc_code", "OK")) == 1
    assert delta("agentflow_grpc_server_handled_total", ("grpc_code", "UNAUTHENTICATED")) == 1
    assert delta("agentflow_grpc_server_auth_failures_total") == 1
    assert delta("agentflow_grpc_server_handling_seconds_count") == 2
    assert after[("agentflow_grpc_server_in_flight", solve_labels)] == 0
    assert not any(dict(labels).get("grpc_service", "").startswith("grpc.health") for _, labels in after)

    def memory_delta(name, **labels):
        keys = {key for key in (*memory_before, *memory_after) if key[0] == name
                and labels.items() <= dict(key[1]).items()}
        return sum(memory_after.get(k, 0) - memory_before.get(k, 0) for k in keys)

    version = record.turns[0].planner.model_version if record.turns else record.analysis_call.model_version
    memory_after = {}
    for _ in range(20):  # the memory service counts the record as it closes it, just before the gateway answers
        memory_after = scrape(memory)
        if memory_delta("agentflow_trajectories_total") >= 1:
            break
        time.sleep(0.25)
    assert memory_delta("agentflow_trajectories_total", status=record.status, version=version) == 1
    assert memory_delta("agentflow_trajectory_turns_count", version=version) == 1
    assert memory_delta("agentflow_trajectory_turns_sum", version=version) == len(record.turns)
    tools = [t.decision.tool for t in record.turns if t.decision.tool and not t.parse_error]
    assert memory_delta("agentflow_tool_calls_total") == len(tools)
    assert memory_delta("agentflow_tool_errors_total") == sum(1 for t in record.turns if t.tool_error
                                                              and t.decision.tool and not t.parse_error)
    assert memory_delta("agentflow_trajectory_reward_count") == 0  # no ground truth, no rating yet
    stub.Feedback(gateway_pb2.FeedbackRequest(trajectory_id=record.trajectory_id, thumbs_up=True, labeller="m"),
                  timeout=30, metadata=KEY)
    for _ in range(40):
        memory_after = scrape(memory)
        if memory_delta("agentflow_trajectory_reward_count", source="human", version=version) == 1:
            break
        time.sleep(0.25)
    assert memory_delta("agentflow_trajectory_reward_sum", source="human", version=version) == pytest.approx(1.0)

    llm = scrape(cluster.llm_url.removesuffix("/v1") + "/metrics")
    served = {dict(labels)["version"] for (name, labels), v in llm.items()
              if name == "agentflow_llm_requests_total" and dict(labels)["code"] == "200" and v > 0}
    assert served and all(llm[("agentflow_llm_generation_tokens_total", (("version", v),))] > 0 for v in served)


@pytest.mark.faults
def test_feedback_across_a_broker_restart_is_refused_while_down_then_joined_once(tiny_model_dir, tmp_path):
    """The broker killed (SIGKILL) and restarted empty after a query was answered: a rating sent while it is down is
    refused with UNAVAILABLE (nothing half-written; the caller is told to call again), the same rating after the
    restart is accepted and joined onto the record the memory service still holds, and the record goes out once
    on the restarted broker. Its own ring: the module's cluster stays untouched."""
    from agentflow.rpc.client import wait_serving

    # The gateway waits Kafka's request timeout for a rating to be confirmed before it refuses it: 10 s, not 30.
    ring = start_cluster(log_dir=tmp_path / "logs", model=str(tiny_model_dir),
                         env={**ENV, "AGENTFLOW_KAFKA_REQUEST_TIMEOUT_MS": "10000"}, progress=lambda *_: None)
    try:
        target = ring.endpoint("gateway")
        with grpc.insecure_channel(target) as channel:
            gateway = gateway_pb2_grpc.AgentFlowStub(channel)
            tid = solve(gateway, "What is 9 + 33?").trajectory_id
            rating = gateway_pb2.FeedbackRequest(trajectory_id=tid, score=1.0, labeller="carol")
            ring.broker.kill()
            with pytest.raises(grpc.RpcError) as info:
                gateway.Feedback(rating, timeout=120, metadata=KEY)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
            ring.broker.start()
            assert wait_serving(target, 120), "the gateway did not come back after the broker restart"
            deadline = time.monotonic() + 120
            while True:  # as a client would: call again while the ring reconnects
                try:
                    gateway.Feedback(rating, timeout=60, metadata=KEY)
                    break
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline, e.details()
                    time.sleep(1.0)
        deadline = time.monotonic() + 60
        while not (rated := wait_for_records(ring, tid, 1)) and time.monotonic() < deadline:
            time.sleep(1.0)
        # A second record would be the rating joined twice. The one refused while the broker was down is sent again
        # by the gateway's publisher once the broker is back (usually before the call above got through), so the
        # rating reaches `feedback` twice: wait for both (or as long as that re-send may take: the request timeout
        # plus the reconnect backoff), then give the memory service time to join the second.
        deadline = time.monotonic() + 20
        while len(records_of(ring, topics.FEEDBACK, {tid}, 0.5)) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        rated = [record_from_proto(e.trajectory) for e in records_of(ring, topics.TRAJECTORIES, {tid}, 3.0)]
    finally:
        ring.stop()
    assert len(rated) == 1, [r.get("rewards") for r in rated]  # the restarted broker holds the rated record, once
    human = [r for r in rated[0]["rewards"] if r["source"] == "human"]
    assert [(r["value"], r["author"]) for r in human] == [(1.0, "app/carol")], rated[0]["rewards"]
