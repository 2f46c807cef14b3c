"""The in-process loop with scripted engines: control flow, limits, errors and the record it produces."""

import threading
import time

import pytest
from google.protobuf import json_format

from agentflow.errors import EngineError, EngineTimeout, InvalidInput
from agentflow.domain import trajectory
from agentflow.flow.loop import Agent, LoopConfig
from agentflow.llm.base import Completion, Sampling
from agentflow.llm.scripted import ScriptedEngine
from agentflow.modules.executor import Executor
from agentflow.modules.generator import Generator
from agentflow.modules.planner import Planner
from agentflow.modules.verifier import Verifier
from agentflow.proto.v1 import trajectory_pb2
from agentflow.tools.base import ToolResult, ToolSpec

TASKS = {"Analyse the question": "analyze", "Choose the next step": "plan", "Write the input": "command",
         "Is this enough": "verify", "Answer the question": "answer"}


def module_of(messages) -> str:
    return next(name for key, name in TASKS.items() if key in messages[-1]["content"])


def scripted(**replies) -> ScriptedEngine:
    """An engine answering each module from ``replies[module]`` (a string, or a list replayed in order)."""
    queues = {k: list(v) if isinstance(v, list) else [v] for k, v in replies.items()}

    def respond(messages):
        q = queues[module_of(messages)]
        return q.pop(0) if len(q) > 1 else q[0]

    return ScriptedEngine(respond)


class EchoTool:
    spec = ToolSpec("calc", "evaluates arithmetic", "an expression")

    def __init__(self, delay: float = 0.0):
        self.delay = delay

    def run(self, command: str, timeout: float) -> ToolResult:
        if self.delay > timeout:
            time.sleep(timeout)
            return ToolResult(error=f"timeout: ran past {timeout:.2f} s")
        time.sleep(self.delay)
        return ToolResult(output=f"value of {command}")


def make_agent(engine, tool=None, **loop) -> Agent:
    tool = tool or EchoTool()
    s = Sampling()
    return Agent(Planner(engine, s, tools=(tool.spec,)), Executor(engine, s, tools={"calc": tool}),
                 Verifier(engine, s), Generator(engine, s), LoopConfig(**loop))


GOOD = dict(analyze="Needs arithmetic.", plan="Context: none\nSub-Goal: multiply\nTool Name: calc",
            command="Command: 6*7", verify="Analysis: done\nConclusion: STOP", answer="Answer: 42")


def check_record(record: dict) -> None:
    trajectory.validate(record)
    json_format.ParseDict(record, trajectory_pb2.Trajectory())  # the JSON and the proto agree


def test_one_step_to_stop():
    events = []
    record = make_agent(scripted(**GOOD)).solve(
        "What is 6*7?", ground_truth="42",
        on_event=lambda stage, p: events.append(f"{p['module']}:{p['step']}" if stage == "stage" else stage))
    check_record(record)
    assert record["status"] == "answered" and record["answer"] == "42"
    turn = record["turns"][0]
    assert turn["decision"] == {"sub_goal": "multiply", "tool": "calc", "context": "none"}
    assert turn["command"] == "6*7" and turn["result"] == "value of 6*7" and turn["verdict"] == "STOP"
    assert record["memory"]["steps"][0]["verdict"] == "STOP" and record["analysis"] == "Needs arithmetic."
    assert events == ["planner:0", "analysis", "planner:1", "executor:1", "verifier:1", "turn", "generator:1", "answer"]
    assert record["totals"]["turns"] == 1 and record["ground_truth"] == "42"


def test_max_steps_is_enforced():
    engine = scripted(**{**GOOD, "verify": "Analysis: not yet\nConclusion: CONTINUE"})
    record = make_agent(engine, max_steps=3).solve("q")
    check_record(record)
    assert record["status"] == "max_steps" and len(record["turns"]) == 3
    assert [t["step"] for t in record["turns"]] == [0, 1, 2]
    assert record["answer"] == "42"  # the generator still answers


def test_unreadable_plan_is_recorded_and_the_loop_continues():
    engine = scripted(**{**GOOD, "plan": ["I refuse to follow formats.", "Sub-Goal: go\nTool Name: Time_Machine",
                                          GOOD["plan"]]})
    record = make_agent(engine, max_steps=5).solve("q")
    check_record(record)
    errors = [t["parse_error"] for t in record["turns"]]
    assert "no tool" in errors[0] and "unknown tool 'Time_Machine'" in errors[1] and errors[2] == ""
    assert record["status"] == "answered" and len(record["turns"]) == 3
    assert record["memory"]["steps"][0]["error"].startswith("parse_error:")


def test_unreadable_verdict_means_continue():
    engine = scripted(**{**GOOD, "verify": ["maybe?", GOOD["verify"]]})
    record = make_agent(engine).solve("q")
    assert [t["verdict"] for t in record["turns"]] == ["CONTINUE", "STOP"]
    assert record["turns"][0]["verifier_analysis"].startswith("parse_error:")


