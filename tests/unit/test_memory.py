"""The evolving memory: JSON and proto round trips, and compaction under a token budget."""

import json

from agentflow.domain.memory import Memory, MemoryStep, approx_tokens


def _memory(n: int, result_chars: int = 200) -> Memory:
    m = Memory(query="q", analysis="a")
    for i in range(n):
        m.add(MemoryStep(step=i, sub_goal=f"goal {i}", tool="search", command=f"cmd {i}", result="r" * result_chars))
    return m


def test_round_trips_through_json():
    m = _memory(3)
    m.steps[1].error = "timeout: 5 s"
    back = Memory.from_dict(json.loads(json.dumps(m.to_dict())))
    assert back == m
    assert back.render() == m.render()


def test_round_trips_through_its_proto_message_field_for_field():
    from agentflow.domain.convert import to_dict
    from agentflow.proto.v1 import trajectory_pb2

    m = _memory(3)
    m.steps[1].error, m.steps[2].verdict = "timeout: 5 s", "STOP"
    m.compact(budget_tokens=60)
    message = m.to_proto()
    assert isinstance(message, trajectory_pb2.MemorySnapshot) and m.compacted_steps > 0
    assert to_dict(message) == m.to_dict()  # the record's dict form is the message's
    back = Memory.from_proto(trajectory_pb2.MemorySnapshot.FromString(message.SerializeToString()))
    assert back == m


def test_render_shows_errors_and_results():
    m = _memory(1, result_chars=5)
    m.add(MemoryStep(step=1, sub_goal="g", tool="python", command="x", error="runtime_error: boom"))
    text = m.render()
    assert "Result: rrrrr" in text and "Error: runtime_error: boom" in text


def test_compaction_fits_the_budget_and_keeps_the_latest_step():
    m = _memory(10)
    before = approx_tokens(m.render())
    moved = m.compact(budget_tokens=200)
    assert before > 200 and approx_tokens(m.render()) <= 200
    assert moved == m.compacted_steps > 0
    assert m.steps[-1].step == 9 and m.step_count == 10
    lines = m.summary.splitlines()
    omitted = int(lines[0].split()[0].lstrip("("))  # "(N earlier steps omitted)" once the summary itself is cut
    assert lines[0].endswith("earlier steps omitted)") and omitted + len(lines) - 1 == m.compacted_steps
    assert lines[-1].startswith("step 8 [search] goal 8 -> rrr")


def test_compaction_summarises_in_order_when_the_summary_fits():
    m = _memory(4, result_chars=300)
    m.compact(budget_tokens=250)
    assert m.summary.splitlines()[0].startswith("step 0 [search] goal 0") and m.steps[-1].step == 3


def test_compaction_is_a_no_op_within_budget():
    m = _memory(2, result_chars=10)
    assert m.compact(budget_tokens=10_000) == 0 and m.summary == "" and len(m.steps) == 2


def test_a_huge_latest_result_is_clipped():
    m = _memory(1, result_chars=50_000)
    m.compact(budget_tokens=300)
    assert approx_tokens(m.render()) <= 300 and "chars cut" in m.steps[0].result


def test_add_clips_results():
    m = Memory(query="q")
    m.add(MemoryStep(step=0, result="x" * 10_000), max_result_chars=100)
    assert len(m.steps[0].result) == 100
