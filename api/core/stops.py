"""The cooperative stop, as the server keeps it: an attempt asked to stop
at a step says why, for whom and by when; its nodes learn it on their next
poll or heartbeat and pass it to the ranks, which agree on a step,
checkpoint there and end (each part reports ``stopped``). Settlement then
puts the job back in the queue at its place, without using a restart
(api/core/settlement.py). Ranks that have not stopped by the deadline are
stopped by signal by their node; a node that ignores the request too has
its parts stopped the plain way past the deadline and the node's grace.

Preemption, drain and resize only say why (StopReason)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlmodel import Session

from api.settings import ServerSettings
from db import queries
from db.models import Attempt, Job, Part
from ddpo.lifecycle import JobStatus, PartStatus, StopReason, move_part
from ddpo.schemas import StopRequest

log = logging.getLogger(__name__)

# Past an attempt's stop deadline, what its nodes have to signal their
# ranks (SIGTERM, then SIGKILL after their own grace) and say so, before
# the server stops waiting for them.
NODE_KILL_MARGIN_S = 30.0


def grace_of(job: Job, settings: ServerSettings) -> float:
    grace = job.spec.stop_grace_s
    return settings.stop_grace_s if grace is None else grace


def ask_to_stop(
    session: Session,
    job: Job,
    reason: StopReason,
    detail: str | None,
    now: datetime,
    settings: ServerSettings,
    within_s: float | None = None,
) -> bool:
    """Ask the job's running attempt to stop at a step and checkpoint,
    within its grace (or ``within_s``, if sooner: a leaving node's).
    False when it is not running or was asked already (the first reason
    stands)."""
    if job.status is not JobStatus.RUNNING or job.current_attempt_id is None:
        return False
    attempt = queries.get_attempt(session=session, attempt_id=job.current_attempt_id)
    if attempt is None or attempt.stop_reason is not None:
        return False
    attempt.stop_reason = reason
    attempt.stop_detail = detail
    attempt.stop_requested_at = now
    grace = grace_of(job, settings)
    if within_s is not None:
        grace = min(grace, within_s)
    attempt.stop_deadline_at = now + timedelta(seconds=grace)
    for part in queries.parts_of_attempt(session=session, attempt_id=attempt.id or 0):
        if part.status is PartStatus.ASSIGNED:
            # Not started yet: it has trained nothing, so nothing is lost
            # by stopping it outright (its node confirms it, cancelled).
            part.status = move_part(part.status, PartStatus.STOPPING)
    log.info(
        "job %d attempt %d: asked to stop at a step (%s%s) by %s",
        job.id,
        attempt.number,
        reason,
        f" {detail}" if detail else "",
        attempt.stop_deadline_at.isoformat(timespec="seconds"),
    )
    return True


def requests_for(
    session: Session, mine: list[Part], reported: set[int], now: datetime
) -> list[StopRequest]:
    """The node's running parts whose attempts are asked to stop at a step."""
    running = [p for p in mine if p.status is PartStatus.RUNNING or p.id in reported]
    running = [p for p in running if p.status in (PartStatus.ASSIGNED, PartStatus.RUNNING)]
    if not running:
        return []
    attempts = queries.get_attempts(session=session, attempt_ids=[p.attempt_id for p in running])
    requests = []
    for part in running:
        attempt = attempts.get(part.attempt_id)
        if attempt is None or not _asked(attempt):
            continue
        assert part.id is not None and attempt.stop_reason is not None
        assert attempt.stop_deadline_at is not None
        requests.append(
            StopRequest(
                part_id=part.id,
                reason=attempt.stop_reason,
                detail=attempt.stop_detail,
                grace_s=max(0.0, (attempt.stop_deadline_at - now).total_seconds()),
            )
        )
    return requests


def _asked(attempt: Attempt) -> bool:
    return (
        attempt.stop_reason is not None
        and attempt.stop_deadline_at is not None
        and attempt.finished_at is None
    )


def stop_overdue(session: Session, now: datetime) -> bool:
    """Parts whose nodes neither stopped them at a step nor by signal well
    past their attempt's deadline are asked to stop the plain way (a node
    of an older release knows no other). True if any was."""
    late = queries.attempts_past_stop_deadline(
        session=session, before=now - timedelta(seconds=NODE_KILL_MARGIN_S)
    )
    changed = False
    for attempt in late:
        for part in queries.parts_of_attempt(session=session, attempt_id=attempt.id or 0):
            if part.status in (PartStatus.ASSIGNED, PartStatus.RUNNING):
                part.status = move_part(part.status, PartStatus.STOPPING)
                changed = True
                log.warning(
                    "job %d machine %d: not stopped %g s past its stop deadline; stopping it",
                    part.job_id,
                    part.machine_id,
                    NODE_KILL_MARGIN_S,
                )
    return changed


def drain_due(session: Session, now: datetime, settings: ServerSettings) -> bool:
    """The jobs on nodes whose drain deadline has come are asked to stop at
    a step (they then start again elsewhere: a drained node takes no new
    part). True if any was asked."""
    asked = False
    for node in queries.nodes_due_to_drain(session=session, now=now):
        assert node.id is not None and node.drain_reason is not None
        parts = queries.active_parts_on_nodes(session=session, node_ids=[node.id])
        for job in queries.get_jobs(session=session, job_ids=sorted({p.job_id for p in parts})):
            reason, detail = node.drain_reason, f"node {node.name}"
            asked |= ask_to_stop(session, job, reason, detail, now, settings)
    return asked
