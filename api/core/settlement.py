"""What a job becomes after something happened to it: cancelled, a part
lost, a part ended. A failure either queues the job's next attempt (a
retryable reason with restarts and time left) or fails it; every other
part of the attempt is then asked to stop. Status changes go through
ddpo/lifecycle.py."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlmodel import Session

from api import elastic
from api.core import lookup, trials
from api.settings import ServerSettings
from db import queries
from db.models import Attempt, Job, Node, Part
from ddpo.failures import FailureReason, names_the_cause
from ddpo.lifecycle import (
    JobStatus,
    PartStatus,
    StopReason,
    backoff_seconds,
    describe_stop,
    move_job,
    move_part,
    settle_job,
)
from ddpo.schemas import JobError

log = logging.getLogger(__name__)


def cancel(session: Session, job: Job, now: datetime, settings: ServerSettings) -> None:
    was = job.status
    if was is JobStatus.QUEUED:
        set_job_status(session, job, JobStatus.CANCELLED, now)
    elif was is JobStatus.RUNNING:
        set_job_status(session, job, JobStatus.CANCELLING, now)
        stop_active_parts(session, job)
        settle(session, job, now, settings)
    log.info("job %d: cancel requested (was %s)", job.id, was.value)


def lose_parts(
    session: Session,
    parts: Iterable[Part],
    nodes: dict[int, Node],
    reason: FailureReason,
    what: str,
    now: datetime,
    settings: ServerSettings,
) -> None:
    """The parts' node is gone (``what`` it did: "stopped heartbeating"):
    the parts are lost, and their jobs settle."""
    for part in parts:
        part.status = move_part(part.status, PartStatus.LOST)
        part.finished_at = now
        node = nodes[part.node_id]
        part.error = f"node {node.name} {what}"
        job = lookup.job(session, part.job_id, for_update=True)
        if job.current_attempt_id != part.attempt_id:
            continue
        if may_explain(job, reason):
            job.error = JobError(
                reason=reason,
                message=f"node {node.name} (machine {part.machine_id}) {what}",
                machine_id=part.machine_id,
                node=node.name,
            )
        settle(session, job, now, settings)


def may_explain(job: Job, reason: FailureReason) -> bool:
    """Whether a failure with this reason should become the job's error: the
    first one, unless that only said a peer went away and this one says why."""
    if job.status in (JobStatus.CANCELLING, JobStatus.CANCELLED):
        return False
    return names_the_cause(reason, job.error.reason if job.error else None)


def settle(
    session: Session,
    job: Job,
    now: datetime,
    settings: ServerSettings,
    parts: list[Part] | None = None,
) -> None:
    """The job's status from its current attempt's parts (``parts``, where
    the caller has read them in this session): on a failure, stop the rest
    and retry or fail."""
    if job.current_attempt_id is None:
        return
    # Read here unless given (an attempt always has parts: never an empty list).
    parts = parts or queries.parts_of_attempt(session=session, attempt_id=job.current_attempt_id)
    attempt = queries.get_attempt(session=session, attempt_id=job.current_attempt_id)
    stopping = attempt is not None and attempt.stop_reason is not None
    if stopping and any(p.status in (PartStatus.FAILED, PartStatus.LOST) for p in parts):
        # A part went down while stopping: the rest cannot reach a step
        # together any more (their next collective waits for it).
        stop_active_parts(session, job)
    new = settle_job(job.status, (p.status for p in parts), stopping=stopping)
    if new is job.status:
        return
    if new is JobStatus.QUEUED:
        assert attempt is not None
        if job.error is not None and not job.error.reason.is_retryable(job.error.exit_code):
            # The training code raised while stopping: no stop does that.
            new = JobStatus.FAILED
        else:
            stopped_on_request(session, job, attempt, now)
            return
    if new is JobStatus.FAILED and not fails(session, job, attempt, parts, now, settings):
        return
    set_job_status(session, job, new, now)


def fails(
    session: Session,
    job: Job,
    attempt: Attempt | None,
    parts: list[Part],
    now: datetime,
    settings: ServerSettings,
) -> bool:
    """A part of the attempt failed: the rest are stopped, and the job goes
    on smaller, is retried, or waits for the cause (False), or fails (True)."""
    if job.error is None:
        job.error = JobError(
            reason=FailureReason.PART_STOPPED, message="a part stopped without being asked to"
        )
    stop_active_parts(session, job)
    if attempt is not None and shrinks(job, attempt, parts, now):
        requeue_shrunk(session, job, attempt, now)
        return False
    if restarts_left(job, now):
        requeue(session, job, now, settings)
        return False
    return not waits_for_the_cause(job, parts)


def waits_for_the_cause(job: Job, parts: list[Part]) -> bool:
    """Whether a failing job stays running until its other parts have
    reported: all it has heard is a symptom (a rank lost a peer), and the
    part whose rank raised, being stopped now, may still name the cause.
    A job that ends does so with the error it keeps; each such part ends
    within its node's stop grace, or is lost with its node."""
    return (
        job.error is not None
        and job.error.reason.is_symptom
        and any(not p.status.is_terminal() for p in parts)
    )


