from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Codec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CODEC_UNSPECIFIED: _ClassVar[Codec]
    CODEC_FP32: _ClassVar[Codec]
    CODEC_BF16: _ClassVar[Codec]
    CODEC_INT8_BLOCK: _ClassVar[Codec]
    CODEC_SPARSE: _ClassVar[Codec]
    CODEC_LOWBIT_BLOCK: _ClassVar[Codec]

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]

class RunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATE_UNSPECIFIED: _ClassVar[RunState]
    RUN_STATE_RUNNING: _ClassVar[RunState]
    RUN_STATE_FINISHED: _ClassVar[RunState]

class WorkerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_STATE_UNSPECIFIED: _ClassVar[WorkerState]
    WORKER_STATE_ACTIVE: _ClassVar[WorkerState]
    WORKER_STATE_LEFT: _ClassVar[WorkerState]
    WORKER_STATE_EVICTED: _ClassVar[WorkerState]
    WORKER_STATE_REASSIGNED: _ClassVar[WorkerState]
CODEC_UNSPECIFIED: Codec
CODEC_FP32: Codec
CODEC_BF16: Codec
CODEC_INT8_BLOCK: Codec
CODEC_SPARSE: Codec
CODEC_LOWBIT_BLOCK: Codec
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT32: DType
RUN_STATE_UNSPECIFIED: RunState
RUN_STATE_RUNNING: RunState
RUN_STATE_FINISHED: RunState
WORKER_STATE_UNSPECIFIED: WorkerState
WORKER_STATE_ACTIVE: WorkerState
WORKER_STATE_LEFT: WorkerState
WORKER_STATE_EVICTED: WorkerState
WORKER_STATE_REASSIGNED: WorkerState

