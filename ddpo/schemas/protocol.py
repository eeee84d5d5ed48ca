"""The worker protocol: what nodes and the server say to each other."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag, ValidationInfo, field_validator
from pydantic import Strict as PydanticStrict

from ddpo.failures import FailureReason
from ddpo.lifecycle import StopReason
from ddpo.schemas import params_schema
from ddpo.schemas.spec import (
    MAX_STOP_GRACE_S,
    SCRIPT_PATH_PATTERN,
    SHA256_PATTERN,
    JobSpec,
    TrainResult,
)
from ddpo.schemas.strict import (
    DB_INT_MAX,
    MAX_WORLD_SIZE,
    NAME_PATTERN,
    Count,
    ExitCode,
    Id,
    Strict,
    Timestamp,
)

# GET /jobs/{id}/model's header with the checkpoint's SHA-256 (hex), when kept
# with one: whoever downloads it checks what arrived.
CHECKPOINT_SHA256_HEADER = "x-ddpo-checkpoint-sha256"

# A metric's name, as a report and the API spell it.
METRIC_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}$"
MAX_METRICS = 32
MetricName = Annotated[str, Field(pattern=METRIC_NAME_PATTERN)]


def report_step(step: int | None, epoch: int, batch: int, batches_per_epoch: int) -> int:
    """A report's step on a chart: the trainer's own count, else the batches
    done since the job's start."""
    return step if step is not None else (epoch - 1) * batches_per_epoch + batch


class ProgressReport(Strict):
    """One report from rank 0. ``seq`` makes a resent report harmless."""

    seq: Count
    step: Count | None = Field(
        None, description="The trainer's own step count; none: counted from epoch and batch"
    )
    epoch: int = Field(ge=1, le=DB_INT_MAX)
    batch: int = Field(ge=0, le=DB_INT_MAX, description="Batches done in this epoch")
    batches_per_epoch: int = Field(ge=1, le=DB_INT_MAX)
    epochs: int | None = Field(
        None, ge=1, le=DB_INT_MAX, description="Epochs the run has, if not the spec's (a script)"
    )
    loss: float | None = Field(None, description="Non-finite (diverged) losses read as null")
    samples_per_sec: float | None = Field(None, ge=0, allow_inf_nan=False)
    metrics: dict[MetricName, Annotated[float, PydanticStrict()] | None] = Field(
        default_factory=dict,
        max_length=MAX_METRICS,
        description="Any other named numbers (non-finite ones read as null)",
    )
    at: Timestamp

    @field_validator("metrics")
    @classmethod
    def _non_finite_as_null(cls, value: dict[str, float | None]) -> dict[str, float | None]:
        return {k: v if v is None or math.isfinite(v) else None for k, v in value.items()}


class TrainerOffer(Strict):
    """A trainer a node has: its name, version and the JSON schema of its
    parameters (none: it declares none, and the server checks nothing)."""

    name: str = Field(pattern=NAME_PATTERN)
    version: str = Field("0", min_length=1, max_length=64)
    params_schema: dict[str, Any] | None = None

    @field_validator("params_schema")
    @classmethod
    def _schema_safe(
        cls, value: dict[str, Any] | None, info: ValidationInfo
    ) -> dict[str, Any] | None:
        # A node's schema is data: checked here, before anything keeps or uses it.
        if value is not None:
            try:
                params_schema.check(value)
            except params_schema.SchemaRefused as exc:
                raise ValueError(f"trainer {info.data.get('name')!r}: {exc}") from None
        return value


class ScriptOffer(Strict):
    """A script in a node's script directory, by its path there."""

    path: str = Field(max_length=255, pattern=SCRIPT_PATH_PATTERN)
    sha256: str = Field(pattern=SHA256_PATTERN)


def _only_mnist() -> list[TrainerOffer | str]:
    return ["mnist"]


