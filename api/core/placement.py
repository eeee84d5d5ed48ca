"""Start the queued jobs that can start now: each on all its machines at
once, in the caller's transaction (the plan itself is api/scheduling.py's,
pure)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlmodel import Session

from api.core.settlement import set_job_status
from api.lifecycle import JobStatus, PendingCode
from api.scheduling import NodeCapacity, Pending, Placement, place_gang, plan
from db import queries
from db.engine import memoized
from db.models import Job, Node, utcnow
from db.queries import QueuedJob

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    placed: bool
    # The earliest time a queued job's retry backoff ends, if one is still
    # waiting for it: a plan made now says nothing about that job then.
    next_due: datetime | None


def schedule(session: Session) -> bool:
    """Start every queued job that can start now, each on all its machines
    in this one transaction. True if any started."""
    return plan_and_start(session).placed


def plan_and_start(session: Session) -> Outcome:
    now = utcnow()
    survey = survey_queue(session, queries.queued_jobs(session=session), now)
    chosen = queries.get_nodes(
        session=session,
        node_ids={
            node_id
            for decision in survey.decisions.values()
            if isinstance(decision, Placement)
            for node_id in decision.node_ids
        },
    )
    # The queue was read as a few columns: the jobs that start, and those
    # whose reason changed (a backoff's says which restart), are read whole.
    touched = {
        queued.id: decision
        for queued in survey.jobs
        if isinstance(decision := survey.decisions[queued.id], Placement)
        or (
            decision.code is not PendingCode.RETRY_BACKOFF
            and queued.pending_reason != decision.reason
        )
    }
    placed = False
    for job in queries.get_jobs(session=session, job_ids=list(touched)):
        assert job.id is not None
        decision = touched[job.id]
        if isinstance(decision, Placement):
            start(session, job, [chosen[i] for i in decision.node_ids], now)
            placed = True
        else:
            job.pending_reason = decision.reason
    return Outcome(placed, survey.next_due)


def schedule_submitted(session: Session, job: Job) -> None:
    """Placement after ``job`` joined the queue. Nothing else has changed
    since the queue was last planned (whatever frees a slot or brings a
    node plans it again), so a job that could not start even at the head of
    the line takes nothing from anyone, and the others' plan stands: only a
    job that could start now needs the whole queue planned, to see whether
    it or one before it starts. A submit into a busy cluster costs the same
    with a thousand jobs queued as with none."""
    decision = place_gang(job.spec, free_capacity(session))
    if isinstance(decision, Placement):
        schedule(session)
    else:
        job.pending_reason = decision.reason


@dataclass(frozen=True)
class QueueSurvey:
    """Every queued job in the order it is tried, and what placement makes
    of each now."""

    jobs: list[QueuedJob]
    decisions: dict[int, Placement | Pending]
    next_due: datetime | None
    # The live nodes with their free slots now; None when no job was due
    # (nothing to place: the nodes were not read).
    nodes: list[NodeCapacity] | None


def survey_queue(session: Session, jobs: list[QueuedJob], now: datetime) -> QueueSurvey:
    """What placement decides for ``jobs`` (queued, in the order tried) now.
    A pure plan (api/scheduling.py) over the nodes' free slots, after the
    jobs that wait for a retry's backoff or for their study's job before."""
    decisions: dict[int, Placement | Pending] = {}
    due: dict[int, QueuedJob] = {}
    next_due: datetime | None = None
    for job in jobs:
        if job.not_before is None or job.not_before <= now:
            due[job.id] = job
            continue
        decisions[job.id] = Pending(
            PendingCode.RETRY_BACKOFF,
            f"{job.pending_reason or 'a restart'}, once its backoff ends at "
            f"{job.not_before.isoformat(timespec='seconds')}",
        )
        if next_due is None or job.not_before < next_due:
            next_due = job.not_before
    if not due:
        return QueueSurvey(jobs, decisions, next_due, None)
    nodes = free_capacity(session)
    # A study's jobs run one after another: each waits for the one before.
    for job_id, before in queries.study_predecessors(session=session, jobs=due.values()).items():
        if not before.status.is_terminal():
            del due[job_id]
            decisions[job_id] = Pending(
                PendingCode.STUDY_ORDER,
                f"study {before.study_id}: waiting for job {before.id} to end",
                behind_job=before.id,
            )
    decisions.update(plan([(job_id, j.spec) for job_id, j in due.items()], nodes))
    return QueueSurvey(jobs, decisions, next_due, nodes)


def free_capacity(session: Session) -> list[NodeCapacity]:
    """Every live node, with the slots its active parts leave free."""
    busy = queries.active_part_counts(session=session)
    return [
        replace(node, free_slots=node.free_slots - busy[node.node_id])
        if node.node_id in busy
        else node
        for node in memoized(session, "live_nodes", (Node,), lambda: _live_nodes(session))
    ]


def _live_nodes(session: Session) -> list[NodeCapacity]:
    """Every live node, all its slots free."""
    return [
        NodeCapacity(
            node_id,
            name,
            slots,
            gpus,
            frozenset(trainers),
            scripts,
            frozenset((o["name"], o.get("version", "0")) for o in offers or ()),
        )
        for node_id, name, slots, gpus, trainers, scripts, offers in queries.live_node_capacities(
            session=session
        )
    ]


def start(session: Session, job: Job, nodes: list[Node], now: datetime) -> None:
    """A new attempt of the job, machine i on ``nodes[i]``."""
    assert job.id is not None
    job.attempt_count += 1
    attempt = queries.insert_attempt(
        session=session, job_id=job.id, number=job.attempt_count, master_addr=nodes[0].address
    )
    assert attempt.id is not None
    # A retry continues from the last whole checkpoint (one of an earlier
    # attempt: the first has none).
    attempt.resumed_from_epoch = job.checkpoint_epoch
    if job.deadline_at is None and job.spec.max_run_seconds is not None:
        job.deadline_at = now + timedelta(seconds=job.spec.max_run_seconds)
    for machine_id, node in enumerate(nodes):
        assert node.id is not None
        queries.insert_part(
            session=session,
            job_id=job.id,
            attempt_id=attempt.id,
            machine_id=machine_id,
            node_id=node.id,
        )
    job.current_attempt_id = attempt.id
    job.progress_seq = None
    job.not_before = None
    set_job_status(session, job, JobStatus.RUNNING, now)
    log.info(
        "job %d attempt %d placed on %s",
        job.id,
        attempt.number,
        ", ".join(n.name for n in nodes),
    )
