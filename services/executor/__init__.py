"""The executor service: plans -> executions (also ``Executor.Execute`` over gRPC).

It writes the tool command and runs the tool under the query's deadline. A plan without a decision passes through.
"""

from __future__ import annotations

from agentflow.bus import topics
from agentflow.errors import EngineError
from agentflow.flow import stages
from agentflow.domain.convert import deadline_from_ms
from agentflow.proto.v1 import events_pb2, modules_pb2, modules_pb2_grpc
from agentflow.services import StageService, carry_analysis

GRPC_SERVICE = "agentflow.v1.Executor"


class ExecutorService(StageService, modules_pb2_grpc.ExecutorServicer):
    name = "executor"
    input_field = "plan"
    output_topic = topics.EXECUTIONS
    input_topics = (topics.PLANS,)

    def register(self, server) -> None:
        modules_pb2_grpc.add_ExecutorServicer_to_server(self, server)

    def Execute(self, request: modules_pb2.ExecuteRequest, context) -> modules_pb2.ExecuteResponse:
        return modules_pb2.ExecuteResponse(execution=self.run(request.trajectory_id, request.plan))

    def run(self, tid: str, plan: events_pb2.Plan) -> events_pb2.Execution:
        execution = events_pb2.Execution(turn=plan.turn, memory=plan.memory, options=plan.options,
                                         deadline_unix_ms=plan.deadline_unix_ms)
        carry_analysis(plan, execution)
        try:
            stages.execute(self.agent.executor, plan.memory.query, execution.turn,
                           deadline_from_ms(plan.deadline_unix_ms), tid)
        except EngineError as e:
            execution.turn.tool_error = f"{e.reason}: {e}"
        return execution