# Failures that say a machine went away (its node, its worker, or only that
# a collective lost a peer): an elastic job carries on without it.
MACHINE_LOST = frozenset(
    {FailureReason.NODE_LOST, FailureReason.PEER_FAILURE, FailureReason.WORKER_SHUTDOWN}
)


def shrinks(job: Job, attempt: Attempt, parts: list[Part], now: datetime) -> bool:
    """Whether this failed attempt of an elastic job is a resize, not a
    failure: a machine went away and the rest are still its ``min`` or
    more. The job goes on with the nodes left, from its latest checkpoint,
    and uses no restart."""
    size = elastic.size_of(job.spec.topology)
    error = job.error
    if size is None or error is None or error.reason not in MACHINE_LOST:
        return False
    if job.deadline_at is not None and job.deadline_at <= now:
        return False
    running = attempt.num_machines or len(parts)
    lost = max(1, sum(p.status is PartStatus.LOST for p in parts))
    return elastic.after_loss(size, running, lost) is not None


def requeue_shrunk(session: Session, job: Job, attempt: Attempt, now: datetime) -> None:
    """Back to the queue at once, at the job's place, to start again on the
    nodes left (placement takes every free one up to ``max``). The attempt
    keeps its error and is marked resized: it uses none of max_restarts,
    unless a later report names a cause that is not a lost machine."""
    assert job.error is not None
    attempt.stop_reason = StopReason.RESIZED
    attempt.stop_detail = elastic.SHRUNK
    reason = job.error.reason
    job.stopped_attempts += 1
    set_job_status(session, job, JobStatus.QUEUED, now)  # keeps the error on the attempt
    job.not_before = None
    job.pending_reason = (
        f"lost a machine ({reason}): resumes on the nodes left, {resumes_from(job)}"
    )
    job.error = None
    log.warning("job %d attempt %d shrinks: %s", job.id, attempt.number, job.pending_reason)


def restarts_left(job: Job, now: datetime) -> bool:
    """Whether this failed attempt may be followed by another."""
    error = job.error
    return (
        error is not None
        and error.reason.is_retryable(error.exit_code)
        and restarts_done(job) < job.spec.max_restarts
        and (job.deadline_at is None or job.deadline_at > now)
    )


def requeue(session: Session, job: Job, now: datetime, settings: ServerSettings) -> None:
    """Give up the current attempt and queue the job for a new one, after a
    backoff. The old attempt's parts are being stopped: they hold their
    nodes' slots until their nodes confirm, so the new attempt cannot start
    beside a stale one."""
    assert job.error is not None
    reason = job.error.reason.value
    done = restarts_done(job)
    wait = backoff_seconds(done, settings.retry_backoff_s, settings.retry_backoff_max_s)
    set_job_status(session, job, JobStatus.QUEUED, now)  # keeps the error on the attempt
    job.not_before = now + timedelta(seconds=wait)
    job.pending_reason = (
        f"restart {done + 1} of {job.spec.max_restarts} after {reason}" + f", {resumes_from(job)}"
    )
    job.error = None
    log.warning(
        "job %d attempt %d failed (%s): %s", job.id, job.attempt_count, reason, job.pending_reason
    )


def restarts_done(job: Job) -> int:
    """Restarts used: attempts after the first, but for those the server
    asked to stop (preempted, drained, resized), which use none."""
    return max(0, job.attempt_count - 1 - job.stopped_attempts)


def resumes_from(job: Job) -> str:
    """Where the job's next attempt starts, in words."""
    if job.checkpoint_step is not None:
        return f"from the checkpoint of step {job.checkpoint_step}"
    if job.checkpoint_epoch is not None:
        return f"from the checkpoint of epoch {job.checkpoint_epoch}"
    return "from the start (no checkpoint yet)"