class TensorInfo(_message.Message):
    __slots__ = ("name", "dtype", "shape", "num_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    num_bytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., num_bytes: _Optional[int] = ...) -> None: ...

class TensorHeader(_message.Message):
    __slots__ = ("run_id", "version", "codec", "tensors", "total_bytes", "chunk_size", "chunk_crc32", "content_sha256", "block_size", "delta_from_version", "result_sha256", "sparse_keep", "value_bits")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_CRC32_FIELD_NUMBER: _ClassVar[int]
    CONTENT_SHA256_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    DELTA_FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESULT_SHA256_FIELD_NUMBER: _ClassVar[int]
    SPARSE_KEEP_FIELD_NUMBER: _ClassVar[int]
    VALUE_BITS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    version: int
    codec: Codec
    tensors: _containers.RepeatedCompositeFieldContainer[TensorInfo]
    total_bytes: int
    chunk_size: int
    chunk_crc32: _containers.RepeatedScalarFieldContainer[int]
    content_sha256: bytes
    block_size: int
    delta_from_version: int
    result_sha256: bytes
    sparse_keep: int
    value_bits: int
    def __init__(self, run_id: _Optional[str] = ..., version: _Optional[int] = ..., codec: _Optional[_Union[Codec, str]] = ..., tensors: _Optional[_Iterable[_Union[TensorInfo, _Mapping]]] = ..., total_bytes: _Optional[int] = ..., chunk_size: _Optional[int] = ..., chunk_crc32: _Optional[_Iterable[int]] = ..., content_sha256: _Optional[bytes] = ..., block_size: _Optional[int] = ..., delta_from_version: _Optional[int] = ..., result_sha256: _Optional[bytes] = ..., sparse_keep: _Optional[int] = ..., value_bits: _Optional[int] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ("index", "data")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    index: int
    data: bytes
    def __init__(self, index: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("worker_name", "device", "pid", "run_id", "previous_worker_id", "refused_run_ids", "previous_worker_secret")
    WORKER_NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    REFUSED_RUN_IDS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_WORKER_SECRET_FIELD_NUMBER: _ClassVar[int]
    worker_name: str
    device: str
    pid: int
    run_id: str
    previous_worker_id: str
    refused_run_ids: _containers.RepeatedScalarFieldContainer[str]
    previous_worker_secret: bytes
    def __init__(self, worker_name: _Optional[str] = ..., device: _Optional[str] = ..., pid: _Optional[int] = ..., run_id: _Optional[str] = ..., previous_worker_id: _Optional[str] = ..., refused_run_ids: _Optional[_Iterable[str]] = ..., previous_worker_secret: _Optional[bytes] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("worker_id", "run_id", "run_spec_json", "version", "lease_seconds", "data_seed", "assignment", "worker_secret")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DATA_SEED_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    WORKER_SECRET_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    run_id: str
    run_spec_json: str
    version: int
    lease_seconds: float
    data_seed: int
    assignment: TrainingAssignment
    worker_secret: bytes
    def __init__(self, worker_id: _Optional[str] = ..., run_id: _Optional[str] = ..., run_spec_json: _Optional[str] = ..., version: _Optional[int] = ..., lease_seconds: _Optional[float] = ..., data_seed: _Optional[int] = ..., assignment: _Optional[_Union[TrainingAssignment, _Mapping]] = ..., worker_secret: _Optional[bytes] = ...) -> None: ...

class TrainingAssignment(_message.Message):
    __slots__ = ("seq_len", "batch_size", "reason", "version", "inner_steps", "round_seconds")
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INNER_STEPS_FIELD_NUMBER: _ClassVar[int]
    ROUND_SECONDS_FIELD_NUMBER: _ClassVar[int]
    seq_len: int
    batch_size: int
    reason: str
    version: int
    inner_steps: int
    round_seconds: float
    def __init__(self, seq_len: _Optional[int] = ..., batch_size: _Optional[int] = ..., reason: _Optional[str] = ..., version: _Optional[int] = ..., inner_steps: _Optional[int] = ..., round_seconds: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "worker_secret")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_SECRET_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    worker_secret: bytes
    def __init__(self, worker_id: _Optional[str] = ..., worker_secret: _Optional[bytes] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("version", "run_state", "lease_seconds", "assignment")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUN_STATE_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    version: int
    run_state: RunState
    lease_seconds: float
    assignment: TrainingAssignment
    def __init__(self, version: _Optional[int] = ..., run_state: _Optional[_Union[RunState, str]] = ..., lease_seconds: _Optional[float] = ..., assignment: _Optional[_Union[TrainingAssignment, _Mapping]] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("worker_id", "reason", "worker_secret")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    WORKER_SECRET_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    reason: str
    worker_secret: bytes
    def __init__(self, worker_id: _Optional[str] = ..., reason: _Optional[str] = ..., worker_secret: _Optional[bytes] = ...) -> None: ...

class LeaveResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PullParametersRequest(_message.Message):
    __slots__ = ("worker_id", "version", "have_version", "worker_secret")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HAVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_SECRET_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    version: int
    have_version: int
    worker_secret: bytes
    def __init__(self, worker_id: _Optional[str] = ..., version: _Optional[int] = ..., have_version: _Optional[int] = ..., worker_secret: _Optional[bytes] = ...) -> None: ...

class PullParametersResponse(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: TensorHeader
    chunk: TensorChunk
    def __init__(self, header: _Optional[_Union[TensorHeader, _Mapping]] = ..., chunk: _Optional[_Union[TensorChunk, _Mapping]] = ...) -> None: ...

class AwaitVersionRequest(_message.Message):
    __slots__ = ("worker_id", "min_version", "wait_ms", "worker_secret")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    WORKER_SECRET_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    min_version: int
    wait_ms: int
    worker_secret: bytes
    def __init__(self, worker_id: _Optional[str] = ..., min_version: _Optional[int] = ..., wait_ms: _Optional[int] = ..., worker_secret: _Optional[bytes] = ...) -> None: ...

class AwaitVersionResponse(_message.Message):
    __slots__ = ("version", "run_state", "assignment")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUN_STATE_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    version: int
    run_state: RunState
    assignment: TrainingAssignment
    def __init__(self, version: _Optional[int] = ..., run_state: _Optional[_Union[RunState, str]] = ..., assignment: _Optional[_Union[TrainingAssignment, _Mapping]] = ...) -> None: ...

class UpdateMeta(_message.Message):
    __slots__ = ("worker_id", "base_version", "tokens", "inner_steps", "worker_secret")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    INNER_STEPS_FIELD_NUMBER: _ClassVar[int]
    WORKER_SECRET_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    base_version: int
    tokens: int
    inner_steps: int
    worker_secret: bytes
    def __init__(self, worker_id: _Optional[str] = ..., base_version: _Optional[int] = ..., tokens: _Optional[int] = ..., inner_steps: _Optional[int] = ..., worker_secret: _Optional[bytes] = ...) -> None: ...

class PushUpdateRequest(_message.Message):
    __slots__ = ("meta", "header", "chunk")
    META_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    meta: UpdateMeta
    header: TensorHeader
    chunk: TensorChunk
    def __init__(self, meta: _Optional[_Union[UpdateMeta, _Mapping]] = ..., header: _Optional[_Union[TensorHeader, _Mapping]] = ..., chunk: _Optional[_Union[TensorChunk, _Mapping]] = ...) -> None: ...

class PushUpdateResponse(_message.Message):
    __slots__ = ("accepted", "round_version", "reports", "staleness", "staleness_weight")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ROUND_VERSION_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    STALENESS_FIELD_NUMBER: _ClassVar[int]
    STALENESS_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    round_version: int
    reports: int
    staleness: int
    staleness_weight: float
    def __init__(self, accepted: _Optional[bool] = ..., round_version: _Optional[int] = ..., reports: _Optional[int] = ..., staleness: _Optional[int] = ..., staleness_weight: _Optional[float] = ...) -> None: ...

class Metric(_message.Message):
    __slots__ = ("version", "step", "seq_len", "batch", "loss", "tokens", "wall_time", "compute_seconds", "sync_seconds", "bytes_sent", "bytes_received", "param_sha256", "val_loss", "val_seconds")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    WALL_TIME_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SYNC_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    PARAM_SHA256_FIELD_NUMBER: _ClassVar[int]
    VAL_LOSS_FIELD_NUMBER: _ClassVar[int]
    VAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    version: int
    step: int
    seq_len: int
    batch: int
    loss: float
    tokens: int
    wall_time: float
    compute_seconds: float
    sync_seconds: float
    bytes_sent: int
    bytes_received: int
    param_sha256: str
    val_loss: float
    val_seconds: float
    def __init__(self, version: _Optional[int] = ..., step: _Optional[int] = ..., seq_len: _Optional[int] = ..., batch: _Optional[int] = ..., loss: _Optional[float] = ..., tokens: _Optional[int] = ..., wall_time: _Optional[float] = ..., compute_seconds: _Optional[float] = ..., sync_seconds: _Optional[float] = ..., bytes_sent: _Optional[int] = ..., bytes_received: _Optional[int] = ..., param_sha256: _Optional[str] = ..., val_loss: _Optional[float] = ..., val_seconds: _Optional[float] = ...) -> None: ...

class ReportMetricsRequest(_message.Message):
    __slots__ = ("worker_id", "metrics", "worker_secret", "run_id")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    WORKER_SECRET_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    metrics: _containers.RepeatedCompositeFieldContainer[Metric]
    worker_secret: bytes
    run_id: str
    def __init__(self, worker_id: _Optional[str] = ..., metrics: _Optional[_Iterable[_Union[Metric, _Mapping]]] = ..., worker_secret: _Optional[bytes] = ..., run_id: _Optional[str] = ...) -> None: ...

class ReportMetricsResponse(_message.Message):
    __slots__ = ("stored",)
    STORED_FIELD_NUMBER: _ClassVar[int]
    stored: int
    def __init__(self, stored: _Optional[int] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("worker_id", "name", "state", "base_version", "seconds_since_heartbeat", "device", "reason", "assignment", "clipped_updates", "dropped_updates", "outlier_rounds", "outlier", "stale_updates", "late_updates", "trained_tokens", "applied_tokens", "step_seconds", "run_id", "round_bytes_up", "round_bytes_down", "utilization")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    CLIPPED_UPDATES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_UPDATES_FIELD_NUMBER: _ClassVar[int]
    OUTLIER_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    OUTLIER_FIELD_NUMBER: _ClassVar[int]
    STALE_UPDATES_FIELD_NUMBER: _ClassVar[int]
    LATE_UPDATES_FIELD_NUMBER: _ClassVar[int]
    TRAINED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_BYTES_UP_FIELD_NUMBER: _ClassVar[int]
    ROUND_BYTES_DOWN_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    name: str
    state: WorkerState
    base_version: int
    seconds_since_heartbeat: float
    device: str
    reason: str
    assignment: TrainingAssignment
    clipped_updates: int
    dropped_updates: int
    outlier_rounds: int
    outlier: str
    stale_updates: int
    late_updates: int
    trained_tokens: int
    applied_tokens: int
    step_seconds: float
    run_id: str
    round_bytes_up: int
    round_bytes_down: int
    utilization: float
    def __init__(self, worker_id: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[_Union[WorkerState, str]] = ..., base_version: _Optional[int] = ..., seconds_since_heartbeat: _Optional[float] = ..., device: _Optional[str] = ..., reason: _Optional[str] = ..., assignment: _Optional[_Union[TrainingAssignment, _Mapping]] = ..., clipped_updates: _Optional[int] = ..., dropped_updates: _Optional[int] = ..., outlier_rounds: _Optional[int] = ..., outlier: _Optional[str] = ..., stale_updates: _Optional[int] = ..., late_updates: _Optional[int] = ..., trained_tokens: _Optional[int] = ..., applied_tokens: _Optional[int] = ..., step_seconds: _Optional[float] = ..., run_id: _Optional[str] = ..., round_bytes_up: _Optional[int] = ..., round_bytes_down: _Optional[int] = ..., utilization: _Optional[float] = ...) -> None: ...

class RoundStatus(_message.Message):
    __slots__ = ("version", "reports", "tokens", "opened_at", "closed_at", "close_reason", "update_norm", "clipped", "dropped", "aggregation", "run_id")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    OPENED_AT_FIELD_NUMBER: _ClassVar[int]
    CLOSED_AT_FIELD_NUMBER: _ClassVar[int]
    CLOSE_REASON_FIELD_NUMBER: _ClassVar[int]
    UPDATE_NORM_FIELD_NUMBER: _ClassVar[int]
    CLIPPED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    AGGREGATION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    version: int
    reports: int
    tokens: int
    opened_at: float
    closed_at: float
    close_reason: str
    update_norm: float
    clipped: int
    dropped: int
    aggregation: str
    run_id: str
    def __init__(self, version: _Optional[int] = ..., reports: _Optional[int] = ..., tokens: _Optional[int] = ..., opened_at: _Optional[float] = ..., closed_at: _Optional[float] = ..., close_reason: _Optional[str] = ..., update_norm: _Optional[float] = ..., clipped: _Optional[int] = ..., dropped: _Optional[int] = ..., aggregation: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("run_id", "version", "run_state", "target_rounds", "workers", "rounds", "latest_loss", "tokens_per_second", "param_sha256", "total_tokens", "runs", "curriculum", "applied_tokens", "pace", "fp32_bytes", "bytes_up_per_round", "bytes_down_per_round", "utilization", "forecast", "val_loss", "val_version", "waiting_for_place")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUN_STATE_FIELD_NUMBER: _ClassVar[int]
    TARGET_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    LATEST_LOSS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    PARAM_SHA256_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    CURRICULUM_FIELD_NUMBER: _ClassVar[int]
    APPLIED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PACE_FIELD_NUMBER: _ClassVar[int]
    FP32_BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_UP_PER_ROUND_FIELD_NUMBER: _ClassVar[int]
    BYTES_DOWN_PER_ROUND_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    FORECAST_FIELD_NUMBER: _ClassVar[int]
    VAL_LOSS_FIELD_NUMBER: _ClassVar[int]
    VAL_VERSION_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_PLACE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    version: int
    run_state: RunState
    target_rounds: int
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    rounds: _containers.RepeatedCompositeFieldContainer[RoundStatus]
    latest_loss: float
    tokens_per_second: float
    param_sha256: str
    total_tokens: int
    runs: _containers.RepeatedCompositeFieldContainer[RunSummary]
    curriculum: CurriculumStatus
    applied_tokens: int
    pace: str
    fp32_bytes: int
    bytes_up_per_round: float
    bytes_down_per_round: float
    utilization: float
    forecast: ForecastStatus
    val_loss: float
    val_version: int
    waiting_for_place: int
    def __init__(self, run_id: _Optional[str] = ..., version: _Optional[int] = ..., run_state: _Optional[_Union[RunState, str]] = ..., target_rounds: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., rounds: _Optional[_Iterable[_Union[RoundStatus, _Mapping]]] = ..., latest_loss: _Optional[float] = ..., tokens_per_second: _Optional[float] = ..., param_sha256: _Optional[str] = ..., total_tokens: _Optional[int] = ..., runs: _Optional[_Iterable[_Union[RunSummary, _Mapping]]] = ..., curriculum: _Optional[_Union[CurriculumStatus, _Mapping]] = ..., applied_tokens: _Optional[int] = ..., pace: _Optional[str] = ..., fp32_bytes: _Optional[int] = ..., bytes_up_per_round: _Optional[float] = ..., bytes_down_per_round: _Optional[float] = ..., utilization: _Optional[float] = ..., forecast: _Optional[_Union[ForecastStatus, _Mapping]] = ..., val_loss: _Optional[float] = ..., val_version: _Optional[int] = ..., waiting_for_place: _Optional[int] = ...) -> None: ...

class ForecastStatus(_message.Message):
    __slots__ = ("made_at_version", "at_round", "loss", "low", "high", "note", "target_loss", "target_seconds", "target_low_s", "target_high_s", "stopped", "basis")
    MADE_AT_VERSION_FIELD_NUMBER: _ClassVar[int]
    AT_ROUND_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    TARGET_LOSS_FIELD_NUMBER: _ClassVar[int]
    TARGET_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TARGET_LOW_S_FIELD_NUMBER: _ClassVar[int]
    TARGET_HIGH_S_FIELD_NUMBER: _ClassVar[int]
    STOPPED_FIELD_NUMBER: _ClassVar[int]
    BASIS_FIELD_NUMBER: _ClassVar[int]
    made_at_version: int
    at_round: int
    loss: float
    low: float
    high: float
    note: str
    target_loss: float
    target_seconds: float
    target_low_s: float
    target_high_s: float
    stopped: str
    basis: str
    def __init__(self, made_at_version: _Optional[int] = ..., at_round: _Optional[int] = ..., loss: _Optional[float] = ..., low: _Optional[float] = ..., high: _Optional[float] = ..., note: _Optional[str] = ..., target_loss: _Optional[float] = ..., target_seconds: _Optional[float] = ..., target_low_s: _Optional[float] = ..., target_high_s: _Optional[float] = ..., stopped: _Optional[str] = ..., basis: _Optional[str] = ...) -> None: ...

class CurriculumStatus(_message.Message):
    __slots__ = ("policy", "seq_len", "batch_size", "reason", "ladder", "rung", "seconds_per_step", "budget_seconds", "elapsed_seconds", "decided_version", "law")
    class SecondsPerStepEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LADDER_FIELD_NUMBER: _ClassVar[int]
    RUNG_FIELD_NUMBER: _ClassVar[int]
    SECONDS_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    BUDGET_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DECIDED_VERSION_FIELD_NUMBER: _ClassVar[int]
    LAW_FIELD_NUMBER: _ClassVar[int]
    policy: str
    seq_len: int
    batch_size: int
    reason: str
    ladder: _containers.RepeatedScalarFieldContainer[int]
    rung: int
    seconds_per_step: _containers.ScalarMap[int, float]
    budget_seconds: float
    elapsed_seconds: float
    decided_version: int
    law: str
    def __init__(self, policy: _Optional[str] = ..., seq_len: _Optional[int] = ..., batch_size: _Optional[int] = ..., reason: _Optional[str] = ..., ladder: _Optional[_Iterable[int]] = ..., rung: _Optional[int] = ..., seconds_per_step: _Optional[_Mapping[int, float]] = ..., budget_seconds: _Optional[float] = ..., elapsed_seconds: _Optional[float] = ..., decided_version: _Optional[int] = ..., law: _Optional[str] = ...) -> None: ...

class RunSummary(_message.Message):
    __slots__ = ("run_id", "version", "run_state", "target_rounds", "seq_len", "batch_size", "active_workers", "latest_loss", "total_tokens", "tokens_per_second", "curriculum", "forecast", "val_loss", "val_version", "refused_by", "last_refusal")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUN_STATE_FIELD_NUMBER: _ClassVar[int]
    TARGET_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    LATEST_LOSS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    CURRICULUM_FIELD_NUMBER: _ClassVar[int]
    FORECAST_FIELD_NUMBER: _ClassVar[int]
    VAL_LOSS_FIELD_NUMBER: _ClassVar[int]
    VAL_VERSION_FIELD_NUMBER: _ClassVar[int]
    REFUSED_BY_FIELD_NUMBER: _ClassVar[int]
    LAST_REFUSAL_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    version: int
    run_state: RunState
    target_rounds: int
    seq_len: int
    batch_size: int
    active_workers: int
    latest_loss: float
    total_tokens: int
    tokens_per_second: float
    curriculum: CurriculumStatus
    forecast: ForecastStatus
    val_loss: float
    val_version: int
    refused_by: int
    last_refusal: str
    def __init__(self, run_id: _Optional[str] = ..., version: _Optional[int] = ..., run_state: _Optional[_Union[RunState, str]] = ..., target_rounds: _Optional[int] = ..., seq_len: _Optional[int] = ..., batch_size: _Optional[int] = ..., active_workers: _Optional[int] = ..., latest_loss: _Optional[float] = ..., total_tokens: _Optional[int] = ..., tokens_per_second: _Optional[float] = ..., curriculum: _Optional[_Union[CurriculumStatus, _Mapping]] = ..., forecast: _Optional[_Union[ForecastStatus, _Mapping]] = ..., val_loss: _Optional[float] = ..., val_version: _Optional[int] = ..., refused_by: _Optional[int] = ..., last_refusal: _Optional[str] = ...) -> None: ...