class SlowEngine(ScriptedEngine):
    """Takes ``delay`` seconds per call and honours the timeout it is given, like a real client."""

    def __init__(self, delay: float, **replies):
        super().__init__(scripted(**replies)._respond)
        self.delay = delay

    def complete(self, messages, sampling, *, timeout, json_schema=None, key=""):
        if self.delay > timeout:
            time.sleep(timeout)
            raise EngineTimeout("slow")
        time.sleep(self.delay)
        return super().complete(messages, sampling, timeout=timeout)


def test_max_time_cuts_a_slow_step_and_still_answers_in_time():
    agent = make_agent(SlowEngine(0.3, **{**GOOD, "verify": "Conclusion: CONTINUE"}), max_steps=50, max_time_s=2.0)
    started = time.monotonic()
    record = agent.solve("q")
    elapsed = time.monotonic() - started
    check_record(record)
    assert record["status"] == "timeout" and elapsed < 2.0 + 0.2
    assert 0 < len(record["turns"]) < 50


def test_a_slow_tool_is_cut_off_by_the_deadline():
    agent = make_agent(scripted(**GOOD), tool=EchoTool(delay=60), max_time_s=1.0)
    started = time.monotonic()
    record = agent.solve("q")
    assert time.monotonic() - started < 1.3
    assert record["turns"][0]["tool_error"].startswith("timeout")


def test_generator_timeout_falls_back_to_the_last_result():
    engine = SlowEngine(0.0, **GOOD)
    agent = make_agent(engine, max_time_s=1.0)
    agent.generator.engine = SlowEngine(5.0, **GOOD)
    record = agent.solve("q")
    assert record["status"] == "timeout" and record["answer"] == "value of 6*7"
    check_record(record)


class RefusingEngine:
    supports_structured_output = False

    def complete(self, *a, **k) -> Completion:
        raise EngineError("http://127.0.0.1:9/v1: cannot reach the server (ConnectError)")


def test_unreachable_engine_raises_a_typed_error_with_the_partial_record():
    with pytest.raises(EngineError, match="cannot reach") as info:
        make_agent(RefusingEngine()).solve("q")
    record = info.value.record
    assert record["status"] == "error" and "cannot reach" in record["error"]
    check_record(record)


@pytest.mark.parametrize("query,message", [("", "empty"), ("   \n", "empty"), ("x" * 70_000, "70000 bytes"),
                                           (b"bytes", "must be text")])
def test_bad_queries_are_refused(query, message):
    with pytest.raises(InvalidInput, match=message):
        make_agent(scripted(**GOOD)).solve(query)


def test_bad_loop_settings_name_the_setting():
    with pytest.raises(InvalidInput, match="max_steps"):
        LoopConfig(max_steps=0)
    with pytest.raises(InvalidInput, match="max_time_s"):
        LoopConfig(max_time_s=-1)


def test_memory_is_compacted_on_long_runs():
    class BigTool(EchoTool):
        def run(self, command, timeout):
            return ToolResult(output="fact " * 400)

    engine = scripted(**{**GOOD, "verify": "Conclusion: CONTINUE"})
    record = make_agent(engine, tool=BigTool(), max_steps=6, memory_budget_tokens=600).solve("q")
    assert record["memory"]["compacted_steps"] > 0
    # every prompt the planner saw stayed near the budget (prompt scaffolding adds a little)
    check_record(record)


def test_solves_run_concurrently_on_one_agent():
    agent = make_agent(scripted(**GOOD))
    records = []
    threads = [threading.Thread(target=lambda: records.append(agent.solve("q"))) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len({r["trajectory_id"] for r in records}) == 8 and all(r["status"] == "answered" for r in records)


def test_non_finite_logprobs_are_left_out_of_the_record():
    from agentflow.domain.trajectory import llm_call
    from agentflow.llm.base import Completion

    bad = llm_call(Completion(text="x", prompt_token_ids=[1], token_ids=[2, 3], logprobs=[-0.1, float("nan")]))
    good = llm_call(Completion(text="x", prompt_token_ids=[1], token_ids=[2, 3], logprobs=[-0.1, -2.0]))
    assert bad["logprobs"] == [] and bad["token_ids"] == [2, 3] and good["logprobs"] == [-0.1, -2.0]


def test_next_action_is_the_loops_one_rule():
    from agentflow.domain.deadline import Deadline
    from agentflow.flow.stages import CONTINUE, next_action

    time_left, spent = Deadline(60), Deadline(0)
    assert next_action(0, 3, time_left) == CONTINUE
    assert next_action(2, 3, time_left, "CONTINUE") == CONTINUE
    assert next_action(3, 3, time_left, "CONTINUE") == "max_steps"
    assert next_action(3, 3, spent, "STOP") == "stop"  # a STOP counts even on the last turn, after the deadline
    assert next_action(1, 3, spent, "CONTINUE") == "timeout"
    assert next_action(3, 3, spent) == "max_steps"  # turns used up is the reason before time
