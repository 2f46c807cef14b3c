"""A thread-safe client of the gateway's Solve and Feedback calls, for `agentflow drive`, its held-out ``evaluate``,
the demo and the learning bench."""

from __future__ import annotations


class Gateway:
    """A thread-safe Solve client."""

    def __init__(self, target: str, api_key: str = ""):
        from agentflow.proto.v1 import gateway_pb2_grpc
        from agentflow.rpc.client import channel

        self._channel = channel(target)
        self._stub = gateway_pb2_grpc.AgentFlowStub(self._channel)
        self._metadata = [("x-api-key", api_key)] if api_key else []

    def solve(self, query: str, *, answer: str = "", group_id: str = "", source: str = "traffic",
              temperature: float | None = None, max_steps: int = 3, max_time_s: float = 60.0,
              planner_version: str = "", train_ok: bool | None = None, branch: tuple[str, int] | None = None):
        """``branch``: (trajectory id, turn), a shadow branch of that finished trajectory (SolveRequest.branch)."""
        from agentflow.proto.v1 import events_pb2, gateway_pb2

        options = events_pb2.QueryOptions(max_steps=max_steps, max_time_s=max_time_s,
                                          planner_version=planner_version)
        if temperature is not None:
            options.temperature = temperature
        request = gateway_pb2.SolveRequest(query=query, options=options, ground_truth=answer, group_id=group_id,
                                           source=source, train_ok=train_ok)
        if branch is not None:
            request.branch.trajectory_id, request.branch.turn = branch
        return self._stub.Solve(request, timeout=max_time_s + 15, metadata=self._metadata)

    def feedback(self, trajectory_id: str, score: float, *, labeller: str = "", comment: str = ""):
        from agentflow.proto.v1 import gateway_pb2

        request = gateway_pb2.FeedbackRequest(trajectory_id=trajectory_id, score=score, labeller=labeller,
                                              comment=comment)
        return self._stub.Feedback(request, timeout=30, metadata=self._metadata)

    def close(self) -> None:
        self._channel.close()