def stopped_on_request(session: Session, job: Job, attempt: Attempt, now: datetime) -> None:
    assert attempt.stop_reason is not None
    if attempt.stop_reason.requeues:
        requeue_stopped(session, job, attempt, now)
    else:
        end_stopped(session, job, attempt, now)


def requeue_stopped(session: Session, job: Job, attempt: Attempt, now: datetime) -> None:
    """The attempt stopped because the server asked: back to the queue at
    the job's own place (its priority and submit time are unchanged), with
    no backoff and no restart used."""
    job.stopped_attempts += 1
    job.error = None
    set_job_status(session, job, JobStatus.QUEUED, now)
    job.not_before = None
    assert attempt.stop_reason is not None
    job.pending_reason = (
        f"{describe_stop(attempt.stop_reason, attempt.stop_detail)}; resumes {resumes_from(job)}"
    )
    log.info("job %d attempt %d stopped on request: %s", job.id, attempt.number, job.pending_reason)


def end_stopped(session: Session, job: Job, attempt: Attempt, now: datetime) -> None:
    """The attempt stopped at a step for a reason that ends the job (a
    pruned trial): cancelled, its checkpoint kept, no error."""
    job.stopped_attempts += 1
    job.error = None
    set_job_status(session, job, JobStatus.CANCELLING, now)
    set_job_status(session, job, JobStatus.CANCELLED, now)
    assert attempt.stop_reason is not None
    log.info(
        "job %d attempt %d ended on request: %s",
        job.id,
        attempt.number,
        describe_stop(attempt.stop_reason, attempt.stop_detail),
    )


def explain_given_up_attempt(
    session: Session, job: Job, attempt_id: int, error: JobError, now: datetime
) -> None:
    """A report that arrives after its attempt was given up for a retry. The
    retry was decided on the first failure heard of; if that only said a
    peer went away and this one names the cause, the cause is kept, and a
    cause that a retry cannot fix (the training code raised) ends the job."""
    attempt = queries.get_attempt(session=session, attempt_id=attempt_id)
    if attempt is None or attempt.error is None:
        return
    if not names_the_cause(error.reason, attempt.error.reason):
        return
    attempt.error = error
    if attempt.stop_detail == elastic.SHRUNK and error.reason not in MACHINE_LOST:
        # Taken for a lost machine, it was a rank's own failure: it is a
        # restart after all (an elastic job that crashes is not resized
        # forever).
        attempt.stop_reason = attempt.stop_detail = None
        job.stopped_attempts -= 1
    if not error.reason.is_retryable(error.exit_code):
        job.error = error
        set_job_status(session, job, JobStatus.FAILED, now)


def fail_at_deadline(session: Session, job: Job, now: datetime) -> None:
    job.error = JobError(
        reason=FailureReason.DEADLINE,
        message=f"still {job.status.value} after max_run_seconds={job.spec.max_run_seconds:g}",
    )
    stop_active_parts(session, job)
    set_job_status(session, job, JobStatus.FAILED, now)


def set_job_status(session: Session, job: Job, new: JobStatus, now: datetime) -> None:
    job.status = move_job(job.status, new)
    if new is JobStatus.RUNNING:
        job.started_at = job.started_at or now  # the first start: retries do not reset it
        job.pending_reason = None
    if new.is_terminal():
        job.finished_at = now
        job.pending_reason = None
        job.not_before = None
        if job.sweep_id is not None:
            trials.trial_ended(session, job, now)
    if (new.is_terminal() or new is JobStatus.QUEUED) and job.current_attempt_id is not None:
        # The current attempt is over: the job ended, or gave it up to retry.
        attempt = queries.get_attempt(session=session, attempt_id=job.current_attempt_id)
        if attempt is not None and attempt.finished_at is None:
            attempt.finished_at = now
            failed = new in (JobStatus.FAILED, JobStatus.QUEUED)
            attempt.error = job.error if failed else None
    log.info("job %d: %s", job.id, new.value)


def stop_active_parts(session: Session, job: Job) -> None:
    if job.current_attempt_id is None:
        return
    for part in queries.parts_of_attempt(session=session, attempt_id=job.current_attempt_id):
        if part.status in (PartStatus.ASSIGNED, PartStatus.RUNNING):
            part.status = move_part(part.status, PartStatus.STOPPING)
