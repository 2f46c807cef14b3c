from agentflow.proto.v1 import events_pb2 as _events_pb2
from agentflow.proto.v1 import trajectory_pb2 as _trajectory_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PlanRequest(_message.Message):
    __slots__ = ("trajectory_id", "state")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    state: _events_pb2.MemoryUpdated
    def __init__(self, trajectory_id: _Optional[str] = ..., state: _Optional[_Union[_events_pb2.MemoryUpdated, _Mapping]] = ...) -> None: ...

class PlanResponse(_message.Message):
    __slots__ = ("plan",)
    PLAN_FIELD_NUMBER: _ClassVar[int]
    plan: _events_pb2.Plan
    def __init__(self, plan: _Optional[_Union[_events_pb2.Plan, _Mapping]] = ...) -> None: ...

class ExecuteRequest(_message.Message):
    __slots__ = ("trajectory_id", "plan")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    plan: _events_pb2.Plan
    def __init__(self, trajectory_id: _Optional[str] = ..., plan: _Optional[_Union[_events_pb2.Plan, _Mapping]] = ...) -> None: ...

class ExecuteResponse(_message.Message):
    __slots__ = ("execution",)
    EXECUTION_FIELD_NUMBER: _ClassVar[int]
    execution: _events_pb2.Execution
    def __init__(self, execution: _Optional[_Union[_events_pb2.Execution, _Mapping]] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("trajectory_id", "execution")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    execution: _events_pb2.Execution
    def __init__(self, trajectory_id: _Optional[str] = ..., execution: _Optional[_Union[_events_pb2.Execution, _Mapping]] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("verdict",)
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    verdict: _events_pb2.Verdict
    def __init__(self, verdict: _Optional[_Union[_events_pb2.Verdict, _Mapping]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("trajectory_id", "finalize")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    FINALIZE_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    finalize: _events_pb2.Finalize
    def __init__(self, trajectory_id: _Optional[str] = ..., finalize: _Optional[_Union[_events_pb2.Finalize, _Mapping]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("answer",)
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    answer: _events_pb2.Answer
    def __init__(self, answer: _Optional[_Union[_events_pb2.Answer, _Mapping]] = ...) -> None: ...

class MemoryGetRequest(_message.Message):
    __slots__ = ("trajectory_id",)
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    def __init__(self, trajectory_id: _Optional[str] = ...) -> None: ...

class MemoryGetResponse(_message.Message):
    __slots__ = ("trajectory", "finished")
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    trajectory: _trajectory_pb2.Trajectory
    finished: bool
    def __init__(self, trajectory: _Optional[_Union[_trajectory_pb2.Trajectory, _Mapping]] = ..., finished: _Optional[bool] = ...) -> None: ...

class MemoryListRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "group_id", "status")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    group_id: str
    status: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., group_id: _Optional[str] = ..., status: _Optional[str] = ...) -> None: ...

class TrajectorySummary(_message.Message):
    __slots__ = ("trajectory_id", "group_id", "query", "status", "turns", "started_at_unix", "finished")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    group_id: str
    query: str
    status: str
    turns: int
    started_at_unix: float
    finished: bool
    def __init__(self, trajectory_id: _Optional[str] = ..., group_id: _Optional[str] = ..., query: _Optional[str] = ..., status: _Optional[str] = ..., turns: _Optional[int] = ..., started_at_unix: _Optional[float] = ..., finished: _Optional[bool] = ...) -> None: ...

class MemoryListResponse(_message.Message):
    __slots__ = ("trajectories", "next_page_token")
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    trajectories: _containers.RepeatedCompositeFieldContainer[TrajectorySummary]
    next_page_token: str
    def __init__(self, trajectories: _Optional[_Iterable[_Union[TrajectorySummary, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