class NodeRegistration(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    address: str = Field(
        min_length=1,
        max_length=255,
        # A host name or an IP address (IPv6 in brackets or with a zone too):
        # no spaces or control characters to forge a log line or a table row.
        pattern=r"^[A-Za-z0-9._:%\[\]-]+$",
        description="Where peers reach this node: a host name or an IP address",
    )
    slots: int = Field(1, ge=1, le=64, description="Job parts it runs at once")
    gpus: int = Field(0, ge=0, le=64)
    cpus: int = Field(1, ge=1, le=4096)
    trainers: list[
        Annotated[
            Annotated[TrainerOffer, Tag("offer")]
            | Annotated[str, Tag("name"), Field(pattern=NAME_PATTERN)],
            # One kind per item, so a refusal names what is wrong with it alone.
            Discriminator(lambda item: "name" if isinstance(item, str) else "offer"),
        ]
    ] = Field(
        default_factory=_only_mnist,
        max_length=64,
        description="The trainers it offers (a bare name: one with no declared parameters)",
    )
    scripts: list[ScriptOffer] = Field(
        default_factory=list, max_length=1024, description="The scripts in its --script-dir"
    )

    @property
    def offers(self) -> list[TrainerOffer]:
        """``trainers``, every one an offer: a bare name (what nodes said
        before trainers had schemas) offers one with no declared parameters."""
        return [t if isinstance(t, TrainerOffer) else TrainerOffer(name=t) for t in self.trainers]


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


class PollRequest(Strict):
    active_part_ids: list[Id] = Field(
        default_factory=list, max_length=1024, description="Parts with processes on this node"
    )
    waiting_for_port: list[Id] = Field(
        default_factory=list,
        max_length=1024,
        description="Parts (machine > 0) whose rendezvous port this node still lacks",
    )
    asked_to_stop: list[Id] = Field(
        default_factory=list,
        max_length=1024,
        description="Parts this node knows are asked to stop at a step (not news again)",
    )
    wait_s: float = Field(0, ge=0, le=30, description="Long-poll: wait this long for news")


class HeartbeatRequest(Strict):
    active_part_ids: list[Id] = Field(
        default_factory=list, max_length=1024, description="Parts with processes on this node"
    )


class StopRequest(BaseModel):
    """The cooperative stop: the part's ranks should stop at their next
    agreed step, checkpoint there and end (reported ``stopped``); if they
    have not within ``grace_s`` seconds, the node stops them by signal."""

    part_id: int
    reason: StopReason
    detail: str | None = Field(None, description='For whom, in words: "by job 12"')
    grace_s: float = Field(description="Seconds left, from when this answer was made")


class HeartbeatResponse(BaseModel):
    stop: list[int] = Field(
        description="Part ids in active_part_ids whose processes must be stopped (the "
        "server settled them, or gave them to another node while this one was silent)"
    )
    checkpoint_and_stop: list[StopRequest] = Field(
        default_factory=list, description="Parts asked to stop at a step (cooperatively)"
    )


class StoredObject(BaseModel):
    """A checkpoint in the artifact store: where, its size, its SHA-256."""

    url: str
    size: int
    sha256: str | None = Field(None, description="Hex; none for those kept before 0.7")


class TrackingRun(BaseModel):
    """Where a job's ranks log to MLflow: MLFLOW_TRACKING_URI, MLFLOW_RUN_ID."""

    tracking_uri: str | None
    run_id: str | None = Field(
        None, description="None until made: the node asks POST /parts/{part_id}/tracking-run"
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
    resume_step: int | None = Field(
        None,
        description="... from that checkpoint's step, within the next epoch (the job was "
        "stopped there on request)",
    )
    checkpoint_store: str | None = Field(
        None,
        description="Machine 0 writes its checkpoints under this URL (the job's folder in "
        "the artifact store) and records them at POST /parts/{part_id}/checkpoint/stored; "
        "with none, or if it cannot, it uploads them to PUT /parts/{part_id}/checkpoint",
    )
    resume_object: StoredObject | None = Field(
        None,
        description="A retry's checkpoint when the artifact store holds it: read from there "
        "directly (or, if the node cannot, from GET /jobs/{job_id}/model), its digest checked",
    )
    tracking: TrackingRun | None = Field(
        None,
        description="The job's MLflow run, given to its ranks; with no run_id yet, the node "
        "asks for it (POST /parts/{part_id}/tracking-run) before it starts them",
    )
    restart_count: int = Field(0, description="Attempts before this one (torchrun's restarts)")

    @property
    def world_size(self) -> int:
        return self.spec.topology.world_size

    def rank_of(self, local_index: int) -> int:
        """The global rank of this machine's ``local_index``-th process."""
        return self.machine_id * self.spec.topology.num_processes + local_index


class Rendezvous(BaseModel):
    part_id: int
    master_port: int


class PollResponse(BaseModel):
    start: list[Assignment]
    stop: list[int] = Field(description="Part ids whose processes must be stopped")
    checkpoint_and_stop: list[StopRequest] = Field(
        default_factory=list, description="Parts asked to stop at a step (cooperatively)"
    )
    rendezvous: list[Rendezvous] = Field(
        default_factory=list, description="Ports now known for parts in `waiting_for_port`"
    )


class NodeLeaving(Strict):
    """A node's worker is shutting down: its parts have this long to stop
    at a step and checkpoint."""

    grace_s: float = Field(ge=0, le=MAX_STOP_GRACE_S, allow_inf_nan=False)


class PartStarted(Strict):
    node_id: Id


class RendezvousBound(Strict):
    """Machine 0's launcher listens for the job's ranks on this port."""

    node_id: Id
    master_port: int = Field(ge=1, le=65535)


class CheckpointStored(Strict):
    """Machine 0 wrote rank 0's checkpoint to the artifact store itself:
    the server checks that the object is the job's and of this size, and
    keeps the record (no bytes pass through it)."""

    node_id: Id
    epoch: int = Field(ge=1, le=DB_INT_MAX)
    step: int | None = Field(
        None, ge=0, le=DB_INT_MAX, description="A stop's checkpoint: taken after this step"
    )
    url: str = Field(min_length=1, max_length=2048)
    size: int = Field(ge=1, le=2**62)
    sha256: str = Field(pattern=SHA256_PATTERN)


class ProgressBatch(Strict):
    node_id: Id
    reports: list[ProgressReport] = Field(max_length=10_000)


# A longer line is cut (a progress bar redrawn with \r can make one huge line).
MAX_LOG_LINE_CHARS = 4000


class LogLine(Strict):
    """One line a rank (or the launcher: rank null) printed. ``offset`` is
    where it starts in its file: a resent line is recognised by it."""

    rank: int | None = Field(None, ge=0, le=DB_INT_MAX)
    offset: int = Field(ge=0, le=2**62)
    text: str = Field(max_length=MAX_LOG_LINE_CHARS + 100)
    at: Timestamp


# Log lines in one report at most (and what a node may send at once).
MAX_LOG_LINES_PER_BATCH = 10_000


class LogBatch(Strict):
    node_id: Id
    lines: list[LogLine] = Field(max_length=MAX_LOG_LINES_PER_BATCH)


class PartFinished(Strict):
    node_id: Id
    status: Literal["succeeded", "failed", "cancelled", "stopped"] = Field(
        description="stopped: asked to stop at a step, its ranks did and checkpointed"
    )
    step: Count | None = Field(None, description="stopped: the step its ranks stopped after")
    exit_code: ExitCode | None = None
    failing_rank: int | None = Field(None, ge=0, le=MAX_WORLD_SIZE)
    reason: FailureReason | None = None
    message: str | None = Field(None, max_length=2000)
    traceback_tail: str | None = Field(None, max_length=20_000)
    result: TrainResult | None = None


class Ack(BaseModel):
    accepted: bool = True
