"""``agentflow eval --gateway HOST:PORT``: the items go to a running deployment's gateway instead of an in-process
agent. The deployment decides the engines, tools and versions; each answer is scored here, against the gold answer
the gateway never sees. The queries are sent as opted-out traffic (``train_ok`` false): an evaluation set must not
become training data."""

from __future__ import annotations

import grpc

from agentflow.errors import EngineError, EngineTimeout, InvalidInput

GRACE_S = 30.0  # beyond the query's own deadline: queueing in the ring and the answer's trip back

# gRPC codes that say the request itself was refused, not that the deployment failed on it
_REFUSED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}


class GatewaySolver:
    """A ``Solver`` (``agentflow.eval.runner``) backed by the gateway's ``Solve``; safe to call from many threads."""

    def __init__(self, address: str, *, max_steps: int = 0, max_time_s: float = 0.0, api_key: str = "",
                 timeout_s: float = 600.0):
        from agentflow.rpc.client import channel

        self.address, self.max_steps, self.max_time_s = address, max_steps, max_time_s
        self.timeout_s = max_time_s + GRACE_S if max_time_s else timeout_s
        self.metadata = [("x-api-key", api_key)] if api_key else []
        self._channel = channel(address)

    def solve(self, query: str, *, ground_truth: str = "", source: str = "traffic", group_id: str = "",
              trajectory_id: str = "", on_event=None) -> dict:
        """The deployment's trajectory record for ``query``; ``ground_truth``, ``source`` and ``group_id`` stay
        here (they would need the gateway's ``train`` scope, and teach the planner)."""
        from agentflow.domain.convert import record_from_proto
        from agentflow.proto.v1 import events_pb2, gateway_pb2, gateway_pb2_grpc

        request = gateway_pb2.SolveRequest(query=query, train_ok=False, options=events_pb2.QueryOptions(
            max_steps=self.max_steps, max_time_s=self.max_time_s))
        try:
            response = gateway_pb2_grpc.AgentFlowStub(self._channel).Solve(
                request, timeout=self.timeout_s, metadata=self.metadata)
        except grpc.RpcError as e:
            message = f"gateway {self.address}: {e.code().name}: {e.details()}"
            if e.code() in _REFUSED:
                raise InvalidInput(message) from None
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise EngineTimeout(message) from None
            raise EngineError(message) from None
        return record_from_proto(response.trajectory)

    def close(self) -> None:
        self._channel.close()
