"""What users read: jobs, studies, nodes, metrics, logs, and the shape of
every error."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from ddpo.lifecycle import JobStatus, NodeState, PartStatus, PendingCode, StopReason
from ddpo.schemas.spec import JobError, JobSpec, TrainResult
from ddpo.schemas.strict import Strict


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
    step: int | None = Field(None, description="The trainer's own step count, if it gave one")
    metrics: dict[str, float | None] = Field(
        default_factory=dict, description="The other named numbers rank 0 reported last"
    )
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


# The longest a drain may wait for a node's parts (a week).
MAX_DRAIN_S = 7 * 24 * 3600.0


class CheckpointPublic(BaseModel):
    epoch: int = Field(description="The epochs it holds whole")
    step: int | None = Field(
        None, description="A stop's checkpoint: the step it was taken after, in the next epoch"
    )
    size_bytes: int
    url: str = Field(description="GET it: a torch.save'd dict; its 'model' is the state_dict")


class StopPublic(BaseModel):
    """The server asked the attempt to stop at a step and checkpoint."""

    reason: StopReason
    detail: str | None = Field(None, description='For whom, in words: "by job 12"')
    requested_at: datetime
    deadline_at: datetime = Field(
        description="Ranks not stopped by then are stopped by signal (SIGTERM, then SIGKILL)"
    )


class AttemptPublic(BaseModel):
    number: int
    started_at: datetime
    finished_at: datetime | None = None
    num_machines: int = Field(description="Machines it ran on (an elastic job's vary)")
    world_size: int = Field(description="Ranks in this attempt")
    global_batch: int = Field(
        description="Samples per step over every rank: batch_size (per process) x world size"
    )
    resumed_from_epoch: int | None = Field(None, description="The checkpoint it started from")
    resumed_from_step: int | None = Field(
        None, description="... a stop's, within the next epoch: the step it resumed after"
    )
    error: JobError | None = Field(None, description="Why it ended, if it failed")
    stop: StopPublic | None = Field(None, description="Asked to stop at a step, why and by when")
    stopped_at_step: int | None = Field(None, description="The step its ranks stopped after")
    ended: str | None = Field(
        None,
        description='Why it ended, in words: "succeeded", "preempted by job 12, stopped '
        'after step 340", "failed: node_lost"; none while it runs',
    )


class PendingPublic(BaseModel):
    """Why a queued job is not running: a code, the numbers behind it, and
    the sentence."""

    code: PendingCode
    reason: str
    nodes_needed: int = Field(description="Live nodes it needs, one free slot on each")
    nodes_suitable: int = Field(
        description="Live nodes with what it needs (its trainer or script, GPUs for nccl)"
    )
    nodes_free: int = Field(description="Of those, the ones with a free slot now")
    nodes_live: int = Field(description="Every live node")
    behind_job: int | None = Field(
        None, description="The job it waits for (queued_behind, study_order)"
    )
    preempting: list[int] = Field(
        default_factory=list,
        description="The running jobs of a lower priority it is stopping to make room "
        "(preempting): they stop at a step, checkpoint and requeue",
    )


class NeedsPublic(BaseModel):
    nodes: int
    slots_per_node: int = 1
    gpus_per_node: int = Field(description="For nccl, a GPU per process")
    trainer: str | None = None
    script: str | None = None


class QueuedJobPublic(BaseModel):
    position: int = Field(description="1 is tried first")
    job_id: int
    name: str | None
    owner: str | None = Field(
        None, description="Who submitted it: a key's name, token:<role>, null with auth off"
    )
    priority: int
    created_at: datetime
    needs: NeedsPublic
    pending: PendingPublic


class QueuePublic(BaseModel):
    data: list[QueuedJobPublic] = Field(description="Every queued job, in the order tried")
    count: int
    nodes_live: int
    slots_free: int = Field(description="Free slots on the live nodes, all together")


class JobPublic(BaseModel):
    id: int
    name: str | None
    owner: str | None = Field(
        None, description="Who submitted it: a key's name, token:<role>, null with auth off"
    )
    status: JobStatus
    pending_reason: str | None = Field(None, description="Why a queued job is not running")
    priority: int = Field(
        description="Its priority now (the spec's, unless changed since with PATCH /jobs/{id})"
    )
    queue_position: int | None = Field(None, description="While queued: 1 is tried first")
    pending: PendingPublic | None = Field(None, description="While queued: why, with numbers")
    sweep_id: int | None = Field(None, description="The sweep it is a trial of (GET /sweeps/{id})")
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
    owner: str | None = Field(
        None, description="Who submitted it: a key's name, token:<role>, null with auth off"
    )
    status: JobStatus
    created_at: datetime
    spec: JobSpec
    rows: list[StudyRowPublic]


class StudiesPublic(BaseModel):
    data: list[StudyPublic]


class MetricPoint(BaseModel):
    epoch: int
    batch: int
    step: int = Field(
        description="The trainer's own step count, else batches done since the job's start"
    )
    loss: float | None
    samples_per_sec: float | None
    metrics: dict[str, float | None] = Field(
        default_factory=dict, description="Any other named numbers the trainer reported"
    )
    at: datetime


class MetricsPublic(BaseModel):
    job_id: int
    names: list[str] = Field(
        description="Every metric in `points`: loss and samples_per_sec when reported, then "
        "the trainer's own, in the order they first appear"
    )
    points: list[MetricPoint]


class NodePart(BaseModel):
    job_id: int
    machine_id: int
    status: PartStatus


class DrainPublic(BaseModel):
    """The node takes no new part; its parts' jobs stop at a step from the deadline on."""

    reason: StopReason = Field(description="drained (by an admin) or node_leaving (its worker)")
    requested_at: datetime
    deadline_at: datetime


