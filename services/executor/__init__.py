"""The executor service: plans -> executions (also ``Executor.Execute`` over gRPC).

It writes the tool command and runs the tool under the query's deadline. A plan without a decision passes through.
"""

from __future__ import annotations

from agentflow.bus import topics
from agentflow.errors import EngineError
from agentflow.flow import stages
from agentflow.flow.convert import call_to_proto, deadline_from_ms, turn_from_plan
from agentflow.proto.v1 import events_pb2, modules_pb2, modules_pb2_grpc
from agentflow.services import StageService

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
        turn = turn_from_plan(plan)
        try:
            stages.execute(self.agent.executor, plan.memory.query, turn, deadline_from_ms(plan.deadline_unix_ms), tid)
        except EngineError as e:
            turn["tool_error"] = f"{e.reason}: {e}"
        kind = turn["tool_error"].split(":", 1)[0] if turn["tool_error"] else ""
        return events_pb2.Execution(step=plan.step, plan=plan, command=turn["command"],
                                    executor=call_to_proto(turn["executor"]), result=turn["result"],
                                    tool_error=turn["tool_error"], tool_error_kind=kind,
                                    duration_s=turn["timings"]["execute_s"])
