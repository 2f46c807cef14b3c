from agentflow.proto.v1 import events_pb2 as _events_pb2
from agentflow.proto.v1 import trajectory_pb2 as _trajectory_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PlanV1(_message.Message):
    __slots__ = ("step", "planner", "decision", "parse_error", "memory", "options", "deadline_unix_ms", "duration_s", "analysis_call")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PLANNER_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    PARSE_ERROR_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    ANALYSIS_CALL_FIELD_NUMBER: _ClassVar[int]
    step: int
    planner: _trajectory_pb2.LLMCall
    decision: _trajectory_pb2.Decision
    parse_error: str
    memory: _trajectory_pb2.MemorySnapshot
    options: _events_pb2.QueryOptions
    deadline_unix_ms: int
    duration_s: float
    analysis_call: _trajectory_pb2.LLMCall
    def __init__(self, step: _Optional[int] = ..., planner: _Optional[_Union[_trajectory_pb2.LLMCall, _Mapping]] = ..., decision: _Optional[_Union[_trajectory_pb2.Decision, _Mapping]] = ..., parse_error: _Optional[str] = ..., memory: _Optional[_Union[_trajectory_pb2.MemorySnapshot, _Mapping]] = ..., options: _Optional[_Union[_events_pb2.QueryOptions, _Mapping]] = ..., deadline_unix_ms: _Optional[int] = ..., duration_s: _Optional[float] = ..., analysis_call: _Optional[_Union[_trajectory_pb2.LLMCall, _Mapping]] = ...) -> None: ...

class ExecutionV1(_message.Message):
    __slots__ = ("step", "plan", "command", "executor", "result", "tool_error", "tool_error_kind", "duration_s")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    TOOL_ERROR_FIELD_NUMBER: _ClassVar[int]
    TOOL_ERROR_KIND_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    step: int
    plan: PlanV1
    command: str
    executor: _trajectory_pb2.LLMCall
    result: str
    tool_error: str
    tool_error_kind: str
    duration_s: float
    def __init__(self, step: _Optional[int] = ..., plan: _Optional[_Union[PlanV1, _Mapping]] = ..., command: _Optional[str] = ..., executor: _Optional[_Union[_trajectory_pb2.LLMCall, _Mapping]] = ..., result: _Optional[str] = ..., tool_error: _Optional[str] = ..., tool_error_kind: _Optional[str] = ..., duration_s: _Optional[float] = ...) -> None: ...

class VerdictV1(_message.Message):
    __slots__ = ("step", "execution", "verdict", "analysis", "verifier", "duration_s", "memory")
    STEP_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    ANALYSIS_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    step: int
    execution: ExecutionV1
    verdict: str
    analysis: str
    verifier: _trajectory_pb2.LLMCall
    duration_s: float
    memory: _trajectory_pb2.MemorySnapshot
    def __init__(self, step: _Optional[int] = ..., execution: _Optional[_Union[ExecutionV1, _Mapping]] = ..., verdict: _Optional[str] = ..., analysis: _Optional[str] = ..., verifier: _Optional[_Union[_trajectory_pb2.LLMCall, _Mapping]] = ..., duration_s: _Optional[float] = ..., memory: _Optional[_Union[_trajectory_pb2.MemorySnapshot, _Mapping]] = ...) -> None: ...
