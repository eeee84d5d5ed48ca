"""The tables. Values are typed here once: status columns are the enums of
ddpo.lifecycle, JSON columns the models of ddpo.schemas (db/ imports only
those pure value modules of api/, never its logic: a test checks)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, DateTime, Integer, UniqueConstraint
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel

from db.types import EnumText, ModelJSON
from ddpo.lifecycle import JobStatus, NodeState, PartStatus, StopReason
from ddpo.schemas import JobError, JobSpec, TrainResult
from ddpo.schemas.people import AuditAction, Role
from ddpo.schemas.sweep import SweepCreate, TrialState


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """Stores UTC; reads back aware datetimes (SQLite keeps no zone)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(timezone.utc).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value


class Node(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True, unique=True)
    address: str
    slots: int = 1
    gpus: int = 0
    cpus: int = 1
    # Trainer names, what placement reads; trainer_offers has each one's
    # version and parameter schema, scripts each script's path -> SHA-256.
    trainers: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    trainer_offers: list[dict[str, Any]] = Field(
        default_factory=list, sa_column=Column(JSON, nullable=False)
    )
    scripts: dict[str, str] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    state: NodeState = Field(
        default=NodeState.LIVE, sa_column=Column(EnumText(NodeState), index=True, nullable=False)
    )
    # SHA-256 (hex) of the node's own credential; None once revoked.
    credential_digest: str | None = Field(default=None, unique=True)
    registered_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    last_heartbeat_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    # Drained (by an admin) or leaving (its worker is shutting down): it
    # takes no new part, and from the deadline on its parts' jobs are asked
    # to stop at a step and go elsewhere. None: it takes parts.
    drain_reason: StopReason | None = Field(
        default=None, sa_column=Column(EnumText(StopReason), nullable=True)
    )
    drain_requested_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    drain_deadline_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class Study(SQLModel, table=True):
    """One training run over several topologies, one job after another."""

    id: int | None = Field(default=None, primary_key=True)
    name: str | None = None
    # Who submitted it: a key's name, token:<role>, or None (auth off).
    owner: str | None = Field(default=None, index=True)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Sweep(SQLModel, table=True):
    """One spec over many hyperparameters: each trial a job (Trial)."""

    id: int | None = Field(default=None, primary_key=True)
    name: str | None = None
    owner: str | None = Field(default=None, index=True)
    # What was asked (space, objective, sampler, pruner, limits, base spec).
    create: SweepCreate = Field(sa_column=Column(ModelJSON(SweepCreate), nullable=False))
    status: JobStatus = Field(
        default=JobStatus.RUNNING,
        sa_column=Column(EnumText(JobStatus), index=True, nullable=False),
    )
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # Why it ended early, when it could not go on (a trial it could not make).
    error: str | None = None


