"""Calls abandoned by their clients (through the whole ring, `agentflow up`'s processes, a slow scripted LLM): the
gateway stops waiting for them at once, the ring ends their trajectories as "cancelled", calls past the gateway's
bound are refused with RESOURCE_EXHAUSTED, and a normal query right after is answered in its usual time.

The time bounds are relative to a query measured on the same ring just before, so a loaded machine moves both."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from agentflow.bus import topics
from agentflow.bus.clients import TopicReader
from agentflow.bus.config import BusConfig
from agentflow.proto.v1 import gateway_pb2, gateway_pb2_grpc

pytestmark = [pytest.mark.slow, pytest.mark.faults]
ABANDONED = 32
MAX_IN_FLIGHT = 12  # the gateway's bound on waiting calls, below ABANDONED
LLM_CALL_S = 1.0  # a query is about eight calls: each abandoned one would hold a gateway thread ~8 s


def slow_reply(messages) -> str:
    time.sleep(LLM_CALL_S)
    prompt = messages[-1]["content"]
    if "Choose the next step" in prompt:
        return "Context: none\nSub-Goal: find the passage\nTool Name: search"
    if "Is this enough" in prompt:
        return "Analysis: not yet\nConclusion: CONTINUE"
    return "capital of Veloria" if "Write the input" in prompt else "Answer: 42"


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    from agentflow.llm.scripted import ScriptedEngine
    from agentflow.llm.server import make_server, serve_in_background
    from agentflow.services.cluster import start_cluster

    llm = make_server(ScriptedEngine(slow_reply), "agentflow", "scripted")
    serve_in_background(llm)
    cluster = start_cluster(log_dir=tmp_path_factory.mktemp("cancel-logs"),
                            llm_url=f"http://127.0.0.1:{llm.server_address[1]}/v1",
                            env={"AGENTFLOW_LOOP_MAX_STEPS": "2", "AGENTFLOW_LOOP_MAX_TIME_S": "300",
                                 "AGENTFLOW_GATEWAY_MAX_IN_FLIGHT": str(MAX_IN_FLIGHT)},
                            progress=lambda *_: None)
    yield cluster
    cluster.stop()
    llm.shutdown()


def solve(stub, text: str, timeout: float):
    return stub.Solve(gateway_pb2.SolveRequest(query=text), timeout=timeout)


def test_abandoned_calls_are_cancelled_and_free_the_gateway(ring):
    with grpc.insecure_channel(ring.endpoint("gateway")) as channel:
        stub = gateway_pb2_grpc.AgentFlowStub(channel)
        started = time.monotonic()
        assert solve(stub, "baseline question", 300).status in ("answered", "max_steps")
        usual = time.monotonic() - started

        def abandon(i):
            try:
                solve(stub, f"abandoned question {i}", 1.0)  # the client gives up after a second
                return "answered"
            except grpc.RpcError as e:
                return e.code().name

        with ThreadPoolExecutor(ABANDONED) as pool:
            outcomes = Counter(pool.map(abandon, range(ABANDONED)))
        assert set(outcomes) <= {"DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"}, outcomes
        accepted = outcomes["DEADLINE_EXCEEDED"]
        assert 1 <= accepted <= MAX_IN_FLIGHT and outcomes["RESOURCE_EXHAUSTED"] >= 1, outcomes

        started = time.monotonic()
        assert solve(stub, "the next question", 300).status in ("answered", "max_steps")
        after = time.monotonic() - started
    # Before: the abandoned calls held every gateway thread for their whole trajectories, and the ring kept
    # working on them, so this query waited behind them.
    print(f"abandoned: {dict(outcomes)}; a query took {usual:.1f} s before and {after:.1f} s after")
    assert after < 2 * usual + 10, f"usual {usual:.1f} s, after the abandoned calls {after:.1f} s"

    statuses = Counter()
    with TopicReader(BusConfig(bootstrap_servers=ring.bootstrap), topics.TRAJECTORIES) as reader:
        deadline = time.monotonic() + 120
        while statuses["cancelled"] < accepted and time.monotonic() < deadline:
            reader.poll(0.5)
            statuses = Counter(r.envelope().trajectory.status for r in reader.records)
    assert statuses["cancelled"] == accepted, statuses
