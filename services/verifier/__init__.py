"""The verifier service: executions -> verdicts (also ``Verifier.Verify`` over gRPC).

It adds the turn's step to the memory it came with (M_{t+1}, compacted the way the in-process loop does) and judges
STOP or CONTINUE; the verdict carries M_{t+1} on to the memory service.
"""

from __future__ import annotations

from agentflow.bus import topics
from agentflow.errors import EngineError
from agentflow.flow import stages
from agentflow.domain.convert import deadline_from_ms
from agentflow.domain.memory import Memory
from agentflow.proto.v1 import events_pb2, modules_pb2, modules_pb2_grpc
from agentflow.services import StageService, carry_analysis

GRPC_SERVICE = "agentflow.v1.Verifier"


class VerifierService(StageService, modules_pb2_grpc.VerifierServicer):
    name = "verifier"
    input_field = "execution"
    output_topic = topics.VERDICTS
    input_topics = (topics.EXECUTIONS,)

    def register(self, server) -> None:
        modules_pb2_grpc.add_VerifierServicer_to_server(self, server)

    def Verify(self, request: modules_pb2.VerifyRequest, context) -> modules_pb2.VerifyResponse:
        return modules_pb2.VerifyResponse(verdict=self.run(request.trajectory_id, request.execution))

    def run(self, tid: str, execution: events_pb2.Execution) -> events_pb2.Verdict:
        verdict = events_pb2.Verdict(turn=execution.turn)
        carry_analysis(execution, verdict)
        turn, memory = verdict.turn, Memory.from_proto(execution.memory)
        config = self.agent.config
        stages.remember(memory, turn, budget_tokens=config.memory_budget_tokens, count=self.agent.count_tokens,
                        max_result_chars=config.max_result_chars)
        try:
            stages.verify(self.agent.verifier, memory, turn, deadline_from_ms(execution.deadline_unix_ms), tid)
        except EngineError as e:  # no verdict to be had: carry on, the memory service enforces the budget
            turn.verdict, turn.verifier_analysis = "CONTINUE", f"{e.reason}: {e}"
            memory.steps[-1].verdict = "CONTINUE"
        verdict.memory.CopyFrom(memory.to_proto())
        return verdict
