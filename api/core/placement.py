"""Start the queued jobs that can start now: each on all its machines at
once, in the caller's transaction (the plan itself is api/scheduling.py's,
pure)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlmodel import Session

from api.core.settlement import set_job_status
from api.lifecycle import JobStatus
from api.scheduling import NodeCapacity, Pending, Placement, plan
from db import queries
from db.engine import memoized
from db.models import Job, Node, utcnow

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
    queue = []
    next_due: datetime | None = None
    for j in queries.queued_jobs(session=session):
        if j.not_before is None or j.not_before <= now:
            queue.append(j)
        elif next_due is None or j.not_before < next_due:
            next_due = j.not_before
    if not queue:
        return Outcome(False, next_due)
    busy = queries.active_part_counts(session=session)
    capacity = [
        replace(node, free_slots=node.free_slots - busy[node.node_id])
        if node.node_id in busy
        else node
        for node in memoized(session, "live_nodes", (Node,), lambda: _live_nodes(session))
    ]
    jobs = {j.id: j for j in queue if j.id is not None}
    # A study's jobs run one after another: each waits for the one before.
    for job_id, before in queries.study_predecessors(session=session, jobs=queue).items():
        if not before.status.is_terminal():
            jobs.pop(
                job_id
            ).pending_reason = f"study {before.study_id}: waiting for job {before.id} to end"
    decisions = plan([(job_id, j.spec) for job_id, j in jobs.items()], capacity)
    chosen = queries.get_nodes(
        session=session,
        node_ids={i for d in decisions.values() if isinstance(d, Placement) for i in d.node_ids},
    )
    placed = False
    for job_id, decision in decisions.items():
        job = jobs[job_id]
        if isinstance(decision, Pending):
            job.pending_reason = decision.reason
        elif isinstance(decision, Placement):
            start(session, job, [chosen[i] for i in decision.node_ids], now)
            placed = True
    return Outcome(placed, next_due)


def _live_nodes(session: Session) -> list[NodeCapacity]:
    """Every live node, all its slots free."""
    return [
        NodeCapacity(node_id, name, slots, gpus, frozenset(trainers), scripts)
        for node_id, name, slots, gpus, trainers, scripts in queries.live_node_capacities(
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
