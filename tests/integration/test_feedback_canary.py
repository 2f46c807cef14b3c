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
import httpx
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
TTL_S = 6  # the routing tables' lifetime (AGENTFLOW_ROLLOUT_ROUTING_TTL_S)
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
                {"AGENTFLOW_ROLLOUT_ADMIN_TOKEN": c.admin_token,
                 # tables expire TTL_S after publication (renewed every third of it): the killed-controller test
                 "AGENTFLOW_ROLLOUT_TICK_S": "1", "AGENTFLOW_ROLLOUT_ROUTING_TTL_S": str(TTL_S)})
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


def test_a_killed_controller_leaves_the_split_until_it_expires_then_everything_on_stable(ring, tiny_model_dir):
    """Runs after the rollback above (the controller idle, v000000 stable). A new canary takes half the traffic;
    the controller is killed with SIGKILL mid-canary (no rating comes, so it would never decide). Production goes on:
    no query fails, the split holds until the table expires (TTL_S after its last renewal), and from then on every
    trajectory runs on the stable version. Queries go one at a time, so at most one trajectory spans the expiry
    (the only one that may mix versions; the controller would leave it out)."""
    import os
    import signal

    canary = "v000002"
    bus = BusConfig(bootstrap_servers=ring.bootstrap)
    queries = [t.query for t in SyntheticEnv(EnvConfig(seed=1)).train[:40]]
    with Publisher(bus) as publisher:
        publisher.publish(topics.PLANNER_VERSIONS, new_envelope(
            "planner", 0, events_pb2.PlannerVersion(version=canary, checkpoint_uri=str(tiny_model_dir))))
        publisher.flush(10)
    runs = []  # (started, finished, status, planner versions)
    with grpc.insecure_channel(ring.endpoint("gateway")) as channel:
        stub = gateway_pb2_grpc.AgentFlowStub(channel)

        def one(i: int) -> set:
            started = time.monotonic()
            response = solve(stub, queries[i % len(queries)])
            versions = Record(record_from_proto(response.trajectory)).planner_versions()
            runs.append((started, time.monotonic(), response.status, versions))
            return versions

        for i in range(400):  # until the canary serves (it is loaded, then routed at 50 %)
            if canary in one(i):
                break
        assert any(canary in r[3] for r in runs), runs[-5:]
        rollout = ring.child("rollout").process
        os.killpg(rollout.pid, signal.SIGKILL)
        rollout.wait(30)
        killed = time.monotonic()
        expired_by = killed + TTL_S + 1  # the last renewal was at most TTL_S / 3 before the kill
        after = 0
        i = 0
        while after < 15 and i < 600:
            one(i)
            i += 1
            after += runs[-1][0] > expired_by
    since_kill = [r for r in runs if r[0] >= killed]
    assert all(r[2] != "error" for r in since_kill), [r for r in since_kill if r[2] == "error"]
    assert sum(len(r[3]) > 1 for r in since_kill) <= 1, since_kill
    held = [r for r in since_kill if r[1] < killed + TTL_S / 3]  # finished before the table could expire
    late = [r for r in since_kill if r[0] > expired_by]
    assert late and all(r[3] == {STABLE} for r in late), late  # the expired table: stable only
    print(f"after the kill: {len(since_kill)} queries, 0 failed; {len(held)} before the table could expire "
          f"({sum(canary in r[3] for r in held)} on the canary), {len(late)} after it expired, all on {STABLE}")


def test_a_killed_canary_endpoint_fails_no_query_and_its_turns_move_to_stable(ring, tiny_model_dir):
    """With no controller (killed by the test above, or here): a table routes half of the trajectories to a canary on
    a serve-llm process of its own, which is killed with SIGKILL under load (4 queries at a time). No query fails:
    a turn routed to the dead endpoint is made again on the stable version and recorded so. Only trajectories in
    flight at the kill can hold turns of both versions (the controller leaves those out); every one started after
    it runs on stable alone."""
    import os
    import signal

    from agentflow.llm.routing import Route, RoutingTable, routing_key

    canary = "v000003"
    controller = ring.child("rollout").process
    if controller.poll() is None:  # run alone: the controller would overwrite the table below
        os.killpg(controller.pid, signal.SIGKILL)
        controller.wait(30)
    server = ring.spawn("llm-canary", ["serve-llm", "--model", str(tiny_model_dir), "--version", canary], 180)
    routes = (Route(canary, server.info["url"], canary, 50), Route(STABLE, ring.llm_url, STABLE, 50))
    table = RoutingTable(deployment="planner", stable=STABLE, canary=canary, routes=routes,
                         decided_at_unix_ms=int(time.time() * 1000))  # newer than the dead controller's
    with Publisher(BusConfig(bootstrap_servers=ring.bootstrap)) as publisher:
        publisher.publish(topics.PLANNER_ROUTING, new_envelope(routing_key("planner"), 0, table.to_proto()))
        publisher.flush(10)
    queries = [t.query for t in SyntheticEnv(EnvConfig(seed=2)).train[:40]]
    runs = []  # (started, finished, status, planner versions)
    killed, lock = threading.Event(), threading.Lock()
    kill_at = [float("inf")]

    with grpc.insecure_channel(ring.endpoint("gateway")) as channel:
        stub = gateway_pb2_grpc.AgentFlowStub(channel)

        def one(i: int) -> None:
            if sum(r[0] > kill_at[0] for r in runs) >= 20:
                return
            started = time.monotonic()
            response = solve(stub, queries[i % len(queries)])
            versions = Record(record_from_proto(response.trajectory)).planner_versions()
            with lock:
                runs.append((started, time.monotonic(), response.status, versions))
                if sum(canary in r[3] for r in runs) >= 4 and not killed.is_set():  # kill it with queries in flight
                    killed.set()
                    kill_at[0] = time.monotonic()
                    os.killpg(server.process.pid, signal.SIGKILL)

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(one, range(600)))  # a budget in queries: 4 on the canary, then 20 started after the kill
    assert killed.is_set(), runs[-5:]
    since = [r for r in runs if r[1] > kill_at[0]]  # finished after the kill
    started_after = [r for r in since if r[0] > kill_at[0]]
    mixed = [r for r in since if len(r[3]) > 1]
    assert all(r[2] != "error" for r in since), [r for r in since if r[2] == "error"]
    assert len(started_after) >= 20 and all(r[3] == {STABLE} for r in started_after), started_after[:5]
    assert len(mixed) <= 4 and all(r[0] < kill_at[0] for r in mixed), mixed  # at most the 4 in flight
    metrics = httpx.get(f"http://127.0.0.1:{ring.child('planner').info['metrics_port']}/metrics", timeout=10).text
    moved = sum(float(line.split()[-1]) for line in metrics.splitlines()
                if line.startswith("agentflow_routing_stable_fallbacks_total"))
    assert moved >= 1, "no turn was routed to the dead canary and made again on stable"
    print(f"canary endpoint killed after {len(runs) - len(since)} queries: {len(since)} finished after it, 0 failed, "
          f"{len(mixed)} mixed (in flight at the kill), {len(started_after)} started after it, all on {STABLE}; "
          f"{moved:.0f} turns moved to stable")
