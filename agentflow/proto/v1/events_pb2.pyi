from agentflow.proto.v1 import trajectory_pb2 as _trajectory_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Envelope(_message.Message):
    __slots__ = ("event_id", "trajectory_id", "step", "stage", "produced_at_unix_ms", "schema_version", "query", "memory_updated", "plan", "execution", "verdict", "finalize", "answer", "trajectory", "feedback", "planner_version", "dead_letter", "memory_state", "rollout_decision", "cancel", "planner_routing", "trainer_progress")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    PRODUCED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_UPDATED_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    FINALIZE_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_FIELD_NUMBER: _ClassVar[int]
    PLANNER_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_FIELD_NUMBER: _ClassVar[int]
    MEMORY_STATE_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_DECISION_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    PLANNER_ROUTING_FIELD_NUMBER: _ClassVar[int]
    TRAINER_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    trajectory_id: str
    step: int
    stage: str
    produced_at_unix_ms: int
    schema_version: int
    query: Query
    memory_updated: MemoryUpdated
    plan: Plan
    execution: Execution
    verdict: Verdict
    finalize: Finalize
    answer: Answer
    trajectory: _trajectory_pb2.Trajectory
    feedback: Feedback
    planner_version: PlannerVersion
    dead_letter: DeadLetter
    memory_state: MemoryState
    rollout_decision: RolloutDecision
    cancel: Cancel
    planner_routing: PlannerRouting
    trainer_progress: TrainerProgress
    def __init__(self, event_id: _Optional[str] = ..., trajectory_id: _Optional[str] = ..., step: _Optional[int] = ..., stage: _Optional[str] = ..., produced_at_unix_ms: _Optional[int] = ..., schema_version: _Optional[int] = ..., query: _Optional[_Union[Query, _Mapping]] = ..., memory_updated: _Optional[_Union[MemoryUpdated, _Mapping]] = ..., plan: _Optional[_Union[Plan, _Mapping]] = ..., execution: _Optional[_Union[Execution, _Mapping]] = ..., verdict: _Optional[_Union[Verdict, _Mapping]] = ..., finalize: _Optional[_Union[Finalize, _Mapping]] = ..., answer: _Optional[_Union[Answer, _Mapping]] = ..., trajectory: _Optional[_Union[_trajectory_pb2.Trajectory, _Mapping]] = ..., feedback: _Optional[_Union[Feedback, _Mapping]] = ..., planner_version: _Optional[_Union[PlannerVersion, _Mapping]] = ..., dead_letter: _Optional[_Union[DeadLetter, _Mapping]] = ..., memory_state: _Optional[_Union[MemoryState, _Mapping]] = ..., rollout_decision: _Optional[_Union[RolloutDecision, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., planner_routing: _Optional[_Union[PlannerRouting, _Mapping]] = ..., trainer_progress: _Optional[_Union[TrainerProgress, _Mapping]] = ...) -> None: ...

class QueryOptions(_message.Message):
    __slots__ = ("max_steps", "max_time_s", "tools", "temperature", "top_p", "max_tokens", "seed", "planner_version", "background")
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    MAX_TIME_S_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    PLANNER_VERSION_FIELD_NUMBER: _ClassVar[int]
    BACKGROUND_FIELD_NUMBER: _ClassVar[int]
    max_steps: int
    max_time_s: float
    tools: _containers.RepeatedScalarFieldContainer[str]
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    planner_version: str
    background: bool
    def __init__(self, max_steps: _Optional[int] = ..., max_time_s: _Optional[float] = ..., tools: _Optional[_Iterable[str]] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., max_tokens: _Optional[int] = ..., seed: _Optional[int] = ..., planner_version: _Optional[str] = ..., background: _Optional[bool] = ...) -> None: ...

class Query(_message.Message):
    __slots__ = ("query", "options", "ground_truth", "group_id", "source", "deadline_unix_ms", "train_ok", "owner", "branch")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TRAIN_OK_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    query: str
    options: QueryOptions
    ground_truth: str
    group_id: str
    source: str
    deadline_unix_ms: int
    train_ok: bool
    owner: str
    branch: BranchPoint
    def __init__(self, query: _Optional[str] = ..., options: _Optional[_Union[QueryOptions, _Mapping]] = ..., ground_truth: _Optional[str] = ..., group_id: _Optional[str] = ..., source: _Optional[str] = ..., deadline_unix_ms: _Optional[int] = ..., train_ok: _Optional[bool] = ..., owner: _Optional[str] = ..., branch: _Optional[_Union[BranchPoint, _Mapping]] = ...) -> None: ...

class BranchPoint(_message.Message):
    __slots__ = ("trajectory_id", "turn")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    turn: int
    def __init__(self, trajectory_id: _Optional[str] = ..., turn: _Optional[int] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class MemoryUpdated(_message.Message):
    __slots__ = ("memory", "step", "steps_left", "time_left_s", "options", "deadline_unix_ms", "planner_version")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEPS_LEFT_FIELD_NUMBER: _ClassVar[int]
    TIME_LEFT_S_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    PLANNER_VERSION_FIELD_NUMBER: _ClassVar[int]
    memory: _trajectory_pb2.MemorySnapshot
    step: int
    steps_left: int
    time_left_s: float
    options: QueryOptions
    deadline_unix_ms: int
    planner_version: str
    def __init__(self, memory: _Optional[_Union[_trajectory_pb2.MemorySnapshot, _Mapping]] = ..., step: _Optional[int] = ..., steps_left: _Optional[int] = ..., time_left_s: _Optional[float] = ..., options: _Optional[_Union[QueryOptions, _Mapping]] = ..., deadline_unix_ms: _Optional[int] = ..., planner_version: _Optional[str] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("turn", "memory", "options", "deadline_unix_ms", "analysis_call")
    TURN_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ANALYSIS_CALL_FIELD_NUMBER: _ClassVar[int]
    turn: _trajectory_pb2.Turn
    memory: _trajectory_pb2.MemorySnapshot
    options: QueryOptions
    deadline_unix_ms: int
    analysis_call: _trajectory_pb2.LLMCall
    def __init__(self, turn: _Optional[_Union[_trajectory_pb2.Turn, _Mapping]] = ..., memory: _Optional[_Union[_trajectory_pb2.MemorySnapshot, _Mapping]] = ..., options: _Optional[_Union[QueryOptions, _Mapping]] = ..., deadline_unix_ms: _Optional[int] = ..., analysis_call: _Optional[_Union[_trajectory_pb2.LLMCall, _Mapping]] = ...) -> None: ...

class Execution(_message.Message):
    __slots__ = ("turn", "memory", "options", "deadline_unix_ms", "analysis_call")
    TURN_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ANALYSIS_CALL_FIELD_NUMBER: _ClassVar[int]
    turn: _trajectory_pb2.Turn
    memory: _trajectory_pb2.MemorySnapshot
    options: QueryOptions
    deadline_unix_ms: int
    analysis_call: _trajectory_pb2.LLMCall
    def __init__(self, turn: _Optional[_Union[_trajectory_pb2.Turn, _Mapping]] = ..., memory: _Optional[_Union[_trajectory_pb2.MemorySnapshot, _Mapping]] = ..., options: _Optional[_Union[QueryOptions, _Mapping]] = ..., deadline_unix_ms: _Optional[int] = ..., analysis_call: _Optional[_Union[_trajectory_pb2.LLMCall, _Mapping]] = ...) -> None: ...

class Verdict(_message.Message):
    __slots__ = ("turn", "memory", "analysis_call")
    TURN_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    ANALYSIS_CALL_FIELD_NUMBER: _ClassVar[int]
    turn: _trajectory_pb2.Turn
    memory: _trajectory_pb2.MemorySnapshot
    analysis_call: _trajectory_pb2.LLMCall
    def __init__(self, turn: _Optional[_Union[_trajectory_pb2.Turn, _Mapping]] = ..., memory: _Optional[_Union[_trajectory_pb2.MemorySnapshot, _Mapping]] = ..., analysis_call: _Optional[_Union[_trajectory_pb2.LLMCall, _Mapping]] = ...) -> None: ...

class Finalize(_message.Message):
    __slots__ = ("memory", "reason", "turns", "options", "deadline_unix_ms")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    memory: _trajectory_pb2.MemorySnapshot
    reason: str
    turns: int
    options: QueryOptions
    deadline_unix_ms: int
    def __init__(self, memory: _Optional[_Union[_trajectory_pb2.MemorySnapshot, _Mapping]] = ..., reason: _Optional[str] = ..., turns: _Optional[int] = ..., options: _Optional[_Union[QueryOptions, _Mapping]] = ..., deadline_unix_ms: _Optional[int] = ...) -> None: ...

class Answer(_message.Message):
    __slots__ = ("answer", "status", "error", "generator", "duration_s")
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    answer: str
    status: str
    error: str
    generator: _trajectory_pb2.LLMCall
    duration_s: float
    def __init__(self, answer: _Optional[str] = ..., status: _Optional[str] = ..., error: _Optional[str] = ..., generator: _Optional[_Union[_trajectory_pb2.LLMCall, _Mapping]] = ..., duration_s: _Optional[float] = ...) -> None: ...

class Feedback(_message.Message):
    __slots__ = ("trajectory_id", "reward", "author")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    AUTHOR_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    reward: _trajectory_pb2.Reward
    author: str
    def __init__(self, trajectory_id: _Optional[str] = ..., reward: _Optional[_Union[_trajectory_pb2.Reward, _Mapping]] = ..., author: _Optional[str] = ...) -> None: ...

class PlannerVersion(_message.Message):
    __slots__ = ("version", "checkpoint_uri", "metrics", "parent_version", "created_at_unix_ms")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_URI_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    PARENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    version: str
    checkpoint_uri: str
    metrics: _containers.ScalarMap[str, float]
    parent_version: str
    created_at_unix_ms: int
    def __init__(self, version: _Optional[str] = ..., checkpoint_uri: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ..., parent_version: _Optional[str] = ..., created_at_unix_ms: _Optional[int] = ...) -> None: ...

class TrainerProgress(_message.Message):
    __slots__ = ("groups_done", "steps", "version", "groups_left_out", "trained_steps")
    class GroupsLeftOutEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    GROUPS_DONE_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GROUPS_LEFT_OUT_FIELD_NUMBER: _ClassVar[int]
    TRAINED_STEPS_FIELD_NUMBER: _ClassVar[int]
    groups_done: int
    steps: int
    version: str
    groups_left_out: _containers.ScalarMap[str, int]
    trained_steps: int
    def __init__(self, groups_done: _Optional[int] = ..., steps: _Optional[int] = ..., version: _Optional[str] = ..., groups_left_out: _Optional[_Mapping[str, int]] = ..., trained_steps: _Optional[int] = ...) -> None: ...

class PlannerRoute(_message.Message):
    __slots__ = ("version", "endpoint", "model", "weight")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    version: str
    endpoint: str
    model: str
    weight: int
    def __init__(self, version: _Optional[str] = ..., endpoint: _Optional[str] = ..., model: _Optional[str] = ..., weight: _Optional[int] = ...) -> None: ...

class PlannerRouting(_message.Message):
    __slots__ = ("deployment", "routes", "stable_version", "canary_version", "latest_version", "pin_endpoint", "decided_at_unix_ms", "reason", "fleet_endpoint", "fleet_versions", "expires_at_unix_ms", "fleet_model")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    STABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    PIN_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FLEET_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    FLEET_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    FLEET_MODEL_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    routes: _containers.RepeatedCompositeFieldContainer[PlannerRoute]
    stable_version: str
    canary_version: str
    latest_version: str
    pin_endpoint: str
    decided_at_unix_ms: int
    reason: str
    fleet_endpoint: str
    fleet_versions: _containers.RepeatedScalarFieldContainer[str]
    expires_at_unix_ms: int
    fleet_model: str
    def __init__(self, deployment: _Optional[str] = ..., routes: _Optional[_Iterable[_Union[PlannerRoute, _Mapping]]] = ..., stable_version: _Optional[str] = ..., canary_version: _Optional[str] = ..., latest_version: _Optional[str] = ..., pin_endpoint: _Optional[str] = ..., decided_at_unix_ms: _Optional[int] = ..., reason: _Optional[str] = ..., fleet_endpoint: _Optional[str] = ..., fleet_versions: _Optional[_Iterable[str]] = ..., expires_at_unix_ms: _Optional[int] = ..., fleet_model: _Optional[str] = ...) -> None: ...

class RolloutArm(_message.Message):
    __slots__ = ("version", "samples", "reward_samples", "reward_mean", "error_rate", "latency_mean_s")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    REWARD_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    ERROR_RATE_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MEAN_S_FIELD_NUMBER: _ClassVar[int]
    version: str
    samples: int
    reward_samples: int
    reward_mean: float
    error_rate: float
    latency_mean_s: float
    def __init__(self, version: _Optional[str] = ..., samples: _Optional[int] = ..., reward_samples: _Optional[int] = ..., reward_mean: _Optional[float] = ..., error_rate: _Optional[float] = ..., latency_mean_s: _Optional[float] = ...) -> None: ...

class RolloutComparison(_message.Message):
    __slots__ = ("metric", "diff_lower", "diff_upper", "margin", "verdict")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    DIFF_LOWER_FIELD_NUMBER: _ClassVar[int]
    DIFF_UPPER_FIELD_NUMBER: _ClassVar[int]
    MARGIN_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    metric: str
    diff_lower: float
    diff_upper: float
    margin: float
    verdict: str
    def __init__(self, metric: _Optional[str] = ..., diff_lower: _Optional[float] = ..., diff_upper: _Optional[float] = ..., margin: _Optional[float] = ..., verdict: _Optional[str] = ...) -> None: ...

class RolloutDecision(_message.Message):
    __slots__ = ("version", "action", "percent", "reason", "stable_version", "checkpoint_uri", "stable_uri", "backend", "target", "canary", "stable", "comparisons", "alpha", "step_elapsed_s", "decided_at_unix_ms")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PERCENT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_URI_FIELD_NUMBER: _ClassVar[int]
    STABLE_URI_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    STABLE_FIELD_NUMBER: _ClassVar[int]
    COMPARISONS_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    STEP_ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    version: str
    action: str
    percent: int
    reason: str
    stable_version: str
    checkpoint_uri: str
    stable_uri: str
    backend: str
    target: str
    canary: RolloutArm
    stable: RolloutArm
    comparisons: _containers.RepeatedCompositeFieldContainer[RolloutComparison]
    alpha: float
    step_elapsed_s: float
    decided_at_unix_ms: int
    def __init__(self, version: _Optional[str] = ..., action: _Optional[str] = ..., percent: _Optional[int] = ..., reason: _Optional[str] = ..., stable_version: _Optional[str] = ..., checkpoint_uri: _Optional[str] = ..., stable_uri: _Optional[str] = ..., backend: _Optional[str] = ..., target: _Optional[str] = ..., canary: _Optional[_Union[RolloutArm, _Mapping]] = ..., stable: _Optional[_Union[RolloutArm, _Mapping]] = ..., comparisons: _Optional[_Iterable[_Union[RolloutComparison, _Mapping]]] = ..., alpha: _Optional[float] = ..., step_elapsed_s: _Optional[float] = ..., decided_at_unix_ms: _Optional[int] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("origin_topic", "partition", "offset", "key", "value", "error", "worker", "attempts", "failed_at_unix_ms", "value_size", "value_sha256", "value_truncated", "origin_stage")
    ORIGIN_TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    FAILED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    VALUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    VALUE_SHA256_FIELD_NUMBER: _ClassVar[int]
    VALUE_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_STAGE_FIELD_NUMBER: _ClassVar[int]
    origin_topic: str
    partition: int
    offset: int
    key: bytes
    value: bytes
    error: str
    worker: str
    attempts: int
    failed_at_unix_ms: int
    value_size: int
    value_sha256: str
    value_truncated: bool
    origin_stage: str
    def __init__(self, origin_topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., error: _Optional[str] = ..., worker: _Optional[str] = ..., attempts: _Optional[int] = ..., failed_at_unix_ms: _Optional[int] = ..., value_size: _Optional[int] = ..., value_sha256: _Optional[str] = ..., value_truncated: _Optional[bool] = ..., origin_stage: _Optional[str] = ...) -> None: ...

class MemoryState(_message.Message):
    __slots__ = ("record", "memory", "options", "max_steps", "steps_deadline_unix_ms", "deadline_unix_ms", "phase", "finish_reason", "feedback_emits", "first_step")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    STEPS_DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_EMITS_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_FIELD_NUMBER: _ClassVar[int]
    record: _trajectory_pb2.Trajectory
    memory: _trajectory_pb2.MemorySnapshot
    options: QueryOptions
    max_steps: int
    steps_deadline_unix_ms: int
    deadline_unix_ms: int
    phase: str
    finish_reason: str
    feedback_emits: int
    first_step: int
    def __init__(self, record: _Optional[_Union[_trajectory_pb2.Trajectory, _Mapping]] = ..., memory: _Optional[_Union[_trajectory_pb2.MemorySnapshot, _Mapping]] = ..., options: _Optional[_Union[QueryOptions, _Mapping]] = ..., max_steps: _Optional[int] = ..., steps_deadline_unix_ms: _Optional[int] = ..., deadline_unix_ms: _Optional[int] = ..., phase: _Optional[str] = ..., finish_reason: _Optional[str] = ..., feedback_emits: _Optional[int] = ..., first_step: _Optional[int] = ...) -> None: ...
