"""What a node reports about a part it runs: started, the rendezvous port
bound, progress, log lines, finished. Every report is fenced: it must come
from the part's node, and only the current attempt's reports change the
job (api/core/lookup.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlmodel import Session

from api.core import lookup, sweeps
from api.core.context import Core, PlanNeed
from api.core.errors import Conflict, Forbidden, NotFound, TooMany
from api.core.placement import write_together
from api.core.settlement import explain_given_up_attempt, may_explain, settle
from db import queries
from db.models import LAUNCHER_RANK, Job, Part, ProgressRow, utcnow
from ddpo.failures import FailureReason
from ddpo.lifecycle import JobStatus, PartStatus, move_part
from ddpo.schemas import JobError, LogBatch, LogLine, PartFinished, ProgressBatch, RendezvousBound

log = logging.getLogger(__name__)

# Lines beyond a job's cap that one insert also drops (besides as many as it
# adds), for a job that was over its cap before (a lower setting).
RETENTION_CATCH_UP = 5000


def part_started(core: Core, part_id: int, node_id: int) -> bool:
    """The node launched the part's processes. False: it should not have."""
    core.sightings.saw(node_id)
    # Beside the one writer (on PostgreSQL): a third of a placed job's
    # writes, and it changes only its own part, locked here. A writer that
    # changes the part meanwhile (a cancel, a lost node) waits for this one
    # or is waited for, as if the report came a moment earlier or later.
    with core.db.write(exclusive=False) as session:
        if queries.start_part(session=session, part_id=part_id, node_id=node_id, at=utcnow()):
            return True
        # Not started: a part of another node's, or none, is refused (403,
        # 404); one no longer assigned or of an attempt since replaced is not
        # to start (False).
        lookup.owned_part(session, part_id, node_id)
        return False


def record_rendezvous(core: Core, part_id: int, report: RendezvousBound) -> bool:
    """Machine 0's launcher bound the job's rendezvous store on this port;
    the other machines learn it from their next poll."""
    core.sightings.saw(report.node_id)
    with core.db.write() as session:
        part = lookup.owned_part(session, part_id, report.node_id)
        if part.machine_id != 0:
            raise Conflict(
                f"part {part_id} is machine {part.machine_id}; only machine 0 hosts the rendezvous"
            )
        attempt = queries.get_attempt(session=session, attempt_id=part.attempt_id)
        assert attempt is not None
        if attempt.master_port is not None and attempt.master_port != report.master_port:
            raise Conflict(f"attempt {attempt.id} already rendezvous at port {attempt.master_port}")
        if not lookup.is_current(session, part) or part.status.is_terminal():
            return False
        attempt.master_port = report.master_port
        log.info(
            "job %d attempt %d: rendezvous at %s:%d",
            part.job_id,
            attempt.number,
            attempt.master_addr,
            report.master_port,
        )
        return True


def _speaks_for_the_job(part: Part, what: str) -> None:
    """Rank 0 is on machine 0: only that part's node reports the job's
    progress and result (README). Another machine's node cannot set them."""
    if part.machine_id != 0:
        raise Forbidden(
            f"part {part.id} is machine {part.machine_id} of job {part.job_id}: only machine "
            f"0, where rank 0 runs, reports {what}"
        )