class NodeDrain(Strict):
    deadline_s: float = Field(
        0,
        ge=0,
        le=MAX_DRAIN_S,
        allow_inf_nan=False,
        description="How long its parts run on before their jobs are asked to stop at a "
        "step and go elsewhere (0: at once)",
    )


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
    drain: DrainPublic | None = Field(
        None, description="Being drained, or drained: it takes no new part until undrained"
    )


class NodesPublic(BaseModel):
    data: list[NodePublic]
    count: int = Field(description="Nodes matching the filter, ignoring limit/offset")


class TrainerPublic(BaseModel):
    """One version of a trainer, as the live nodes that have it reported it."""

    name: str
    version: str
    params_schema: dict[str, Any] | None = Field(
        description="JSON schema of its `params`; null: it declares none"
    )
    nodes: list[str] = Field(description="Live nodes that offer it, by name")


class ScriptPublic(BaseModel):
    path: str = Field(description="Relative to the nodes' --script-dir")
    sha256: str
    nodes: list[str] = Field(description="Live nodes that have this content at this path, by name")


class TrainersPublic(BaseModel):
    trainers: list[TrainerPublic]
    scripts: list[ScriptPublic]


class LogLinePublic(BaseModel):
    id: int = Field(description="Increasing: pass the last one seen as ?since= to get newer lines")
    machine_id: int
    rank: int | None = Field(description="The global rank; null for the machine's launcher")
    text: str
    at: datetime


class LogsPublic(BaseModel):
    lines: list[LogLinePublic] = Field(
        description="Up to limit lines and about 1 MiB: page on with next_since"
    )
    next_since: int = Field(description="Pass as ?since= to get only lines after these")
    job_status: JobStatus


# --- errors -------------------------------------------------------------------


class FieldProblem(BaseModel):
    """One thing wrong with a request, as a 422 lists them."""

    type: str
    loc: list[str | int] = Field(description="Where: body, query or path, then the field")
    msg: str = Field(description="Starts with the field's dotted name")
    ctx: dict[str, str] | None = None


class Problem(BaseModel):
    """Every refusal: what went wrong, in words; a 422 from checking the
    request's fields lists them, one entry per problem."""

    detail: str | list[FieldProblem]


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for these error statuses (422 FastAPI adds itself)."""
    meanings = {
        400: "Malformed request",
        403: "Not this node's part",
        404: "No such resource",
        409: "Not possible in its current state",
        413: "Too large",
        429: "Too many at once: try again after Retry-After seconds",
        503: "A service the server depends on (the artifact store) is unavailable: try again",
    }
    return {status: {"model": Problem, "description": meanings[status]} for status in statuses}