class Trial(SQLModel, table=True):
    """One trial of a sweep: its job, its values, and what Optuna keeps of it
    (its reports and its system attributes: ASHA's rungs, the grid's point),
    so the search rebuilt from these rows after a restart, or on another
    server, goes on where it was."""

    __table_args__ = (UniqueConstraint("sweep_id", "number"),)

    id: int | None = Field(default=None, primary_key=True)
    sweep_id: int = Field(foreign_key="sweep.id", index=True)
    number: int
    job_id: int = Field(foreign_key="job.id", unique=True)
    params: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    state: TrialState = Field(
        default=TrialState.QUEUED, sa_column=Column(EnumText(TrialState), nullable=False)
    )
    # step -> the objective's report at it (null: not a number).
    reports: dict[str, float | None] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False)
    )
    system_attrs: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False)
    )
    value: float | None = None
    pruned_at_step: int | None = None
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class Job(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    name: str | None = None
    # A sweep's trial (its Trial row names the job). No foreign key: SQLite
    # cannot add one to a table that others reference without copying it.
    sweep_id: int | None = Field(default=None, index=True)
    # Jobs of a study run in study_index order, each after the one before ends.
    study_id: int | None = Field(default=None, foreign_key="study.id", index=True)
    study_index: int | None = None
    spec: JobSpec = Field(sa_column=Column(ModelJSON(JobSpec), nullable=False))
    # Set by the client: the same key submitted again returns this job.
    idempotency_key: str | None = Field(default=None, unique=True)
    status: JobStatus = Field(
        default=JobStatus.QUEUED,
        sa_column=Column(EnumText(JobStatus), index=True, nullable=False),
    )
    priority: int = 0
    # Who submitted it: a key's name, token:<role>, or None (auth off, or
    # submitted before jobs had owners). Only the owner or an admin may
    # cancel it or change its priority.
    owner: str | None = Field(default=None, index=True)
    pending_reason: str | None = None
    current_attempt_id: int | None = None
    attempt_count: int = 0
    # A job waiting to retry does not start before this (backoff).
    not_before: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # From the first start and max_run_seconds; past it the job fails.
    deadline_at: datetime | None = Field(default=None, index=True, sa_type=UTCDateTime)
    created_at: datetime = Field(default_factory=utcnow, index=True, sa_type=UTCDateTime)
    started_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # The latest progress, copied here so GET /jobs/{id} is one cheap row read.
    progress_seq: int | None = None
    progress_epoch: int | None = None
    progress_batch: int | None = None
    progress_batches_per_epoch: int | None = None
    progress_loss: float | None = None
    progress_samples_per_sec: float | None = None
    progress_step: int | None = None
    progress_epochs: int | None = None
    progress_metrics: dict[str, float | None] | None = Field(default=None, sa_column=Column(JSON))
    progress_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    result: TrainResult | None = Field(default=None, sa_column=Column(ModelJSON(TrainResult)))
    error: JobError | None = Field(default=None, sa_column=Column(ModelJSON(JobError)))
    # The newest checkpoint rank 0 saved: a file name under the artifacts
    # directory, or an artifact store's URL; its size and SHA-256 (hex; none
    # for those kept before 0007), which whoever reads it checks.
    checkpoint_epoch: int | None = None
    checkpoint_file: str | None = None
    checkpoint_bytes: int | None = None
    checkpoint_sha256: str | None = None
    # The job's MLflow run (DDPO_MLFLOW_TRACKING_URI), once made (api/core/runs.py).
    mlflow_run_id: str | None = None
    # The step the kept checkpoint was taken at, when it is a stop's within
    # an epoch (checkpoint_epoch is then the last whole epoch before it).
    checkpoint_step: int | None = None
    # Attempts that ended because the server asked them to stop (preempted,
    # drained, resized): they use none of max_restarts.
    stopped_attempts: int = Field(default=0, sa_column_kwargs={"server_default": "0"})


class Attempt(SQLModel, table=True):
    """One try at running a job. Its id is the fencing token reports must name."""

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True)
    number: int
    master_addr: str
    # Chosen by machine 0's launcher when it binds the rendezvous store (the
    # host knows which of its ports are free; the server cannot).
    master_port: int | None = None
    # Machines it runs on (None: the spec's, as every attempt before jobs
    # could change size).
    num_machines: int | None = None
    resumed_from_epoch: int | None = None
    # ... and from the step of a stop's checkpoint within the next epoch.
    resumed_from_step: int | None = None
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # Why it failed, kept when the job goes on to a new attempt.
    error: JobError | None = Field(default=None, sa_column=Column(ModelJSON(JobError)))
    # The cooperative stop: why the server asked it to stop at a step (and
    # for whom, in words: "by job 12"), and when its ranks are stopped by
    # signal instead if they have not stopped by themselves.
    stop_reason: StopReason | None = Field(
        default=None, sa_column=Column(EnumText(StopReason), nullable=True)
    )
    stop_detail: str | None = None
    stop_requested_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # Indexed: the clock looks each turn for attempts still going past it.
    stop_deadline_at: datetime | None = Field(default=None, index=True, sa_type=UTCDateTime)
    # The step its machine 0 stopped at (when it stopped at one).
    stopped_at_step: int | None = None


