"""Wire schemas: what crosses HTTP between users, the server and workers.

This module is imported by the server and by the worker (which must not
import FastAPI or the database), so it depends on pydantic alone.
"""

from __future__ import annotations

from datetime import datetime
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from api.lifecycle import JobStatus, NodeState, PartStatus

# A job spec is data with bounds: nothing in it is executed or used as a path.
MAX_WORLD_SIZE = 256
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
# Every integer that reaches the database fits its 64-bit columns.
DB_INT_MAX = 2**63 - 1
Id = Annotated[int, Field(ge=1, le=DB_INT_MAX)]
Count = Annotated[int, Field(ge=0, le=DB_INT_MAX)]
ExitCode = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]


class _Strict(BaseModel):
    """What clients send: unknown fields refused, and JSON types taken as the
    schema says: pydantic on its own would read ``true`` as 1, ``0`` as
    false and a number as a timestamp."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _json_types_as_documented(cls, value: Any, info: ValidationInfo) -> Any:
        # Strings, objects and nulls are pydantic's to judge; only numbers,
        # booleans and arrays can be the wrong JSON type here. (Specs read
        # back from the database go through this too: keep it cheap.)
        if info.field_name is not None and not isinstance(value, str | dict | None):
            wanted = cls.model_fields[info.field_name].annotation
            if not _fits(wanted, value):
                raise ValueError(f"{_kind(value)} where the schema wants {_name(wanted)}")
        return value


def _fits(annotation: Any, value: Any) -> bool:
    """Whether a JSON value is of a type the annotation allows (models,
    strings and the like are left to pydantic)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _fits(get_args(annotation)[0], value)
    if origin in (Union, UnionType):
        return any(_fits(option, value) for option in get_args(annotation))
    if origin is list and isinstance(value, list):
        (item,) = get_args(annotation) or (Any,)
        return all(_fits(item, element) for element in value)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation in (int, float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is datetime:
        return isinstance(value, str | datetime)
    if annotation is type(None):
        return value is None
    return True


_JSON_NAMES: dict[Any, str] = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "an object",
    datetime: "a date-time string",
    type(None): "null",
}


def _kind(value: Any) -> str:
    return "a number" if type(value) is float else _JSON_NAMES.get(type(value), "a value")


def _name(annotation: Any) -> str:
    if get_origin(annotation) is Annotated:
        return _name(get_args(annotation)[0])
    if get_origin(annotation) in (Union, UnionType):
        return " or ".join(_name(a) for a in get_args(annotation) if a is not type(None))
    if get_origin(annotation) is list:
        return "an array"
    return _JSON_NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


class Topology(_Strict):
    num_machines: int = Field(1, ge=1, le=64, description="Machines (nodes) the job spans")
    num_processes: int = Field(1, ge=1, le=64, description="Training processes per machine")

    @property
    def world_size(self) -> int:
        return self.num_machines * self.num_processes

    @model_validator(mode="after")
    def _world_size_within_limit(self) -> Topology:
        if self.world_size > MAX_WORLD_SIZE:
            raise ValueError(
                f"world size {self.world_size} (num_machines x num_processes) "
                f"exceeds the limit of {MAX_WORLD_SIZE}"
            )
        return self


class Performance(_Strict):
    """How the training runs, not what it computes: every option keeps the
    recipe's maths (see BENCHMARKS.md for what each one buys here)."""

    data_pipeline: Literal["tensor", "torchvision"] = Field(
        "tensor",
        description="tensor: MNIST normalised once, batches gathered by index in the "
        "DistributedSampler's order; torchvision: the recipe's per-image "
        "ToTensor/Normalize DataLoader (the same samples, bit for bit)",
    )
    threads_per_process: int | None = Field(
        None, ge=1, le=256, description="Intra-op threads; none: the node's cores // processes"
    )
    channels_last: bool = Field(True, description="NHWC activations (fast max-pool on CPU)")
    pool_before_relu: bool = Field(
        True,
        description="max-pool then ReLU: the same values and gradients as ReLU then "
        "max-pool, on 4x fewer elements",
    )
    dropout_masks: Literal["uniform", "bernoulli"] = Field(
        "uniform",
        description="uniform: keep where U[0,1) >= p (the same Bernoulli(1-p) masks, "
        "drawn faster than torch's bernoulli_)",
    )
    keep_freed_memory: bool = Field(
        True,
        description="glibc malloc keeps freed memory for the next step instead of returning "
        "it to the kernel (no page faults on each step's large tensors)",
    )
    start_method: Literal["fork", "spawn"] = Field(
        "fork", description="How the launcher starts ranks; fork skips a second torch import"
    )
    same_host_allreduce: Literal["shared_memory", "gloo"] = Field(
        "shared_memory",
        description="How ranks of a one-machine gloo job average gradients: through shared "
        "memory (the same average, without TCP) or gloo's TCP all-reduce",
    )
    gradient_as_bucket_view: bool = Field(
        False, description="DDP option (no measurable gain here, see BENCHMARKS.md)"
    )
    bucket_cap_mb: float = Field(25.0, gt=0, le=1024, description="DDP all-reduce bucket size")


