from agentflow.proto.v1 import events_pb2 as _events_pb2
from agentflow.proto.v1 import trajectory_pb2 as _trajectory_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SolveRequest(_message.Message):
    __slots__ = ("query", "options", "ground_truth", "group_id", "source", "train_ok", "branch")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TRAIN_OK_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    query: str
    options: _events_pb2.QueryOptions
    ground_truth: str
    group_id: str
    source: str
    train_ok: bool
    branch: _events_pb2.BranchPoint
    def __init__(self, query: _Optional[str] = ..., options: _Optional[_Union[_events_pb2.QueryOptions, _Mapping]] = ..., ground_truth: _Optional[str] = ..., group_id: _Optional[str] = ..., source: _Optional[str] = ..., train_ok: _Optional[bool] = ..., branch: _Optional[_Union[_events_pb2.BranchPoint, _Mapping]] = ...) -> None: ...

class FeedbackRequest(_message.Message):
    __slots__ = ("trajectory_id", "score", "thumbs_up", "comment", "labeller")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    THUMBS_UP_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    LABELLER_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    score: float
    thumbs_up: bool
    comment: str
    labeller: str
    def __init__(self, trajectory_id: _Optional[str] = ..., score: _Optional[float] = ..., thumbs_up: _Optional[bool] = ..., comment: _Optional[str] = ..., labeller: _Optional[str] = ...) -> None: ...

class FeedbackResponse(_message.Message):
    __slots__ = ("trajectory_id", "event_id")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    event_id: str
    def __init__(self, trajectory_id: _Optional[str] = ..., event_id: _Optional[str] = ...) -> None: ...

class SolveResponse(_message.Message):
    __slots__ = ("trajectory_id", "answer", "status", "trajectory", "error")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    answer: str
    status: str
    trajectory: _trajectory_pb2.Trajectory
    error: str
    def __init__(self, trajectory_id: _Optional[str] = ..., answer: _Optional[str] = ..., status: _Optional[str] = ..., trajectory: _Optional[_Union[_trajectory_pb2.Trajectory, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class StepEvent(_message.Message):
    __slots__ = ("trajectory_id", "step", "stage", "plan", "execution", "verdict", "answer", "summary")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    step: int
    stage: str
    plan: _events_pb2.Plan
    execution: _events_pb2.Execution
    verdict: _events_pb2.Verdict
    answer: _events_pb2.Answer
    summary: str
    def __init__(self, trajectory_id: _Optional[str] = ..., step: _Optional[int] = ..., stage: _Optional[str] = ..., plan: _Optional[_Union[_events_pb2.Plan, _Mapping]] = ..., execution: _Optional[_Union[_events_pb2.Execution, _Mapping]] = ..., verdict: _Optional[_Union[_events_pb2.Verdict, _Mapping]] = ..., answer: _Optional[_Union[_events_pb2.Answer, _Mapping]] = ..., summary: _Optional[str] = ...) -> None: ...