def record_progress(core: Core, part_id: int, batch: ProgressBatch) -> bool:
    core.sightings.saw(batch.node_id)
    with core.db.write() as session:
        part = lookup.owned_part(session, part_id, batch.node_id)
        _speaks_for_the_job(part, "a job's progress")
        if not lookup.is_current(session, part):
            return False
        job = lookup.job(session, part.job_id)
        seen = queries.known_progress_seqs(
            session=session, attempt_id=part.attempt_id, seqs=[r.seq for r in batch.reports]
        )
        fresh = {r.seq: r for r in batch.reports if r.seq not in seen}
        queries.insert_progress(
            session=session,
            rows=(
                ProgressRow(
                    job_id=part.job_id,
                    attempt_id=part.attempt_id,
                    seq=r.seq,
                    epoch=r.epoch,
                    batch=r.batch,
                    batches_per_epoch=r.batches_per_epoch,
                    loss=r.loss,
                    samples_per_sec=r.samples_per_sec,
                    step=r.step,
                    metrics=r.metrics or None,
                    at=r.at,
                )
                for r in fresh.values()
            ),
        )
        if fresh:
            latest = fresh[max(fresh)]
            if job.progress_seq is None or latest.seq > job.progress_seq:
                job.progress_seq = latest.seq
                job.progress_epoch = latest.epoch
                job.progress_batch = latest.batch
                job.progress_batches_per_epoch = latest.batches_per_epoch
                job.progress_loss = latest.loss
                job.progress_samples_per_sec = latest.samples_per_sec
                job.progress_step = latest.step
                job.progress_epochs = latest.epochs
                job.progress_metrics = latest.metrics or None
                job.progress_at = latest.at
            if job.sweep_id is not None:
                sweeps.on_progress(session, job, list(fresh.values()), utcnow(), core.settings)
    core.tracking.reported(part.job_id, fresh.values())  # once committed
    return True


def record_logs(core: Core, part_id: int, batch: LogBatch) -> bool:
    """Store the lines not stored yet. Lines of an attempt that is no
    longer current are kept too (they explain what happened to it), until
    its part has ended: a part's lines all come before its finish report.

    Held to the node's rate (429 beyond, before any write) and to the job's
    cap: past ``max_log_lines_per_job``, its oldest lines are dropped in the
    same transaction, so no writer outruns the cap."""
    core.sightings.saw(batch.node_id)
    wait_s = core.log_rate.admit(batch.node_id, len(batch.lines))
    if wait_s > 0:
        raise TooMany(
            f"node {batch.node_id} sends more than DDPO_LOG_LINES_PER_SECOND_PER_NODE="
            f"{core.settings.log_lines_per_second_per_node:g} log lines a second; "
            f"send these in {wait_s:.1f} s",
            retry_after_s=wait_s,
        )
    with core.db.write() as session:
        part = lookup.owned_part(session, part_id, batch.node_id)
        if part.status.is_terminal():
            # Finished, or lost: its node was silent and its work given
            # away, and what the node says now comes from ranks that ran on,
            # cut off. Neither is part of any attempt's record.
            return False
        job = lookup.job(session, part.job_id)
        ranks = range(
            part.machine_id * job.spec.topology.num_processes,
            (part.machine_id + 1) * job.spec.topology.num_processes,
        )
        strays = sorted({line.rank for line in batch.lines if line.rank is not None} - set(ranks))
        if strays:
            raise Conflict(
                f"lines.rank: machine {part.machine_id} of job {part.job_id} has ranks "
                f"{ranks.start}-{ranks.stop - 1}, not {', '.join(map(str, strays))}"
            )
        seen = queries.known_log_offsets(
            session=session,
            attempt_id=part.attempt_id,
            machine_id=part.machine_id,
            offsets=[line.offset for line in batch.lines],
        )
        fresh: dict[tuple[int, int], LogLine] = {}
        for line in batch.lines:
            key = (LAUNCHER_RANK if line.rank is None else line.rank, line.offset)
            if key not in seen:
                fresh[key] = line
        queries.insert_logs(
            session=session,
            job_id=part.job_id,
            attempt_id=part.attempt_id,
            machine_id=part.machine_id,
            lines=((rank, offset, line.text, line.at) for (rank, offset), line in fresh.items()),
        )
        if fresh:
            queries.delete_logs_beyond(
                session=session,
                job_id=part.job_id,
                keep=core.settings.max_log_lines_per_job,
                limit=len(fresh) + RETENTION_CATCH_UP,
            )
        return True


@dataclass(frozen=True)
class _Finish:
    """What one node's finish asks of the writer."""

    core: Core
    part_id: int
    report: PartFinished


def finish_part(core: Core, part_id: int, report: PartFinished) -> bool:
    """A node's processes for this part have exited; settle the job."""
    core.sightings.saw(report.node_id)
    asked = _Finish(core, part_id, report)

    return bool(write_together(core, _write_finishes, asked))