class JobSpec(_Strict):
    """What a user asks for. Immutable once submitted."""

    name: str | None = Field(None, max_length=128, description="Free-form label")
    trainer: str = Field(
        "mnist",
        pattern=NAME_PATTERN,
        description="A trainer installed on the workers (built in: mnist)",
    )
    topology: Topology = Field(default_factory=Topology)
    backend: Literal["gloo", "nccl"] = Field(
        "gloo", description="gloo on CPU; nccl needs a GPU per process on every node"
    )
    batch_size: int = Field(128, ge=1, le=65536, description="Per process")
    epochs: int = Field(1, ge=1, le=1000)
    lr: float = Field(0.5, gt=0, le=1000, allow_inf_nan=False)
    seed: int = Field(
        0,
        ge=0,
        le=2**32 - 1,
        description="Model init and shuffling (0: DistributedSampler's own default)",
    )
    max_steps_per_epoch: int | None = Field(
        None, ge=1, le=10_000_000, description="Cut each epoch short (smoke runs)"
    )
    performance: Performance = Field(default_factory=Performance)
    max_restarts: int = Field(
        0,
        ge=0,
        le=100,
        description="New attempts after a retryable failure (a lost node, a rank killed by a "
        "signal, rendezvous trouble), each resuming from the last whole checkpoint; failures "
        "of the training code itself are never retried (like torchrun's --max-restarts)",
    )
    max_run_seconds: float | None = Field(
        None,
        gt=0,
        le=366 * 24 * 3600,
        allow_inf_nan=False,
        description="Fail the job with reason `deadline`, without retry, once this long has "
        "passed since its first start",
    )


# --- progress, results, errors ------------------------------------------------


class ProgressReport(_Strict):
    """One report from rank 0. ``seq`` makes a resent report harmless."""

    seq: Count
    epoch: int = Field(ge=1, le=DB_INT_MAX)
    batch: int = Field(ge=0, le=DB_INT_MAX, description="Batches done in this epoch")
    batches_per_epoch: int = Field(ge=1, le=DB_INT_MAX)
    loss: float | None = Field(None, description="Non-finite (diverged) losses read as null")
    samples_per_sec: float | None = Field(None, ge=0, allow_inf_nan=False)
    at: datetime


class TrainResult(_Strict):
    """What rank 0 measured once training ended."""

    train_loss: float | None = Field(None, description="Mean loss of rank 0's last epoch")
    test_loss: float | None = None
    test_accuracy: float | None = Field(None, ge=0, le=1)
    setup_seconds: float | None = Field(None, ge=0)
    train_seconds: float | None = Field(None, ge=0)
    eval_seconds: float | None = Field(None, ge=0)
    epoch_seconds: list[float] = Field(default_factory=list)
    samples_per_sec: float | None = Field(None, ge=0)
    threads_per_process: int | None = Field(None, ge=1)


class JobError(BaseModel):
    reason: str = Field(description="rank_failed, node_lost, worker_restarted, ...")
    message: str
    machine_id: int | None = None
    rank: int | None = None
    node: str | None = None
    exit_code: int | None = None
    traceback_tail: str | None = None


# --- what users read ----------------------------------------------------------


class PartPublic(BaseModel):
    machine_id: int
    node_id: int
    node_name: str
    node_address: str
    status: PartStatus
    exit_code: int | None = None
    failing_rank: int | None = None
    error: str | None = None
    assigned_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None


class ProgressPublic(BaseModel):
    epoch: int
    epochs: int
    batch: int
    batches_per_epoch: int
    percent: float
    eta_seconds: float | None = Field(
        None, description="Training time left at the pace so far (running jobs)"
    )
    loss: float | None
    samples_per_sec: float | None
    updated_at: datetime


