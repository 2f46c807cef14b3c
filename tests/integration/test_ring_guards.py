"""What `agentflow up` starts (`start_cluster`: tansu and the six service processes; a scripted LLM server here, so
no model loads): a stage that fails on every attempt ends its trajectory with status "error" at once instead of
leaving its caller to wait out the deadline, and internal gRPC needs the run's service token while the gateway's
user API stays keyed by API keys."""

from __future__ import annotations

import json
import time

import grpc
import pytest

from agentflow.proto.v1 import events_pb2, gateway_pb2, gateway_pb2_grpc, modules_pb2, modules_pb2_grpc
from agentflow.rpc.client import channel

pytestmark = [pytest.mark.slow, pytest.mark.faults]
POISON = "poison"
KEY = [("x-api-key", "test-key")]


def reply(messages) -> str:
    """The planner's reply to a poison query is over the record limit (1 MiB), so its plan can never be written:
    the planner dead-letters that trajectory's `memory.updated` event, every time it is delivered."""
    prompt = messages[-1]["content"]
    if "Choose the next step" in prompt:
        goal = "x" * (2 * 1024 * 1024) if POISON in prompt else "find the passage"
        return f"Context: none\nSub-Goal: {goal}\nTool Name: search"
    if "Is this enough" in prompt:
        return "Analysis: enough\nConclusion: STOP"
    return "capital of Veloria" if "Write the input" in prompt else "Answer: 42"


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    from agentflow.llm.scripted import ScriptedEngine
    from agentflow.llm.server import make_server, serve_in_background
    from agentflow.services.cluster import start_cluster

    llm = make_server(ScriptedEngine(reply), "agentflow", "scripted")
    serve_in_background(llm)
    cluster = start_cluster(log_dir=tmp_path_factory.mktemp("guard-logs"),
                            llm_url=f"http://127.0.0.1:{llm.server_address[1]}/v1",
                            env={"AGENTFLOW_LOOP_MAX_STEPS": "2", "AGENTFLOW_LOOP_MAX_TIME_S": "300",
                                 "AGENTFLOW_GATEWAY_API_KEYS": "test-key"},
                            progress=lambda *_: None)
    yield cluster
    cluster.stop()
    llm.shutdown()


def test_a_stage_that_fails_for_good_ends_its_trajectory_at_once(ring):
    with grpc.insecure_channel(ring.endpoint("gateway")) as ch:
        stub = gateway_pb2_grpc.AgentFlowStub(ch)
        started = time.monotonic()
        response = stub.Solve(gateway_pb2.SolveRequest(query=f"{POISON}: what is 2 + 2?",
                                                       options=events_pb2.QueryOptions(max_time_s=300)),
                              timeout=60, metadata=KEY)  # its deadline is 300 s (+ the gateway's grace) away
        took = time.monotonic() - started
        assert stub.Solve(gateway_pb2.SolveRequest(query="what is 3 + 3?"), timeout=120,
                          metadata=KEY).status == "answered"  # and the ring goes on
    print(f"\nthe poisoned trajectory ended in {took:.1f} s: {response.error[:160]}")
    assert response.status == "error" and not response.answer
    assert response.error.startswith("stage_failed: planner gave up on the memory event of step 0 after 1 attempt")
    assert "RecordTooLarge" in response.error
    token = ring.env.get("AGENTFLOW_RPC_SERVICE_TOKEN", "")
    with channel(ring.endpoint("memory"), token=token) as ch:  # its state is no longer in flight
        state = modules_pb2_grpc.MemoryStub(ch).Get(
            modules_pb2.MemoryGetRequest(trajectory_id=response.trajectory_id), timeout=10)
    assert state.finished and state.trajectory.status == "error"


def test_internal_grpc_needs_the_run_s_service_token(ring, tmp_path, monkeypatch):
    from agentflow.services.cluster import _write_state, state_path

    token = ring.env.get("AGENTFLOW_RPC_SERVICE_TOKEN", "")
    request = modules_pb2.MemoryGetRequest(trajectory_id="nope")
    for given in ("", "wrong"):
        with channel(ring.endpoint("memory"), token=given) as ch:
            with pytest.raises(grpc.RpcError) as info:
                modules_pb2_grpc.MemoryStub(ch).Get(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, given
    with channel(ring.endpoint("memory"), token=token) as ch:
        with pytest.raises(grpc.RpcError) as info:
            modules_pb2_grpc.MemoryStub(ch).Get(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND  # let in: no such trajectory
    assert len(token) >= 32 and not any(token in " ".join(child.args) for child in ring.children)  # not in argv

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    _write_state(ring)  # what `up` writes for the operator
    assert state_path().stat().st_mode & 0o777 == 0o600
    assert json.loads(state_path().read_text())["service_token"] == token


def test_eval_through_the_gateway_scores_the_ring_s_answers(ring, tmp_path, capsys):
    """`agentflow eval --gateway`: the ring answers (its scripted planner says 42 to everything), the gold answers
    stay with the eval, and the queries go as opted-out traffic."""
    from agentflow import cli

    data = tmp_path / "set.json"
    data.write_text(json.dumps([{"pid": "a", "query": "What is 6 * 7?", "answer": "42"},
                                {"pid": "b", "query": "What is 40 + 2?", "answer": "42"},
                                {"pid": "c", "query": "What is 3 + 4?", "answer": "7"}]))
    out = tmp_path / "run"
    argv = ["eval", "--data", str(data), "--kind", "math", "--out", str(out), "--no-progress", "--gateway",
            ring.endpoint("gateway"), "--max-time", "60"]
    assert cli.main([*argv, "--gateway-api-key", "test-key"]) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted((r["pid"], r["correct"], r["status"]) for r in rows) == [
        ("a", True, "answered"), ("b", True, "answered"), ("c", False, "answered")]
    for row in rows:  # the ring's own records: its trajectory ids, no gold answer, never to be trained on
        record = row["record"]
        assert record["turns"] and not record["ground_truth"] and record["train_ok"] is False
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["engine"] == "gateway" and summary["run"]["gateway"] == ring.endpoint("gateway")
    capsys.readouterr()
    assert cli.main([*argv[:6], str(tmp_path / "refused"), *argv[7:], "--gateway-api-key", "wrong"]) == 0
    refused = [json.loads(line) for line in (tmp_path / "refused" / "results.jsonl").read_text().splitlines()]
    assert {r["status"] for r in refused} == {"invalid"} and "UNAUTHENTICATED" in refused[0]["error"]
