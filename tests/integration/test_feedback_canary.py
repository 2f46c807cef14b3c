"""A canary judged on users' ratings alone, for real: a running ring (tansu, the LLM server following published
versions, six service processes), the rollout controller as its own process with ``--reward-source feedback``, and
production queries without ground truth through the gateway. The test plays the users: it rates every answer
through ``Feedback``, 80 % of them right, where "right" means "the stable version answered" (a test double of
answer quality, as in test_routing_backends: the canary is degraded by definition, on the same weights). The
controller sees only the ratings the memory service joins onto the records, and must roll the canary back on that
reward (not on its timeout), after which production stays on the stable version and no trajectory mixed versions."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from agentflow.bus import topics
from agentflow.bus.clients import Publisher, TopicReader
from agentflow.bus.codec import new_envelope
from agentflow.bus.config import BusConfig
from agentflow.domain.convert import record_from_proto, to_dict
from agentflow.domain.trajectory import Record
from agentflow.envs.synthetic import EnvConfig, SyntheticEnv
from agentflow.proto.v1 import events_pb2, gateway_pb2, gateway_pb2_grpc
from agentflow.services.cluster import start_cluster

pytestmark = pytest.mark.slow
KEY = [("x-api-key", "test-key")]
STABLE, CANARY = "v000000", "v000001"
RIGHT_RATINGS = 0.8  # the share of ratings that match the truth
MAX_QUERIES = 3000  # a budget in queries, not seconds: the rollback needs a few hundred on any machine
ROLLOUT = ["--reward-source", "feedback", "--canary-percent", "50", "--steps", "50,100", "--min-samples", "20",
           "--reward-margin", "0.09", "--error-margin", "0.25", "--latency-ratio", "10", "--latency-cap-s", "10",
           "--timeout-s", "3600", "--timeout-action", "promote", "--drain-s", "5"]


@pytest.fixture(scope="module")
def ring(tiny_model_dir, tmp_path_factory):
    env = {"AGENTFLOW_PROFILE": "tiny-deterministic", "AGENTFLOW_ENVIRONMENT": "synthetic:0",
           "AGENTFLOW_LOOP_MAX_STEPS": "2", "AGENTFLOW_GATEWAY_API_KEYS": "test-key",
           "AGENTFLOW_PLANNER_ROUTING": "planner", "AGENTFLOW_PLANNER_ROUTING_ENDPOINTS": "http://127.0.0.1:*",
           "AGENTFLOW_PLANNER_ROUTING_WAIT_S": "0"}  # the controller starts after the ring (as in the demo)
    c = start_cluster(log_dir=tmp_path_factory.mktemp("feedback-canary-logs"), model=str(tiny_model_dir), env=env,
                      progress=lambda *_: None, llm_args=("--follow-versions", "load", "--version", STABLE))
    try:
        c.spawn("rollout", ["rollout", "--bootstrap", c.bootstrap, "--backend", "local",
                            "--llm-admin-url", c.llm_url.removesuffix("/v1"), *ROLLOUT], 120,
                {"AGENTFLOW_ROLLOUT_ADMIN_TOKEN": c.admin_token})
        yield c
    finally:
        c.stop()


def solve(stub, query: str) -> gateway_pb2.SolveResponse:
    return stub.Solve(gateway_pb2.SolveRequest(query=query), timeout=120, metadata=KEY)


def test_a_canary_users_rate_worse_is_rolled_back_on_their_ratings(ring, tiny_model_dir):
    bus = BusConfig(bootstrap_servers=ring.bootstrap)
    queries = [t.query for t in SyntheticEnv(EnvConfig(seed=0)).train[:60]]
    users = random.Random(0)
    lock = threading.Lock()
    seen: dict = {"versions": {}, "mixed": 0}
    decided = threading.Event()
    decisions: list[dict] = []

    with Publisher(bus) as publisher:  # the same weights as the stable version, published as a new one
        publisher.publish(topics.PLANNER_VERSIONS, new_envelope(
            "planner", 0, events_pb2.PlannerVersion(version=CANARY, checkpoint_uri=str(tiny_model_dir))))
        publisher.flush(10)

    def watch() -> None:
        with TopicReader(bus, topics.ROLLOUT_DECISIONS, timeout_s=30) as reader:
            while not decided.is_set():
                for received in reader.poll(0.5):
                    decision = to_dict(received.envelope().rollout_decision)
                    decisions.append(decision)
                    if decision["version"] == CANARY and decision["action"] in ("rollback", "promote", "reject"):
                        decided.set()

    def one(i: int) -> None:
        if decided.is_set():
            return
        response = solve(stub, queries[i % len(queries)])
        versions = Record(record_from_proto(response.trajectory)).planner_versions()
        version = next(iter(versions), "")
        with lock:
            seen["mixed"] += len(versions) > 1
            seen["versions"][version] = seen["versions"].get(version, 0) + 1
            right = users.random() < RIGHT_RATINGS
        if response.status != "error":
            liked = (version == STABLE) == right
            stub.Feedback(gateway_pb2.FeedbackRequest(trajectory_id=response.trajectory_id, score=float(liked),
                                                      labeller="user"), timeout=60, metadata=KEY)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with grpc.insecure_channel(ring.endpoint("gateway")) as channel:
        stub = gateway_pb2_grpc.AgentFlowStub(channel)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(MAX_QUERIES)))
        decided.set()
        watcher.join(30)
        time.sleep(2.0)  # the routing table reaches the planner over the bus
        after = [solve(stub, q) for q in queries[:20]]
    after_versions = {v for r in after for v in Record(record_from_proto(r.trajectory)).planner_versions()}

    final = [d for d in decisions if d["version"] == CANARY and d["action"] not in ("canary", "step")]
    assert final and final[0]["action"] == "rollback", decisions
    assert final[0]["reason"].startswith("reward lower"), final[0]  # on the ratings, not the timeout
    assert seen["versions"].get(CANARY, 0) >= 20 and seen["mixed"] == 0, seen  # the canary served, never mixed
    assert after_versions == {STABLE}, after_versions  # production back on the stable version