class TimingPublic(BaseModel):
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    queued_seconds: float | None = Field(None, description="Created until started (or now)")
    running_seconds: float | None = Field(None, description="Started until finished (or now)")
    training_seconds: float | None = Field(None, description="Rank 0's training loop")
    setup_seconds: float | None = None
    eval_seconds: float | None = None
    threads_per_process: int | None = Field(None, description="Intra-op threads each rank used")


class CheckpointPublic(BaseModel):
    epoch: int
    size_bytes: int
    url: str = Field(description="GET it: a torch.save'd dict; its 'model' is the state_dict")


class AttemptPublic(BaseModel):
    number: int
    started_at: datetime
    finished_at: datetime | None = None
    resumed_from_epoch: int | None = Field(None, description="The checkpoint it started from")
    error: JobError | None = Field(None, description="Why it ended, if it failed")


class JobPublic(BaseModel):
    id: int
    name: str | None
    status: JobStatus
    pending_reason: str | None = Field(None, description="Why a queued job is not running")
    spec: JobSpec
    world_size: int
    attempt: int = Field(description="Attempt number, 0 before the first start")
    attempts: list[AttemptPublic] = Field(
        default_factory=list, description="Every attempt so far, oldest first"
    )
    master_addr: str | None = None
    master_port: int | None = None
    parts: list[PartPublic]
    progress: ProgressPublic | None = None
    timing: TimingPublic
    result: TrainResult | None = None
    error: JobError | None = None
    checkpoint: CheckpointPublic | None = Field(
        None, description="The newest checkpoint (after the last epoch: the final model)"
    )


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int = Field(description="Jobs matching the filter, ignoring limit/offset")


# --- scaling studies ----------------------------------------------------------


class StudyRow(_Strict):
    """One topology of a study; the batch size is per process."""

    num_machines: int = Field(1, ge=1, le=64)
    num_processes: int = Field(ge=1, le=64)
    batch_size: int = Field(ge=1, le=65536)

    @model_validator(mode="after")
    def _world_size_within_limit(self) -> StudyRow:
        Topology(num_machines=self.num_machines, num_processes=self.num_processes)
        return self


