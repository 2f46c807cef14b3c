"""The planner service: memory.updated -> plans (also ``Planner.Plan`` over gRPC).

At step 0 it first analyses the query. Every plan carries the planner call's token ids, logprobs and the serving
version, which is what the trainer learns from.
"""

from __future__ import annotations

from dataclasses import replace

from agentflow.bus import topics
from agentflow.errors import EngineError
from agentflow.flow import stages
from agentflow.domain.convert import deadline_from_ms
from agentflow.domain.memory import Memory
from agentflow.llm.base import Sampling
from agentflow.modules.planner import Planner
from agentflow.proto.v1 import events_pb2, modules_pb2, modules_pb2_grpc
from agentflow.services import StageService

GRPC_SERVICE = "agentflow.v1.Planner"


class PlannerService(StageService, modules_pb2_grpc.PlannerServicer):
    name = "planner"
    input_field = "memory_updated"
    output_topic = topics.PLANS
    input_topics = (topics.MEMORY_UPDATED,)

    def register(self, server) -> None:
        modules_pb2_grpc.add_PlannerServicer_to_server(self, server)

    def prepare(self) -> None:
        """Following a routing table: wait for the first one (bounded) before consuming and reporting SERVING, so
        that no trajectory starts on the configured endpoint while the deployment routes elsewhere."""
        wait = getattr(self.agent.planner.engine, "wait_for_table", None)
        if wait is not None:
            wait()

    def Plan(self, request: modules_pb2.PlanRequest, context) -> modules_pb2.PlanResponse:
        return modules_pb2.PlanResponse(plan=self.run(request.trajectory_id, request.state))

    def run(self, tid: str, state: events_pb2.MemoryUpdated) -> events_pb2.Plan:
        planner = self._planner_for(state.options, state.planner_version)
        memory = Memory.from_proto(state.memory)
        deadline = deadline_from_ms(state.deadline_unix_ms)
        plan = events_pb2.Plan(options=state.options, deadline_unix_ms=state.deadline_unix_ms)
        try:
            stages.plan_step(planner, memory, plan, state.step, state.step + max(state.steps_left, 1), deadline, tid)
        except EngineError as e:  # recorded as this turn's error; the memory service decides what comes next
            plan.turn.parse_error = f"{e.reason}: {e}"
        plan.memory.CopyFrom(memory.to_proto())
        return plan

    def _planner_for(self, options: events_pb2.QueryOptions, version: str) -> Planner:
        """The planner with this query's sampling settings and tool subset applied, kept on the planner version
        that served the trajectory so far (``version``; "" before its first planner call)."""
        planner = self.agent.planner
        changes = {}
        if options.HasField("temperature"):
            changes["temperature"] = options.temperature
        if options.HasField("top_p"):
            changes["top_p"] = options.top_p
        if options.HasField("seed"):
            changes["seed"] = options.seed
        if options.max_tokens:
            changes["max_tokens"] = options.max_tokens
        if options.planner_version:
            changes["model_version"] = options.planner_version
        sampling: Sampling = replace(planner.sampling, **changes) if changes else planner.sampling
        tools = tuple(t for t in planner.tools if not options.tools or t.name in options.tools) or planner.tools
        return stages.keep_version(replace(planner, sampling=sampling, tools=tools), version)
