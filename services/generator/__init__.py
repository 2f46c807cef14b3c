"""The generator service: finalize -> answers (also ``Generator.Generate`` over gRPC).

It answers within the query's final deadline; when no time is left, the last good tool result stands in (status
timeout), and when the engine fails the answer says so (status error) — a query always gets an answer.
"""

from __future__ import annotations

import time

from agentflow.bus import topics
from agentflow.errors import EngineError
from agentflow.flow import stages
from agentflow.domain.convert import deadline_from_ms
from agentflow.domain.memory import Memory
from agentflow.proto.v1 import events_pb2, modules_pb2, modules_pb2_grpc
from agentflow.services import StageService

GRPC_SERVICE = "agentflow.v1.Generator"


class GeneratorService(StageService, modules_pb2_grpc.GeneratorServicer):
    name = "generator"
    input_field = "finalize"
    output_topic = topics.ANSWERS
    input_topics = (topics.FINALIZE,)

    def register(self, server) -> None:
        modules_pb2_grpc.add_GeneratorServicer_to_server(self, server)

    def Generate(self, request: modules_pb2.GenerateRequest, context) -> modules_pb2.GenerateResponse:
        return modules_pb2.GenerateResponse(answer=self.run(request.trajectory_id, request.finalize))

    def run(self, tid: str, finalize: events_pb2.Finalize) -> events_pb2.Answer:
        memory = Memory.from_proto(finalize.memory)
        started = time.monotonic()
        try:
            return stages.answer(self.agent.generator, memory, deadline_from_ms(finalize.deadline_unix_ms), tid,
                                 finalize.reason)
        except EngineError as e:
            return events_pb2.Answer(answer=memory.last_result(), status="error", error=f"{e.reason}: {e}",
                                     duration_s=stages.since(started))