def _write_finishes(
    session: Session, asked: list[_Finish]
) -> list[tuple[bool | None, PlanNeed] | Exception]:
    """Finishes that arrived together, in the order they came: their parts,
    jobs and current attempts read in one query, those attempts' parts in
    another, and what they change written together as the group goes on
    (an UPDATE of each table for all of them, where a finish settled the
    job or freed a slot: two round trips each before). A finish refused
    (another node's part, a result from a machine other than 0) writes
    nothing; one that fails once it has changed rows raises (the group is
    written again, a savepoint each)."""
    found = queries.parts_and_jobs(session=session, part_ids=[one.part_id for one in asked])
    siblings = queries.parts_of_attempts(
        session=session,
        attempt_ids={
            job.current_attempt_id
            for _, job, _ in found.values()
            if job.current_attempt_id is not None
        },
    )
    now = utcnow()
    outcomes: list[tuple[bool | None, PlanNeed] | Exception] = []
    for one in asked:
        try:
            part, job, _ = lookup.owned_part_and_job(
                found.get(one.part_id), one.part_id, one.report.node_id
            )
            if one.report.result is not None:
                _speaks_for_the_job(part, "a job's result")
        except (NotFound, Forbidden) as refused:
            outcomes.append(refused)
            continue
        # Settled or freed a slot (the job may retry): the queue is planned
        # in the same transaction, with whatever else arrived meanwhile.
        parts = siblings.get(job.current_attempt_id) if job.current_attempt_id else None
        settled = _settle_finished(session, one.core, part, job, one.report, now, parts)
        outcomes.append((settled, settled is not None))
    return outcomes


def _settle_finished(
    session: Session,
    core: Core,
    part: Part,
    job: Job,
    report: PartFinished,
    now: datetime,
    parts: list[Part] | None,
) -> bool | None:
    """A finish's write, once it may be made: True if the part's job was
    settled, False if it was an older attempt's part (its slot is free),
    None if the report changed nothing. ``parts`` are the job's current
    attempt's, where read already."""
    if part.status.is_terminal():
        return None  # already settled: a resend, or the node was lost meanwhile
    ended = PartStatus(report.status)
    if part.status is PartStatus.ASSIGNED and ended is not PartStatus.CANCELLED:
        # Its "started" report was lost on the way; it did run.
        part.status = move_part(PartStatus.ASSIGNED, PartStatus.RUNNING)
    part.status = move_part(part.status, ended)
    part.finished_at = now
    part.exit_code = report.exit_code
    part.failing_rank = report.failing_rank
    part.error = report.traceback_tail or report.message
    log.info(
        "job %d machine %d: %s (exit code %s)",
        job.id,
        part.machine_id,
        report.status,
        report.exit_code,
    )
    if job.current_attempt_id != part.attempt_id:
        # An older attempt's part: its slot is free now, which a
        # waiting retry may need.
        return False
    if report.result is not None and job.status is JobStatus.RUNNING:
        job.result = report.result
    if ended is PartStatus.STOPPED and part.machine_id == 0 and report.step is not None:
        attempt = queries.get_attempt(session=session, attempt_id=part.attempt_id)
        if attempt is not None and attempt.stop_reason is not None:
            attempt.stopped_at_step = report.step
    if ended is PartStatus.FAILED:
        _record_failure(session, job, part, report, now)
    settle(session, job, now, core.settings, parts)
    sweeps.job_ended(session, job, now, core.settings)
    return True


def _record_failure(
    session: Session, job: Job, part: Part, report: PartFinished, now: datetime
) -> None:
    """The job's error, from the first part to fail (or the one naming the
    cause, where the first only named a symptom)."""
    node = queries.get_node(session=session, node_id=part.node_id)
    reason = report.reason or FailureReason.RANK_FAILED
    error = JobError(
        reason=reason,
        message=report.message
        or f"machine {part.machine_id} failed with exit code {report.exit_code}",
        machine_id=part.machine_id,
        rank=report.failing_rank,
        node=node.name if node else None,
        exit_code=report.exit_code,
        traceback_tail=report.traceback_tail,
    )
    if job.status is JobStatus.QUEUED:
        explain_given_up_attempt(session, job, part.attempt_id, error, now)
    elif may_explain(job, reason):
        job.error = error
