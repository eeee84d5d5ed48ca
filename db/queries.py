"""Queries, one function each, keyword arguments only. No decisions here:
what a status change means is decided in api/, which calls these."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Select,
    any_,
    bindparam,
    delete,
    func,
    or_,
    type_coerce,
    update,
)
from sqlalchemy import insert as sa_insert
from sqlalchemy import inspect as sa_inspect
from sqlalchemy import select as sa_select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlmodel import Session, col, select

from db.engine import kept_specs_of, note_written
from db.models import (
    ApiKey,
    Attempt,
    AuditRow,
    Job,
    LogRow,
    Node,
    Part,
    ProgressRow,
    Study,
    Sweep,
    Trial,
)
from ddpo.lifecycle import JobStatus, NodeState, PartStatus, StopReason
from ddpo.schemas import JobSpec
from ddpo.schemas.people import AuditAction
from ddpo.schemas.sweep import SweepCreate, TrialState

# Statuses whose processes may still exist: they hold a slot on their node.
ACTIVE_PART_STATUSES = tuple(s for s in PartStatus if s.is_active())


# --- jobs ---------------------------------------------------------------------


def new_job(
    *,
    spec: JobSpec,
    name: str | None,
    study_id: int | None = None,
    study_index: int | None = None,
    idempotency_key: str | None = None,
    owner: str | None = None,
    sweep_id: int | None = None,
) -> Job:
    """A job row not yet added to a session (insert_jobs adds many at once)."""
    return Job(
        spec=spec,
        name=name,
        owner=owner,
        priority=spec.priority,
        study_id=study_id,
        study_index=study_index,
        sweep_id=sweep_id,
        idempotency_key=idempotency_key,
    )


def insert_job(*, session: Session, spec: JobSpec, name: str | None, **fields: Any) -> Job:
    job = new_job(spec=spec, name=name, **fields)
    insert_jobs(session=session, jobs=[job])
    return job


def insert_jobs(*, session: Session, jobs: list[Job]) -> None:
    """Inserted, with their ids set: on PostgreSQL one statement for all of
    them (SQLAlchemy's "insertmanyvalues"); on SQLite, whose RETURNING
    order is not promised, SQLAlchemy sends a row a statement (in process:
    no round trip each). Their specs join those this server keeps decoded
    (queued_jobs): the plan the same transaction makes reads the new jobs
    first of all, and their specs are known. Copies: a kept spec must not
    move with its job's object. Keyed by id and creation time, so that an
    entry a rolled-back insert leaves names no other job."""
    session.add_all(jobs)
    session.flush()
    kept = kept_specs_of(session)
    if kept is not None:
        for job in jobs:
            kept.put((job.id, job.created_at), job.spec.model_copy(deep=True))


def jobs_by_idempotency_keys(*, session: Session, keys: set[str]) -> list[Job]:
    if not keys:
        return []
    return list(session.exec(select(Job).where(col(Job.idempotency_key).in_(keys))).all())


def jobs_past_deadline(*, session: Session, now: datetime) -> list[Job]:
    """Queued (waiting to retry) or running jobs whose time is up."""
    statement = select(Job).where(
        col(Job.deadline_at) < now, col(Job.status).in_((JobStatus.QUEUED, JobStatus.RUNNING))
    )
    return list(session.exec(statement).all())


def attempts_of_jobs(*, session: Session, job_ids: list[int]) -> list[Attempt]:
    statement = (
        select(Attempt).where(col(Attempt.job_id).in_(job_ids)).order_by(col(Attempt.number))
    )
    return list(session.exec(statement).all())


def get_job(*, session: Session, job_id: int, for_update: bool = False) -> Job | None:
    statement = select(Job).where(Job.id == job_id)
    if for_update:
        statement = statement.with_for_update()
    return session.exec(statement).first()


def list_jobs(
    *, session: Session, status: JobStatus | None, limit: int, offset: int
) -> tuple[list[Job], int]:
    filtered = select(Job)
    counted = select(func.count()).select_from(Job)
    if status is not None:
        filtered = filtered.where(Job.status == status)
        counted = counted.where(Job.status == status)
    jobs = session.exec(
        filtered.order_by(col(Job.created_at).desc(), col(Job.id).desc())
        .offset(offset)
        .limit(limit)
    ).all()
    return list(jobs), int(session.exec(counted).one())


@dataclass(frozen=True)
class QueuedJob:
    """What placement and the queue's view read of a queued job: its row's
    few columns, not the whole row (a thousand whole rows took longer to
    load than the rest of a submit)."""

    id: int
    name: str | None
    owner: str | None
    priority: int
    created_at: datetime
    not_before: datetime | None
    pending_reason: str | None
    study_id: int | None
    study_index: int | None
    spec: JobSpec


def queued_jobs(*, session: Session, locking: bool = True) -> list[QueuedJob]:
    """Queued jobs in the order they should be considered: higher priority
    first, then first in, first out. ``locking`` (placement's) takes their
    rows; a reader's look leaves them be (and sees every one). Each spec
    comes from those this server keeps decoded (a spec never changes); only
    the others are read and decoded."""
    statement = (
        sa_select(
            col(Job.id),
            col(Job.name),
            col(Job.owner),
            col(Job.priority),
            col(Job.created_at),
            col(Job.not_before),
            col(Job.pending_reason),
            col(Job.study_id),
            col(Job.study_index),
        )
        .where(col(Job.status) == JobStatus.QUEUED)
        .order_by(col(Job.priority).desc(), col(Job.created_at), col(Job.id))
    )
    if locking:
        statement = statement.with_for_update(skip_locked=True)
    rows = session.execute(statement).all()
    kept = kept_specs_of(session)
    specs: dict[int, JobSpec] = {}
    for row in rows:
        spec = kept.get((row.id, row.created_at)) if kept is not None else None
        if spec is not None:
            specs[row.id] = spec
    missing = [row for row in rows if row.id not in specs]
    for first in range(0, len(missing), _IDS_PER_STATEMENT):
        chunk = {row.id: row.created_at for row in missing[first : first + _IDS_PER_STATEMENT]}
        for job_id, spec in session.execute(
            sa_select(col(Job.id), col(Job.spec)).where(col(Job.id).in_(chunk))
        ):
            specs[job_id] = spec
            if kept is not None:
                kept.put((job_id, chunk[job_id]), spec)
    return [QueuedJob(**row._asdict(), spec=specs[row.id]) for row in rows]


def get_jobs(*, session: Session, job_ids: Sequence[int]) -> list[Job]:
    """These jobs, whole, in the order given (those that exist). Those the
    session holds already, loaded, are not read again: a read would hand
    back the same objects unchanged (the ORM does not overwrite what it
    holds), and a plan starts mostly the jobs its own transaction has just
    submitted."""
    found: dict[int, Job] = {}
    deleted = session.deleted
    for job_id in job_ids:
        held = session.identity_map.get(session.identity_key(Job, job_id))
        if (
            isinstance(held, Job)
            and not sa_inspect(held).expired_attributes
            and held not in deleted
        ):
            found[job_id] = held
    missing = [job_id for job_id in job_ids if job_id not in found]
    for first in range(0, len(missing), _IDS_PER_STATEMENT):
        chunk = missing[first : first + _IDS_PER_STATEMENT]
        for job in session.exec(select(Job).where(col(Job.id).in_(chunk))):
            assert job.id is not None
            found[job.id] = job
    return [found[job_id] for job_id in job_ids if job_id in found]


def study_predecessors(*, session: Session, jobs: Iterable[Job | QueuedJob]) -> dict[int, Job]:
    """For each study job after the first, the job of its study just before it."""
    wanted: dict[tuple[int, int], int] = {}
    for job in jobs:
        if job.study_id is not None and job.study_index and job.id is not None:
            wanted[(job.study_id, job.study_index - 1)] = job.id
    if not wanted:
        return {}
    statement = select(Job).where(col(Job.study_id).in_({study for study, _ in wanted}))
    found: dict[int, Job] = {}
    for row in session.exec(statement).all():
        if row.study_id is not None and row.study_index is not None:
            job_id = wanted.get((row.study_id, row.study_index))
            if job_id is not None:
                found[job_id] = row
    return found


# --- studies ------------------------------------------------------------------


def insert_study(*, session: Session, name: str | None, owner: str | None = None) -> Study:
    study = Study(name=name, owner=owner)
    session.add(study)
    session.flush()
    return study


def get_study(*, session: Session, study_id: int) -> Study | None:
    return session.get(Study, study_id)


def list_studies(*, session: Session, limit: int, offset: int) -> list[Study]:
    statement = (
        select(Study).order_by(col(Study.created_at).desc(), col(Study.id).desc()).offset(offset)
    )
    return list(session.exec(statement.limit(limit)).all())


def jobs_of_studies(*, session: Session, study_ids: Iterable[int]) -> list[Job]:
    ids = list(set(study_ids))
    if not ids:
        return []
    statement = select(Job).where(col(Job.study_id).in_(ids)).order_by(col(Job.study_index))
    return list(session.exec(statement).all())


# --- sweeps -------------------------------------------------------------------


def insert_sweep(*, session: Session, create: SweepCreate, owner: str | None) -> Sweep:
    sweep = Sweep(name=create.name, owner=owner, create=create)
    session.add(sweep)
    session.flush()
    return sweep


def get_sweep(*, session: Session, sweep_id: int, for_update: bool = False) -> Sweep | None:
    statement = select(Sweep).where(Sweep.id == sweep_id)
    if for_update:
        statement = statement.with_for_update()
    return session.exec(statement).first()


def list_sweeps(*, session: Session, limit: int, offset: int) -> list[Sweep]:
    statement = (
        select(Sweep).order_by(col(Sweep.created_at).desc(), col(Sweep.id).desc()).offset(offset)
    )
    return list(session.exec(statement.limit(limit)).all())


def running_sweeps(*, session: Session) -> list[Sweep]:
    statement = select(Sweep).where(Sweep.status == JobStatus.RUNNING).order_by(col(Sweep.id))
    return list(session.exec(statement).all())


def trials_of_sweeps(*, session: Session, sweep_ids: Iterable[int]) -> list[Trial]:
    ids = list(set(sweep_ids))
    if not ids:
        return []
    statement = (
        select(Trial)
        .where(col(Trial.sweep_id).in_(ids))
        .order_by(col(Trial.sweep_id), col(Trial.number))
    )
    return list(session.exec(statement).all())


def trial_counts_by_state(*, session: Session) -> dict[TrialState, int]:
    statement = select(Trial.state, func.count()).group_by(col(Trial.state))
    return {TrialState(state): count for state, count in session.exec(statement).all()}


def sweep_counts_by_status(*, session: Session) -> dict[JobStatus, int]:
    statement = select(Sweep.status, func.count()).group_by(col(Sweep.status))
    return {JobStatus(status): count for status, count in session.exec(statement).all()}


def trial_states_of_sweeps(
    *, session: Session, sweep_ids: Iterable[int]
) -> dict[int, list[TrialState]]:
    """Each sweep's trials' states (no reports, no params): what the clock
    checks each turn."""
    ids = list(set(sweep_ids))
    found: dict[int, list[TrialState]] = {}
    if not ids:
        return found
    statement = select(Trial.sweep_id, Trial.state).where(col(Trial.sweep_id).in_(ids))
    for sweep_id, state in session.exec(statement).all():
        found.setdefault(sweep_id, []).append(TrialState(state))
    return found


def trial_of_job(*, session: Session, job_id: int) -> Trial | None:
    return session.exec(select(Trial).where(Trial.job_id == job_id)).first()


def insert_trial(*, session: Session, trial: Trial) -> Trial:
    session.add(trial)
    session.flush()
    return trial


# --- attempts and parts -------------------------------------------------------


def insert_attempt(
    *,
    session: Session,
    job_id: int,
    number: int,
    master_addr: str,
    num_machines: int,
    resumed_from_epoch: int | None,
    resumed_from_step: int | None,
) -> Attempt:
    attempt = Attempt(
        job_id=job_id,
        number=number,
        master_addr=master_addr,
        num_machines=num_machines,
        resumed_from_epoch=resumed_from_epoch,
        resumed_from_step=resumed_from_step,
    )
    session.add(attempt)
    session.flush()
    return attempt


def get_attempt(*, session: Session, attempt_id: int) -> Attempt | None:
    return session.get(Attempt, attempt_id)


def get_attempts(*, session: Session, attempt_ids: Iterable[int]) -> dict[int, Attempt]:
    ids = list(set(attempt_ids))
    if not ids:
        return {}
    rows = session.exec(select(Attempt).where(col(Attempt.id).in_(ids))).all()
    return {a.id: a for a in rows if a.id is not None}


@dataclass(frozen=True)
class RunningAttempt:
    """A running job's current attempt, and the nodes its parts hold a slot on."""

    job: Job
    attempt: Attempt
    node_ids: tuple[int, ...]


# Topology.elastic (max_machines set), told apart in the database:
# decoding every running job's spec to find the few elastic ones took most
# of a busy placement's time. Built once: a JSON path expression holds
# reference cycles (its comparators), which each one built per plan would
# leave for the garbage collector's full passes, stalling the event loop.
_ELASTIC = type_coerce(col(Job.spec), JSON)["topology"]["max_machines"].as_string().is_not(None)


def running_attempts(
    *,
    session: Session,
    below_priority: int | None = None,
    stopping: bool = False,
    elastic: bool = False,
) -> list[RunningAttempt]:
    """Running jobs with their current attempts: of a priority below
    ``below_priority`` (those a job of it may preempt), only those asked
    to stop at a step (``stopping``), or only elastic ones (``elastic``)."""
    statement = (
        select(Job, Attempt)
        .join(Attempt, col(Attempt.id) == col(Job.current_attempt_id))
        .where(Job.status == JobStatus.RUNNING)
    )
    if elastic:
        statement = statement.where(_ELASTIC)
    if below_priority is not None:
        statement = statement.where(col(Job.priority) < below_priority)
    if stopping:
        statement = statement.where(col(Attempt.stop_reason).is_not(None))
    pairs = list(session.exec(statement).all())
    held: dict[int, list[int]] = {}
    if pairs:
        nodes = select(Part.attempt_id, Part.node_id).where(
            col(Part.attempt_id).in_([attempt.id for _, attempt in pairs]),
            col(Part.status).in_(ACTIVE_PART_STATUSES),
        )
        for attempt_id, node_id in session.exec(nodes).all():
            held.setdefault(attempt_id, []).append(node_id)
    return [
        RunningAttempt(job, attempt, tuple(sorted(held.get(attempt.id or 0, ()))))
        for job, attempt in pairs
    ]


def attempts_past_stop_deadline(*, session: Session, before: datetime) -> list[Attempt]:
    """Attempts asked to stop at a step that are still going at ``before``."""
    statement = select(Attempt).where(
        col(Attempt.stop_deadline_at) < before, col(Attempt.finished_at).is_(None)
    )
    return list(session.exec(statement).all())


def insert_attempts(*, session: Session, attempts: Sequence[Attempt]) -> None:
    """Inserted together, in one statement (their ids filled in): a plan
    that starts eight jobs writes their attempts at once."""
    session.add_all(attempts)
    session.flush()


def insert_parts(*, session: Session, machines: Sequence[tuple[int, int, Sequence[int]]]) -> None:
    """For each (job id, attempt id, node ids), machine i's part on
    ``node_ids[i]``: every part in one statement."""
    parts = [
        Part(job_id=job_id, attempt_id=attempt_id, machine_id=machine_id, node_id=node_id)
        for job_id, attempt_id, node_ids in machines
        for machine_id, node_id in enumerate(node_ids)
    ]
    session.add_all(parts)
    session.flush()


def get_part(*, session: Session, part_id: int, for_update: bool = False) -> Part | None:
    return session.get(Part, part_id, with_for_update=for_update)


def start_part(*, session: Session, part_id: int, node_id: int, at: datetime) -> bool:
    """Part ``part_id`` running from ``at``, in one statement, if node
    ``node_id`` holds it, it is assigned and it is of its job's running
    attempt; False if it changed nothing (whichever of those failed). A
    node's "started" is a third of a placed job's writes: one statement
    rather than reading the part and its job whole and writing the part."""
    running_attempt = (
        sa_select(col(Job.current_attempt_id))
        .where(col(Job.id) == col(Part.job_id), col(Job.status) == JobStatus.RUNNING)
        .scalar_subquery()
    )
    statement = (
        update(Part)
        .where(
            col(Part.id) == part_id,
            col(Part.node_id) == node_id,
            col(Part.status) == PartStatus.ASSIGNED,
            col(Part.attempt_id) == running_attempt,
        )
        .values(status=PartStatus.RUNNING, started_at=at)
        .returning(Part)
        .execution_options(synchronize_session=False)
    )
    started = session.execute(statement).scalars().all()
    note_written(session, started)
    return bool(started)


def parts_and_jobs(
    *, session: Session, part_ids: Iterable[int]
) -> dict[int, tuple[Part, Job, Attempt | None]]:
    """By part id: the part, its job (locked until the transaction ends) and
    the job's current attempt, in one statement for all of them: a node's
    finish reads all three, once for each placed job. While the caller
    holds the attempts, the session's ``get_attempt`` finds them without a
    query."""
    ids = list(set(part_ids))
    if not ids:
        return {}
    statement = (
        sa_select(Part, Job, Attempt)
        .join(Job, col(Job.id) == col(Part.job_id))
        .join(Attempt, col(Attempt.id) == col(Job.current_attempt_id), isouter=True)
        .where(col(Part.id).in_(ids))
        .with_for_update(of=Job)
    )
    return {row[0].id: (row[0], row[1], row[2]) for row in session.execute(statement)}


def parts_of_attempt(*, session: Session, attempt_id: int) -> list[Part]:
    statement = select(Part).where(Part.attempt_id == attempt_id).order_by(col(Part.machine_id))
    return list(session.exec(statement).all())


def parts_of_attempts(*, session: Session, attempt_ids: Iterable[int]) -> dict[int, list[Part]]:
    """parts_of_attempt for many attempts in one query (an attempt with no
    part is not a key)."""
    ids = list(set(attempt_ids))
    if not ids:
        return {}
    statement = (
        select(Part)
        .where(col(Part.attempt_id).in_(ids))
        .order_by(col(Part.attempt_id), col(Part.machine_id))
    )
    found: dict[int, list[Part]] = {}
    for part in session.exec(statement).all():
        found.setdefault(part.attempt_id, []).append(part)
    return found


def parts_with_nodes(*, session: Session, attempt_ids: Iterable[int]) -> list[tuple[Part, Node]]:
    ids = list(set(attempt_ids))
    if not ids:
        return []
    statement = (
        select(Part, Node)
        .join(Node, col(Node.id) == col(Part.node_id))
        .where(col(Part.attempt_id).in_(ids))
        .order_by(col(Part.attempt_id), col(Part.machine_id))
    )
    return [(part, node) for part, node in session.exec(statement).all()]


def active_parts_on_nodes(*, session: Session, node_ids: Iterable[int]) -> list[Part]:
    ids = list(set(node_ids))
    if not ids:
        return []
    statement = select(Part).where(
        col(Part.node_id).in_(ids), col(Part.status).in_(ACTIVE_PART_STATUSES)
    )
    return list(session.exec(statement).all())


def parts_by_ids(*, session: Session, part_ids: Iterable[int]) -> list[Part]:
    ids = list(set(part_ids))
    if not ids:
        return []
    return list(session.exec(select(Part).where(col(Part.id).in_(ids))).all())


def jobs_with_active_parts(*, session: Session, job_ids: Iterable[int]) -> set[int]:
    """Of these jobs, those with a part whose processes may still run."""
    ids = list(job_ids)
    if not ids:
        return set()
    statement = (
        select(Part.job_id)
        .where(col(Part.job_id).in_(ids), col(Part.status).in_(ACTIVE_PART_STATUSES))
        .distinct()
    )
    return set(session.exec(statement).all())


def active_part_counts(*, session: Session) -> dict[int, int]:
    statement = (
        select(Part.node_id, func.count())
        .where(col(Part.status).in_(ACTIVE_PART_STATUSES))
        .group_by(col(Part.node_id))
    )
    return {node_id: int(count) for node_id, count in session.exec(statement).all()}


# --- nodes --------------------------------------------------------------------


def get_node(*, session: Session, node_id: int) -> Node | None:
    return session.get(Node, node_id)


def get_node_by_name(*, session: Session, name: str) -> Node | None:
    return session.exec(select(Node).where(Node.name == name)).first()


def node_credentials(
    *, session: Session, node_ids: Sequence[int] | None = None
) -> list[tuple[int, str]]:
    """(node id, credential digest) of every node that has one (of those
    nodes only, if given)."""
    statement = select(Node.id, Node.credential_digest).where(
        col(Node.credential_digest).is_not(None)
    )
    if node_ids is not None:
        statement = statement.where(col(Node.id).in_(node_ids))
    return [(i, d) for i, d in session.exec(statement).all() if i is not None and d is not None]


def node_of_credential(*, session: Session, hexdigest: str) -> int | None:
    """The node whose credential has this digest (a revoked node has none)."""
    return session.exec(select(Node.id).where(Node.credential_digest == hexdigest)).first()


def count_queued_jobs_of(*, session: Session, owner: str) -> int:
    statement = (
        select(func.count())
        .select_from(Job)
        .where(Job.owner == owner, Job.status == JobStatus.QUEUED)
    )
    return int(session.exec(statement).one())


def count_unrevoked_nodes(*, session: Session) -> int:
    statement = select(func.count()).select_from(Node).where(Node.state != NodeState.REVOKED)
    return int(session.exec(statement).one() or 0)


def list_nodes(
    *, session: Session, state: NodeState | None, limit: int, offset: int
) -> tuple[list[Node], int]:
    """Oldest first, and how many match."""
    filtered = select(Node)
    counted = select(func.count()).select_from(Node)
    if state is not None:
        filtered = filtered.where(Node.state == state)
        counted = counted.where(Node.state == state)
    nodes = session.exec(filtered.order_by(col(Node.id)).offset(offset).limit(limit)).all()
    return list(nodes), int(session.exec(counted).one())


def live_node_capacities(
    *, session: Session
) -> list[tuple[int, str, str, int, int, list[str], dict[str, str], list[dict[str, Any]]]]:
    """(id, name, address, slots, gpus, trainers, scripts, trainer offers)
    of every live node: the columns placement reads, without building a row
    object for each."""
    # SQLAlchemy's own select: SQLModel's is typed for four columns at most.
    statement = (
        sa_select(  # type: ignore[call-overload]
            Node.id,
            Node.name,
            Node.address,
            Node.slots,
            Node.gpus,
            Node.trainers,
            Node.scripts,
            Node.trainer_offers,
        )
        # A drained node takes no new part.
        .where(Node.state == NodeState.LIVE, col(Node.drain_reason).is_(None))
        .order_by(col(Node.id))
    )
    return [tuple(row) for row in session.execute(statement).all()]


def nodes_due_to_drain(*, session: Session, now: datetime) -> list[Node]:
    """Live nodes being drained whose deadline has come."""
    statement = select(Node).where(
        Node.state == NodeState.LIVE,
        col(Node.drain_reason).is_not(None),
        col(Node.drain_deadline_at) <= now,
    )
    return list(session.exec(statement).all())


def live_node_offers(*, session: Session) -> list[tuple[str, list[dict[str, Any]], dict[str, str]]]:
    """(name, trainer offers, scripts) of every live node, oldest first."""
    statement = (
        sa_select(Node.name, Node.trainer_offers, Node.scripts)  # type: ignore[call-overload]
        .where(Node.state == NodeState.LIVE)
        .order_by(col(Node.id))
    )
    return [tuple(row) for row in session.execute(statement).all()]


# Ids per statement: well under SQLite's limit on bound parameters.
_IDS_PER_STATEMENT = 500


def note_heard(*, session: Session, node_ids: Sequence[int], at: datetime) -> None:
    """These nodes were heard from at ``at``. A bulk UPDATE: not a change
    placement or other servers need to hear of (db/engine.py counts and
    announces only the rows the session itself changed)."""
    for start in range(0, len(node_ids), _IDS_PER_STATEMENT):
        chunk = node_ids[start : start + _IDS_PER_STATEMENT]
        session.execute(
            update(Node)
            .where(col(Node.id).in_(chunk), col(Node.last_heartbeat_at) < at)
            .values(last_heartbeat_at=at)
            .execution_options(synchronize_session=False)
        )


def stale_live_nodes(*, session: Session, heartbeat_before: datetime) -> list[Node]:
    statement = select(Node).where(
        Node.state == NodeState.LIVE, col(Node.last_heartbeat_at) < heartbeat_before
    )
    return list(session.exec(statement).all())


def parts_never_started(*, session: Session, assigned_before: datetime) -> list[Part]:
    """Parts still waiting for their node to start them, assigned before then."""
    statement = select(Part).where(
        Part.status == PartStatus.ASSIGNED, col(Part.assigned_at) < assigned_before
    )
    return list(session.exec(statement).all())


# --- progress -----------------------------------------------------------------


def known_progress_seqs(*, session: Session, attempt_id: int, seqs: Sequence[int]) -> set[int]:
    if not seqs:
        return set()
    statement = select(ProgressRow.seq).where(
        ProgressRow.attempt_id == attempt_id, col(ProgressRow.seq).in_(list(seqs))
    )
    return set(session.exec(statement).all())


def insert_progress(*, session: Session, rows: Iterable[ProgressRow]) -> None:
    session.add_all(list(rows))


def progress_of_job(*, session: Session, job_id: int) -> list[ProgressRow]:
    statement = (
        select(ProgressRow)
        .where(ProgressRow.job_id == job_id)
        .order_by(col(ProgressRow.attempt_id), col(ProgressRow.seq))
    )
    return list(session.exec(statement).all())


# --- logs -----------------------------------------------------------------------


def known_log_offsets(
    *, session: Session, attempt_id: int, machine_id: int, offsets: Sequence[int]
) -> set[tuple[int, int]]:
    """(rank, offset) pairs of these offsets already stored for the machine."""
    if not offsets:
        return set()
    wanted = sorted(set(offsets))
    if _on_postgresql(session):
        # One array, not 10,000 parameters: built, sent and planned one by
        # one they cost more than the batch's insert. (Asked by the batch's
        # span instead, a node's two lines could make the server read all
        # of a job's kept lines.)
        among = col(LogRow.offset) == any_(bindparam("offsets", wanted, type_=ARRAY(BigInteger)))
    else:
        among = col(LogRow.offset).in_(wanted)
    statement = select(LogRow.rank, LogRow.offset).where(
        LogRow.attempt_id == attempt_id, LogRow.machine_id == machine_id, among
    )
    return {(rank, offset) for rank, offset in session.exec(statement).all()}


def _on_postgresql(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


_LOG_COLUMNS = ("job_id", "attempt_id", "machine_id", "rank", "offset", "text", "at")


def insert_logs(
    *,
    session: Session,
    job_id: int,
    attempt_id: int,
    machine_id: int,
    lines: Iterable[tuple[int, int, str, datetime]],
) -> None:
    """One machine's lines, each (rank, offset, text, at), without an ORM
    object per line (3.1x as long on SQLite). On PostgreSQL one ``COPY``:
    psycopg sends an executemany as a statement per row, and a batch of
    10,000 waited a second on the server (BENCHMARKS.md, "Log lines in
    bulk")."""
    rows = [
        (job_id, attempt_id, machine_id, rank, offset, text, _naive_utc(at))
        for rank, offset, text, at in lines
    ]
    if not rows:
        return
    if _on_postgresql(session):
        columns = ", ".join(f'"{name}"' for name in _LOG_COLUMNS)
        # The session's own connection: the lines commit with the rest.
        driver = session.connection().connection.driver_connection
        statement = f"COPY {LogRow.__tablename__} ({columns}) FROM STDIN"
        with driver.cursor() as cursor, cursor.copy(statement) as copy:  # type: ignore[union-attr]
            for row in rows:
                copy.write_row(row)
    else:
        values = [dict(zip(_LOG_COLUMNS, row, strict=True)) for row in rows]
        session.execute(sa_insert(LogRow), values)
    # No flush sees these rows: without this, a job's lines read while it
    # runs (api/read_cache.py) were answered from before them.
    note_written(session, [LogRow])


def _naive_utc(at: datetime) -> datetime:
    """As ``UTCDateTime`` stores a time, for a statement that bypasses it."""
    return at.astimezone(timezone.utc).replace(tzinfo=None) if at.tzinfo is not None else at


def logs_of_job(
    *,
    session: Session,
    job_id: int,
    since: int,
    machine_id: int | None,
    rank: int | None,
    limit: int,
    newest: bool,
) -> list[LogRow]:
    """Lines after id ``since``, oldest first: the first ``limit`` of them, or
    with ``newest`` the last ``limit``."""
    statement = select(LogRow).where(LogRow.job_id == job_id, col(LogRow.id) > since)
    if machine_id is not None:
        statement = statement.where(LogRow.machine_id == machine_id)
    if rank is not None:
        statement = statement.where(LogRow.rank == rank)
    order = col(LogRow.id).desc() if newest else col(LogRow.id)
    rows = list(session.exec(statement.order_by(order).limit(limit)).all())
    return rows[::-1] if newest else rows


# --- counts for monitoring ------------------------------------------------------


def job_counts_by_status(*, session: Session) -> dict[JobStatus, int]:
    statement = select(Job.status, func.count()).group_by(col(Job.status))
    return {JobStatus(status): count for status, count in session.exec(statement).all()}


def stop_counts_by_reason(*, session: Session) -> dict[StopReason, int]:
    """Attempts the server asked to stop at a step, by why."""
    statement = (
        select(Attempt.stop_reason, func.count())
        .where(col(Attempt.stop_reason).is_not(None))
        .group_by(col(Attempt.stop_reason))
    )
    return {StopReason(reason): count for reason, count in session.exec(statement).all()}


def count_draining_nodes(*, session: Session) -> int:
    statement = select(func.count()).select_from(Node).where(col(Node.drain_reason).is_not(None))
    return int(session.exec(statement).one())


def node_counts_by_state(*, session: Session) -> dict[NodeState, int]:
    statement = select(Node.state, func.count()).group_by(col(Node.state))
    return {NodeState(state): count for state, count in session.exec(statement).all()}


def part_count(*, session: Session) -> int:
    """Every machine id ever handed to a node: the claims made."""
    return int(session.exec(select(func.count()).select_from(Part)).one())


# --- retention ----------------------------------------------------------------

ENDED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


def expire_idempotency_keys(*, session: Session, created_before: datetime) -> int:
    """Free the keys of jobs made before then; how many."""
    statement = (
        update(Job)
        .where(col(Job.idempotency_key).is_not(None), col(Job.created_at) < created_before)
        .values(idempotency_key=None)
    )
    return int(session.execute(statement).rowcount or 0)  # type: ignore[attr-defined]


def jobs_ended_before(*, session: Session, before: datetime) -> list[int]:
    statement = select(col(Job.id)).where(col(Job.status).in_(ENDED), col(Job.finished_at) < before)
    return [i for i in session.exec(statement).all() if i is not None]


def jobs_over_log_cap(*, session: Session, after: datetime, keep: int) -> list[int]:
    """Jobs active or ended since ``after`` that hold more than ``keep``
    log lines, in one statement: asked one job at a time, a cluster that
    ended thousands of jobs in the hour held the writer for thousands of
    statements at every prune."""
    recent = sa_select(col(Job.id)).where(
        or_(col(Job.status).not_in(ENDED), col(Job.finished_at) >= after)
    )
    statement = (
        sa_select(col(LogRow.job_id))
        .where(col(LogRow.job_id).in_(recent))
        .group_by(col(LogRow.job_id))
        .having(func.count() > keep)
    )
    return list(session.execute(statement).scalars())


def _delete_rows(session: Session, table: type[LogRow] | type[ProgressRow], ids: Select) -> int:  # type: ignore[type-arg]
    statement = delete(table).where(col(table.id).in_(ids.scalar_subquery()))
    deleted = int(session.execute(statement).rowcount or 0)  # type: ignore[attr-defined]
    if deleted:
        note_written(session, [table])
    return deleted


def delete_logs_of_jobs(*, session: Session, job_ids: list[int], limit: int) -> int:
    if not job_ids:
        return 0
    ids = sa_select(col(LogRow.id)).where(col(LogRow.job_id).in_(job_ids)).limit(limit)
    return _delete_rows(session, LogRow, ids)


def delete_progress_of_jobs(*, session: Session, job_ids: list[int], limit: int) -> int:
    if not job_ids:
        return 0
    ids = sa_select(col(ProgressRow.id)).where(col(ProgressRow.job_id).in_(job_ids)).limit(limit)
    return _delete_rows(session, ProgressRow, ids)


def delete_logs_beyond(*, session: Session, job_id: int, keep: int, limit: int) -> int:
    """Delete the job's oldest lines beyond its newest ``keep`` (at most ``limit``)."""
    newest_dropped = session.exec(
        select(col(LogRow.id))
        .where(LogRow.job_id == job_id)
        .order_by(col(LogRow.id).desc())
        .offset(keep)
        .limit(1)
    ).first()
    if newest_dropped is None:
        return 0
    ids = (
        sa_select(col(LogRow.id))
        .where(col(LogRow.job_id) == job_id, col(LogRow.id) <= newest_dropped)
        .limit(limit)
    )
    return _delete_rows(session, LogRow, ids)


def ended_jobs_with_checkpoints(*, session: Session) -> list[Job]:
    """Ended jobs that still keep a checkpoint file, most recently ended first."""
    statement = (
        select(Job)
        .where(col(Job.status).in_(ENDED), col(Job.checkpoint_file).is_not(None))
        .order_by(col(Job.finished_at).desc(), col(Job.id).desc())
    )
    return list(session.exec(statement).all())


def checkpoint_bytes_kept(*, session: Session) -> int:
    statement = select(func.coalesce(func.sum(Job.checkpoint_bytes), 0)).where(
        col(Job.checkpoint_file).is_not(None)
    )
    return int(session.exec(statement).one() or 0)


# --- people -------------------------------------------------------------------


def insert_key(*, session: Session, key: ApiKey) -> ApiKey:
    session.add(key)
    session.flush()
    return key


def get_key(*, session: Session, key_id: int, for_update: bool = False) -> ApiKey | None:
    return session.get(ApiKey, key_id, with_for_update=for_update)


def get_key_by_name(*, session: Session, name: str) -> ApiKey | None:
    return session.exec(select(ApiKey).where(ApiKey.name == name)).first()


def list_keys(*, session: Session) -> list[ApiKey]:
    return list(session.exec(select(ApiKey).order_by(col(ApiKey.id))).all())


def live_keys(*, session: Session) -> list[ApiKey]:
    """Every key not revoked."""
    statement = select(ApiKey).where(col(ApiKey.revoked_at).is_(None))
    return list(session.exec(statement).all())


def live_key_of(*, session: Session, hexdigest: str) -> ApiKey | None:
    statement = select(ApiKey).where(ApiKey.digest == hexdigest, col(ApiKey.revoked_at).is_(None))
    return session.exec(statement).first()


def insert_audit(*, session: Session, row: AuditRow) -> None:
    session.add(row)


def audit_entries(
    *,
    session: Session,
    limit: int,
    before: int | None = None,
    actor: str | None = None,
    action: AuditAction | None = None,
    target: str | None = None,
) -> list[AuditRow]:
    """Newest first (by id: the order they committed in, near enough)."""
    statement = select(AuditRow).order_by(col(AuditRow.id).desc())
    if before is not None:
        statement = statement.where(col(AuditRow.id) < before)
    if actor is not None:
        statement = statement.where(AuditRow.actor == actor)
    if action is not None:
        statement = statement.where(AuditRow.action == action)
    if target is not None:
        statement = statement.where(AuditRow.target == target)
    return list(session.exec(statement.limit(limit)).all())
