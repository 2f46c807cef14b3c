"""The contracts: generated code is current, messages round-trip, the trajectory JSON shape parses."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from google.protobuf import json_format

from agentflow.proto.v1 import (
    events_pb2,
    events_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
    modules_pb2,
    modules_pb2_grpc,
    trajectory_pb2,
    trajectory_pb2_grpc,
)

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "agentflow" / "proto" / "v1"


def _load_gen_protos():
    spec = importlib.util.spec_from_file_location("gen_protos", REPO / "scripts" / "gen_protos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_generated_code_matches_protos(tmp_path):
    _load_gen_protos().generate(tmp_path)
    fresh, committed = _files(tmp_path), _files(COMMITTED)
    hint = "generated code is stale: run python scripts/gen_protos.py"
    assert sorted(fresh) == sorted(committed), f"{hint} (file sets differ: {sorted(set(fresh) ^ set(committed))})"
    stale = [name for name in sorted(fresh) if fresh[name] != committed[name]]
    assert not stale, f"{hint} (differs: {stale})"


def test_generation_is_deterministic(tmp_path):
    gen = _load_gen_protos()
    gen.generate(tmp_path / "a")
    gen.generate(tmp_path / "b")
    assert _files(tmp_path / "a") == _files(tmp_path / "b")


def test_all_modules_import_and_envelope_round_trips():
    assert all(m is not None for m in (events_pb2_grpc, trajectory_pb2_grpc, gateway_pb2, modules_pb2))
    turn = trajectory_pb2.Turn(
        step=2,
        planner=trajectory_pb2.LLMCall(
            text='{"sub_goal": "look it up", "tool": "web_search", "context": "Paris"}',
            prompt_token_ids=[1, 2, 3],
            token_ids=[7, 8],
            logprobs=[-0.5, -1.25],
            model_version="planner-v3",
            finish_reason="stop",
            latency_s=0.2,
        ),
        decision=trajectory_pb2.Decision(sub_goal="look it up", tool="web_search", context="Paris"),
    )
    plan = events_pb2.Plan(
        turn=turn,
        memory=trajectory_pb2.MemorySnapshot(query="population of Paris?", compacted_steps=0),
        options=events_pb2.QueryOptions(max_steps=3, tools=["web_search"], temperature=0.0),
        deadline_unix_ms=1_700_000_000_000,
    )
    env = events_pb2.Envelope(
        event_id="t-1:2:plan",
        trajectory_id="t-1",
        step=2,
        stage="plan",
        produced_at_unix_ms=1_700_000_000_123,
        schema_version=2,
        plan=plan,
    )
    back = events_pb2.Envelope.FromString(env.SerializeToString())
    assert back == env
    assert back.WhichOneof("payload") == "plan"
    assert back.plan.turn.planner.token_ids == [7, 8]
    assert back.plan.turn.planner.logprobs == [-0.5, -1.25]
    assert back.plan.turn.decision.tool == "web_search"
    # temperature is `optional`: an explicit 0 is kept apart from "unset".
    assert back.plan.options.HasField("temperature") and back.plan.options.temperature == 0.0
    assert not events_pb2.QueryOptions().HasField("temperature")


def test_envelope_oneof_covers_every_payload():
    oneof = events_pb2.Envelope.DESCRIPTOR.oneofs_by_name["payload"]
    assert {f.message_type.name for f in oneof.fields} == {
        "Query", "MemoryUpdated", "Plan", "Execution", "Verdict", "Finalize", "Answer",
        "Trajectory", "Feedback", "PlannerVersion", "DeadLetter", "MemoryState", "RolloutDecision", "Cancel",
        "PlannerRouting", "TrainerProgress",
    }


def _llm_call(text: str, version: str) -> dict:
    return {
        "text": text,
        "prompt_token_ids": [101, 102, 103],
        "token_ids": [5, 6],
        "logprobs": [-0.1, -2.5],
        "model_version": version,
        "finish_reason": "stop",
        "latency_s": 0.35,
    }


SAMPLE_TRAJECTORY = {
    "schema_version": 1,
    "trajectory_id": "traj-42",
    "group_id": "grp-7",
    "query": "What is 6 times 7?",
    "ground_truth": "42",
    "source": "training",
    "analysis": "A multiplication; the calculator will do.",
    "status": "answered",
    "answer": "42",
    "error": "",
    "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
    "started_at_unix": 1700000000.25,
    "train_ok": True,
    "owner": "app",
    "turns": [
        {
            "step": 0,
            "planner": _llm_call('{"sub_goal": "multiply", "tool": "calculator"}', "planner-v3"),
            "decision": {"sub_goal": "multiply", "tool": "calculator", "context": "6 * 7"},
            "parse_error": "",
            "command": "6 * 7",
            "executor": _llm_call("6 * 7", "frozen-1"),
            "result": "42",
            "tool_error": "",
            "verdict": "STOP",
            "verifier_analysis": "The result answers the query.",
            "timings": {"plan_s": 0.4, "execute_s": 0.1, "verify_s": 0.3, "total_s": 0.8},
            "verifier": _llm_call("Conclusion: STOP", "frozen-1"),
        }
    ],
    "memory": {
        "query": "What is 6 times 7?",
        "analysis": "A multiplication; the calculator will do.",
        "summary": "",
        "steps": [
            {
                "step": 0,
                "sub_goal": "multiply",
                "tool": "calculator",
                "command": "6 * 7",
                "result": "42",
                "error": "",
                "verdict": "STOP",
            }
        ],
        "compacted_steps": 0,
    },
    "rewards": [{"value": 1.0, "source": "rule", "detail": "exact match", "author": ""}],
    "totals": {"turns": 1, "prompt_tokens": 9, "completion_tokens": 6, "latency_s": 1.1},
    "analysis_call": _llm_call("A multiplication; the calculator will do.", "planner-v3"),
    "generator": _llm_call("Answer: 42", "frozen-1"),
}


def test_trajectory_json_shape_parses():
    traj = json_format.ParseDict(SAMPLE_TRAJECTORY, trajectory_pb2.Trajectory(), ignore_unknown_fields=False)
    back = json_format.MessageToDict(traj, preserving_proto_field_name=True)
    assert back["trajectory_id"] == "traj-42"
    assert back["started_at_unix"] == 1700000000.25
    assert back["turns"][0]["planner"]["token_ids"] == [5, 6]  # int32: JSON numbers, not strings
    assert back["turns"][0]["planner"]["logprobs"] == [-0.1, -2.5]
    assert back["turns"][0]["decision"]["tool"] == "calculator"
    assert back["turns"][0]["timings"]["total_s"] == 0.8
    assert back["memory"]["steps"][0]["verdict"] == "STOP"
    assert back["rewards"] == [{"value": 1.0, "source": "rule", "detail": "exact match"}]
    assert back["totals"]["prompt_tokens"] == 9


def test_every_trajectory_field_is_in_the_sample():
    """Keeps SAMPLE_TRAJECTORY complete when a field is added to the proto."""

    def missing(descriptor, sample: dict, path: str) -> list[str]:
        out = []
        for field in descriptor.fields:
            if field.name not in sample:
                out.append(path + field.name)
            elif field.message_type is not None:
                value = sample[field.name]
                for item in value if isinstance(value, list) else [value]:
                    out += missing(field.message_type, item, f"{path}{field.name}.")
        return out

    assert missing(trajectory_pb2.Trajectory.DESCRIPTOR, SAMPLE_TRAJECTORY, "") == []


def test_trajectory_json_rejects_unknown_keys():
    with pytest.raises(json_format.ParseError):
        json_format.ParseDict({**SAMPLE_TRAJECTORY, "not_a_field": 1}, trajectory_pb2.Trajectory())


def _methods(pb2_module, service: str) -> dict[str, tuple[str, str, bool]]:
    svc = pb2_module.DESCRIPTOR.services_by_name[service]
    return {m.name: (m.input_type.name, m.output_type.name, m.server_streaming) for m in svc.methods}


def test_gateway_service_methods():
    assert _methods(gateway_pb2, "AgentFlow") == {
        "Solve": ("SolveRequest", "SolveResponse", False),
        "SolveStream": ("SolveRequest", "StepEvent", True),
        "Feedback": ("FeedbackRequest", "FeedbackResponse", False),
    }
    assert hasattr(gateway_pb2_grpc, "AgentFlowStub") and hasattr(gateway_pb2_grpc, "add_AgentFlowServicer_to_server")


def test_module_service_methods():
    assert {name: set(_methods(modules_pb2, name)) for name in modules_pb2.DESCRIPTOR.services_by_name} == {
        "Planner": {"Plan"},
        "Executor": {"Execute"},
        "Verifier": {"Verify"},
        "Generator": {"Generate"},
        "Memory": {"Get", "List"},
    }
    for name in ("Planner", "Executor", "Verifier", "Generator", "Memory"):
        assert hasattr(modules_pb2_grpc, f"{name}Stub")
        assert hasattr(modules_pb2_grpc, f"add_{name}Servicer_to_server")
