"""The generator service: finalize -> answers (also ``Generator.Generate`` over gRPC).

It answers within the query's final deadline; when no time is left, the last good tool result stands in (status
timeout), and when the engine fails the answer says so (status error) — a query always gets an answer.
"""

from __future__ import annotations

import time

from opentelemetry import trace

from agentflow.bus import topics
from agentflow.errors import EngineError, EngineTimeout
from agentflow.flow import trajectory
from agentflow.flow.convert import call_to_proto, deadline_from_ms, memory_from_proto
from agentflow.proto.v1 import events_pb2, modules_pb2, modules_pb2_grpc
from agentflow.services import StageService

GRPC_SERVICE = "agentflow.v1.Generator"
tracer = trace.get_tracer("agentflow.stages")
STATUS_BY_REASON = {"stop": "answered", "max_steps": "max_steps", "timeout": "timeout"}


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
        memory = memory_from_proto(finalize.memory)
        status = STATUS_BY_REASON.get(finalize.reason, "answered")
        started = time.monotonic()
        try:
            with tracer.start_as_current_span("generator.generate"):  # the same span as the in-process loop's
                text, completion = self.agent.generator.answer(memory, deadline_from_ms(finalize.deadline_unix_ms), tid)
            return events_pb2.Answer(answer=text, status=status, generator=call_to_proto(trajectory.llm_call(completion)),
                                     duration_s=time.monotonic() - started)
        except EngineTimeout:
            return events_pb2.Answer(answer=memory.last_result(), status="timeout", duration_s=time.monotonic() - started)
        except EngineError as e:
            return events_pb2.Answer(answer=memory.last_result(), status="error", error=f"{e.reason}: {e}",
                                     duration_s=time.monotonic() - started)

