"""The deployables, one folder each; the module services share ``StageService``."""

from __future__ import annotations

from agentflow.bus.codec import new_envelope
from agentflow.llm.base import llm_priority
from agentflow.proto.v1 import events_pb2


class StageService:
    """A stateless stage of the ring: one input payload in, one output payload out, the same operation over Kafka
    (``handle``) and over gRPC. Subclasses name the topics and the payload field, and implement ``run``."""

    name: str
    input_topics: tuple[str, ...]
    input_field: str  # the Envelope payload this stage takes
    output_topic: str

    def __init__(self, agent):
        self.agent = agent

    def handle(self, envelope: events_pb2.Envelope) -> list[tuple[str, events_pb2.Envelope]]:
        payload = getattr(envelope, self.input_field)
        with llm_priority(payload.options.background):  # a training rollout's calls yield to users'
            result = self.run(envelope.trajectory_id, payload)
        return [(self.output_topic, new_envelope(envelope.trajectory_id, envelope.step, result))]

    def run(self, trajectory_id: str, payload):
        raise NotImplementedError


def carry_analysis(source, target) -> None:
    """Pass the planner's query analysis (made at step 0 only) on to the next event, for the memory service."""
    if source.HasField("analysis_call"):
        target.analysis_call.CopyFrom(source.analysis_call)
