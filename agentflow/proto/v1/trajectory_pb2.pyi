from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Trajectory(_message.Message):
    __slots__ = ("schema_version", "trajectory_id", "group_id", "query", "ground_truth", "source", "analysis", "status", "answer", "error", "trace_id", "started_at_unix", "turns", "memory", "rewards", "totals", "analysis_call", "generator", "train_ok", "owner")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ANALYSIS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    ANALYSIS_CALL_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_FIELD_NUMBER: _ClassVar[int]
    TRAIN_OK_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    trajectory_id: str
    group_id: str
    query: str
    ground_truth: str
    source: str
    analysis: str
    status: str
    answer: str
    error: str
    trace_id: str
    started_at_unix: float
    turns: _containers.RepeatedCompositeFieldContainer[Turn]
    memory: MemorySnapshot
    rewards: _containers.RepeatedCompositeFieldContainer[Reward]
    totals: Totals
    analysis_call: LLMCall
    generator: LLMCall
    train_ok: bool
    owner: str
    def __init__(self, schema_version: _Optional[int] = ..., trajectory_id: _Optional[str] = ..., group_id: _Optional[str] = ..., query: _Optional[str] = ..., ground_truth: _Optional[str] = ..., source: _Optional[str] = ..., analysis: _Optional[str] = ..., status: _Optional[str] = ..., answer: _Optional[str] = ..., error: _Optional[str] = ..., trace_id: _Optional[str] = ..., started_at_unix: _Optional[float] = ..., turns: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ..., memory: _Optional[_Union[MemorySnapshot, _Mapping]] = ..., rewards: _Optional[_Iterable[_Union[Reward, _Mapping]]] = ..., totals: _Optional[_Union[Totals, _Mapping]] = ..., analysis_call: _Optional[_Union[LLMCall, _Mapping]] = ..., generator: _Optional[_Union[LLMCall, _Mapping]] = ..., train_ok: _Optional[bool] = ..., owner: _Optional[str] = ...) -> None: ...

class Turn(_message.Message):
    __slots__ = ("step", "planner", "decision", "parse_error", "command", "executor", "result", "tool_error", "verdict", "verifier_analysis", "timings", "verifier")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PLANNER_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    PARSE_ERROR_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    TOOL_ERROR_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_ANALYSIS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_FIELD_NUMBER: _ClassVar[int]
    step: int
    planner: LLMCall
    decision: Decision
    parse_error: str
    command: str
    executor: LLMCall
    result: str
    tool_error: str
    verdict: str
    verifier_analysis: str
    timings: Timings
    verifier: LLMCall
    def __init__(self, step: _Optional[int] = ..., planner: _Optional[_Union[LLMCall, _Mapping]] = ..., decision: _Optional[_Union[Decision, _Mapping]] = ..., parse_error: _Optional[str] = ..., command: _Optional[str] = ..., executor: _Optional[_Union[LLMCall, _Mapping]] = ..., result: _Optional[str] = ..., tool_error: _Optional[str] = ..., verdict: _Optional[str] = ..., verifier_analysis: _Optional[str] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., verifier: _Optional[_Union[LLMCall, _Mapping]] = ...) -> None: ...

class LLMCall(_message.Message):
    __slots__ = ("text", "prompt_token_ids", "token_ids", "logprobs", "model_version", "finish_reason", "latency_s")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    text: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    model_version: str
    finish_reason: str
    latency_s: float
    def __init__(self, text: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., model_version: _Optional[str] = ..., finish_reason: _Optional[str] = ..., latency_s: _Optional[float] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("sub_goal", "tool", "context")
    SUB_GOAL_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    sub_goal: str
    tool: str
    context: str
    def __init__(self, sub_goal: _Optional[str] = ..., tool: _Optional[str] = ..., context: _Optional[str] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("plan_s", "execute_s", "verify_s", "total_s")
    PLAN_S_FIELD_NUMBER: _ClassVar[int]
    EXECUTE_S_FIELD_NUMBER: _ClassVar[int]
    VERIFY_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    plan_s: float
    execute_s: float
    verify_s: float
    total_s: float
    def __init__(self, plan_s: _Optional[float] = ..., execute_s: _Optional[float] = ..., verify_s: _Optional[float] = ..., total_s: _Optional[float] = ...) -> None: ...

class MemorySnapshot(_message.Message):
    __slots__ = ("query", "analysis", "summary", "steps", "compacted_steps")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    ANALYSIS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_STEPS_FIELD_NUMBER: _ClassVar[int]
    query: str
    analysis: str
    summary: str
    steps: _containers.RepeatedCompositeFieldContainer[MemoryStep]
    compacted_steps: int
    def __init__(self, query: _Optional[str] = ..., analysis: _Optional[str] = ..., summary: _Optional[str] = ..., steps: _Optional[_Iterable[_Union[MemoryStep, _Mapping]]] = ..., compacted_steps: _Optional[int] = ...) -> None: ...

class MemoryStep(_message.Message):
    __slots__ = ("step", "sub_goal", "tool", "command", "result", "error", "verdict")
    STEP_FIELD_NUMBER: _ClassVar[int]
    SUB_GOAL_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    step: int
    sub_goal: str
    tool: str
    command: str
    result: str
    error: str
    verdict: str
    def __init__(self, step: _Optional[int] = ..., sub_goal: _Optional[str] = ..., tool: _Optional[str] = ..., command: _Optional[str] = ..., result: _Optional[str] = ..., error: _Optional[str] = ..., verdict: _Optional[str] = ...) -> None: ...

class Reward(_message.Message):
    __slots__ = ("value", "source", "detail", "author")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    AUTHOR_FIELD_NUMBER: _ClassVar[int]
    value: float
    source: str
    detail: str
    author: str
    def __init__(self, value: _Optional[float] = ..., source: _Optional[str] = ..., detail: _Optional[str] = ..., author: _Optional[str] = ...) -> None: ...

class Totals(_message.Message):
    __slots__ = ("turns", "prompt_tokens", "completion_tokens", "latency_s")
    TURNS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    turns: int
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    def __init__(self, turns: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., latency_s: _Optional[float] = ...) -> None: ...