def _default_rows() -> list[StudyRow]:
    # The recipe's table: the global batch stays 128.
    return [StudyRow(num_processes=p, batch_size=128 // p) for p in (1, 2, 4, 8)]


class StudyCreate(_Strict):
    # Its jobs are named after it plus their row (": 64 x 64, batch 65536"),
    # within a job name's 128 characters.
    name: str | None = Field(None, max_length=96)
    spec: JobSpec = Field(
        default_factory=JobSpec,
        description="The training to repeat; each row replaces its topology and batch size",
    )
    rows: list[StudyRow] = Field(default_factory=_default_rows, min_length=1, max_length=32)


class StudyRowPublic(BaseModel):
    job_id: int
    status: JobStatus
    num_machines: int
    num_processes: int
    world_size: int
    batch_size: int = Field(description="Per process")
    global_batch_size: int
    threads_per_process: int | None = None
    wall_seconds: float | None = Field(None, description="The job's running time")
    training_seconds: float | None = None
    samples_per_sec: float | None = None
    speedup: float | None = Field(None, description="First row's training time / this row's")
    efficiency: float | None = Field(None, description="speedup / (world size / first row's)")
    train_loss: float | None = None
    test_accuracy: float | None = None


class StudyPublic(BaseModel):
    id: int
    name: str | None
    status: JobStatus
    created_at: datetime
    spec: JobSpec
    rows: list[StudyRowPublic]


class StudiesPublic(BaseModel):
    data: list[StudyPublic]


class MetricPoint(BaseModel):
    epoch: int
    batch: int
    step: int = Field(description="Batches done since the start of the job")
    loss: float | None
    samples_per_sec: float | None
    at: datetime


class MetricsPublic(BaseModel):
    job_id: int
    points: list[MetricPoint]


class NodePart(BaseModel):
    job_id: int
    machine_id: int
    status: PartStatus


class NodePublic(BaseModel):
    id: int
    name: str
    address: str
    slots: int
    gpus: int
    cpus: int
    trainers: list[str]
    state: NodeState
    registered_at: datetime
    last_heartbeat_at: datetime
    parts: list[NodePart]


# --- the worker protocol ------------------------------------------------------


class NodeRegistration(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    address: str = Field(min_length=1, max_length=255, description="Where peers reach this node")
    slots: int = Field(1, ge=1, le=64, description="Job parts it runs at once")
    gpus: int = Field(0, ge=0, le=64)
    cpus: int = Field(1, ge=1, le=4096)
    trainers: list[str] = Field(default_factory=lambda: ["mnist"], max_length=64)


class NodeRegistered(BaseModel):
    node_id: int
    credential: str | None = Field(
        None,
        description="The node's own bearer token for everything after registering, shown "
        "only here. None: the caller presented the node's credential; it stays valid",
    )
    heartbeat_timeout_s: float
    poll_wait_s: float
    heartbeat_interval_s: float = Field(
        2.0, description="How often the node's heartbeat goes out, whatever else it does"
    )


class PollRequest(_Strict):
    active_part_ids: list[Id] = Field(
        default_factory=list, max_length=1024, description="Parts with processes on this node"
    )
    waiting_for_port: list[Id] = Field(
        default_factory=list,
        max_length=1024,
        description="Parts (machine > 0) whose rendezvous port this node still lacks",
    )
    wait_s: float = Field(0, ge=0, le=30, description="Long-poll: wait this long for news")


class HeartbeatRequest(_Strict):
    active_part_ids: list[Id] = Field(
        default_factory=list, max_length=1024, description="Parts with processes on this node"
    )


class HeartbeatResponse(BaseModel):
    stop: list[int] = Field(
        description="Part ids in active_part_ids whose processes must be stopped (the "
        "server settled them, or gave them to another node while this one was silent)"
    )


class Assignment(BaseModel):
    """One machine id of one attempt, for a node to run."""

    part_id: int
    job_id: int
    attempt_id: int
    machine_id: int
    spec: JobSpec
    master_addr: str
    master_port: int | None = Field(
        None,
        description="Known once machine 0's launcher has bound the rendezvous store; "
        "until then it arrives later, in a poll's `rendezvous`",
    )
    resume_epoch: int | None = Field(
        None,
        description="A retry: continue after this epoch, from the checkpoint at "
        "GET /jobs/{job_id}/model",
    )

    @property
    def world_size(self) -> int:
        return self.spec.topology.world_size


class Rendezvous(BaseModel):
    part_id: int
    master_port: int


class PollResponse(BaseModel):
    start: list[Assignment]
    stop: list[int] = Field(description="Part ids whose processes must be stopped")
    rendezvous: list[Rendezvous] = Field(
        default_factory=list, description="Ports now known for parts in `waiting_for_port`"
    )


class PartStarted(_Strict):
    node_id: Id


class RendezvousBound(_Strict):
    """Machine 0's launcher listens for the job's ranks on this port."""

    node_id: Id
    master_port: int = Field(ge=1, le=65535)


class ProgressBatch(_Strict):
    node_id: Id
    reports: list[ProgressReport] = Field(max_length=10_000)


# A longer line is cut (a progress bar redrawn with \r can make one huge line).
MAX_LOG_LINE_CHARS = 4000


class LogLine(_Strict):
    """One line a rank (or the launcher: rank null) printed. ``offset`` is
    where it starts in its file: a resent line is recognised by it."""

    rank: int | None = Field(None, ge=0, le=DB_INT_MAX)
    offset: int = Field(ge=0, le=2**62)
    text: str = Field(max_length=MAX_LOG_LINE_CHARS + 100)
    at: datetime


class LogBatch(_Strict):
    node_id: Id
    lines: list[LogLine] = Field(max_length=10_000)


class LogLinePublic(BaseModel):
    id: int = Field(description="Increasing: pass the last one seen as ?since= to get newer lines")
    machine_id: int
    rank: int | None = Field(description="The global rank; null for the machine's launcher")
    text: str
    at: datetime


class LogsPublic(BaseModel):
    lines: list[LogLinePublic]
    next_since: int = Field(description="Pass as ?since= to get only lines after these")
    job_status: JobStatus


class PartFinished(_Strict):
    node_id: Id
    status: Literal["succeeded", "failed", "cancelled"]
    exit_code: ExitCode | None = None
    failing_rank: int | None = Field(None, ge=0, le=MAX_WORLD_SIZE)
    reason: str | None = Field(None, max_length=64)
    message: str | None = Field(None, max_length=2000)
    traceback_tail: str | None = Field(None, max_length=20_000)
    result: TrainResult | None = None


class Ack(BaseModel):
    accepted: bool = True


# --- errors -------------------------------------------------------------------


class Problem(BaseModel):
    """Every 4xx but validation's 422: what went wrong, in words."""

    detail: str


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for these error statuses (422 FastAPI adds itself)."""
    meanings = {
        400: "Malformed request",
        403: "Not this node's part",
        404: "No such resource",
        409: "Not possible in its current state",
        413: "Too large",
    }
    return {status: {"model": Problem, "description": meanings[status]} for status in statuses}