class Part(SQLModel, table=True):
    """One machine id of one attempt, on one node."""

    __table_args__ = (
        UniqueConstraint("attempt_id", "machine_id"),
        UniqueConstraint("attempt_id", "node_id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True)
    attempt_id: int = Field(foreign_key="attempt.id", index=True)
    machine_id: int
    node_id: int = Field(foreign_key="node.id", index=True)
    status: PartStatus = Field(
        default=PartStatus.ASSIGNED,
        sa_column=Column(EnumText(PartStatus), index=True, nullable=False),
    )
    assigned_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    started_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    exit_code: int | None = None
    failing_rank: int | None = None
    error: str | None = None


class ProgressRow(SQLModel, table=True):
    __tablename__ = "progress"
    __table_args__ = (UniqueConstraint("attempt_id", "seq"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True)
    attempt_id: int = Field(foreign_key="attempt.id")
    seq: int
    epoch: int
    batch: int
    batches_per_epoch: int
    loss: float | None = None
    samples_per_sec: float | None = None
    # The trainer's own step count, when it gave one.
    step: int | None = None
    # The other named numbers it reported.
    metrics: dict[str, float | None] | None = Field(default=None, sa_column=Column(JSON))
    at: datetime = Field(sa_type=UTCDateTime)


# The rank column of a launcher's own lines (ranks are >= 0).
LAUNCHER_RANK = -1


class LogRow(SQLModel, table=True):
    """One line of a rank's (or a launcher's) output."""

    __tablename__ = "log_line"
    __table_args__ = (UniqueConstraint("attempt_id", "machine_id", "rank", "offset"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True)
    attempt_id: int = Field(foreign_key="attempt.id")
    machine_id: int
    rank: int
    offset: int
    text: str
    at: datetime = Field(sa_type=UTCDateTime)


class ApiKey(SQLModel, table=True):
    """A person's (or a script's) key: a name and a role. The server keeps
    only the secret's digest; the secret is shown once, when made."""

    __tablename__ = "api_key"

    id: int | None = Field(default=None, primary_key=True)
    # Unique for good, revoked keys included: the audit log names keys.
    name: str = Field(unique=True)
    role: Role = Field(sa_column=Column(EnumText(Role), nullable=False))
    digest: str = Field(unique=True)  # SHA-256 (hex) of the secret
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    created_by: str | None = None
    revoked_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    revoked_by: str | None = None


class AuditRow(SQLModel, table=True):
    """Who did what, when, from where: written in the same transaction as
    the action, so no action commits without its entry."""

    __tablename__ = "audit_log"

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = Field(default_factory=utcnow, index=True, sa_type=UTCDateTime)
    actor: str | None = Field(default=None, index=True)
    role: Role | None = Field(default=None, sa_column=Column(EnumText(Role), nullable=True))
    address: str | None = None
    action: AuditAction = Field(sa_column=Column(EnumText(AuditAction), nullable=False))
    target: str
    detail: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


class ChangeCount(SQLModel, table=True):
    """How many committed write transactions changed each table (PostgreSQL:
    bumped inside the writing transaction). A server reads it in the same
    snapshot as a table it remembers (db/engine.py, memoized), so it knows
    whether another server has changed that table since, without waiting
    for that server's note. On SQLite, where one server is the only writer,
    it counts in memory instead and this table stays empty."""

    __tablename__ = "change_count"

    table_name: str = Field(primary_key=True)
    count: int = 0


# Every integer column holds 64 bits: SQLite's INTEGER does; PostgreSQL's is
# 32, so there it is BIGINT (the wire schemas allow up to DB_INT_MAX). SQLite
# keeps INTEGER: its primary keys must be exactly that to be the row id.
WIDE_INTEGER = Integer().with_variant(BigInteger(), "postgresql")
for _table in SQLModel.metadata.tables.values():
    for _column in _table.columns:
        if type(_column.type) is Integer:
            _column.type = WIDE_INTEGER
