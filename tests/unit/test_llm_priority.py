"""Training yields to users at the LLM servers: a ring service handles a training rollout's event with the LLM
priority set (``agentflow.llm.base.PRIORITY``), and users' events without it. The engine's side:
tests/unit/test_openai_engine.py; on a real vLLM: bench/llm_priority.py."""

from __future__ import annotations

from agentflow.llm.base import BACKGROUND, PRIORITY
from agentflow.proto.v1 import events_pb2
from services import StageService


class Recording(StageService):
    name, input_field, output_topic, input_topics = "recording", "plan", "executions", ("plans",)

    def __init__(self):
        super().__init__(agent=None)
        self.seen = []

    def run(self, trajectory_id, plan):
        self.seen.append(PRIORITY.get())  # what every LLM call made here would send
        return events_pb2.Execution(options=plan.options)


def test_a_training_rollouts_event_is_handled_in_the_background_and_a_users_is_not():
    service = Recording()
    for background in (True, False, True):
        plan = events_pb2.Plan(options=events_pb2.QueryOptions(background=background))
        service.handle(events_pb2.Envelope(trajectory_id="t", step=0, stage="plan", plan=plan))
    assert service.seen == [BACKGROUND, 0, BACKGROUND]
    assert PRIORITY.get() == 0  # nothing leaks into what the thread does next
