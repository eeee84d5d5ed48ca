"""What the server stops keeping, on its clock: log lines and progress rows
of jobs that ended long ago, the oldest lines of a job past its cap, final
models past their age or count, and idempotency keys past their hours. The
job rows themselves stay (their spec, result, timing and error are small).

Each turn deletes at most ``BATCH`` rows of each kind, so a first prune of a
large database takes many short transactions rather than one long lock;
files are removed only once the transaction that forgot them has committed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from api.core import artifacts
from api.core.context import Core
from db import queries

log = logging.getLogger(__name__)

BATCH = 5000
# Jobs whose log cap is checked each turn: the ones that may still be adding
# lines, and those that ended this recently (their last lines came late).
RECENTLY_ENDED = timedelta(hours=1)


@dataclass
class Pruned:
    log_lines: int = 0
    progress_rows: int = 0
    idempotency_keys: int = 0
    # (job id, checkpoint): a file name in the artifacts directory or a store's URL.
    checkpoints: list[tuple[int, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.log_lines or self.progress_rows or self.idempotency_keys or self.checkpoints
        )


def prune(core: Core, now: datetime) -> Pruned:
    settings = core.settings
    pruned = Pruned()
    with core.db.write() as session:
        pruned.idempotency_keys = queries.expire_idempotency_keys(
            session=session, created_before=now - timedelta(hours=settings.idempotency_key_hours)
        )
        old = queries.jobs_ended_before(
            session=session, before=now - timedelta(days=settings.log_retention_days)
        )
        pruned.log_lines = queries.delete_logs_of_jobs(session=session, job_ids=old, limit=BATCH)
        pruned.progress_rows = queries.delete_progress_of_jobs(
            session=session, job_ids=old, limit=BATCH
        )
        for job_id in queries.jobs_over_log_cap(
            session=session, after=now - RECENTLY_ENDED, keep=settings.max_log_lines_per_job
        ):
            pruned.log_lines += queries.delete_logs_beyond(
                session=session, job_id=job_id, keep=settings.max_log_lines_per_job, limit=BATCH
            )
        keeping = queries.ended_jobs_with_checkpoints(session=session)  # most recently ended first
        too_old = now - timedelta(days=settings.checkpoint_retention_days)
        for rank, job in enumerate(keeping):
            if rank >= settings.max_kept_checkpoints or (
                job.finished_at is not None and job.finished_at < too_old
            ):
                assert job.id is not None and job.checkpoint_file is not None
                pruned.checkpoints.append((job.id, job.checkpoint_file))
                # The epoch stays: the job's page can say which model it had.
                job.checkpoint_file = job.checkpoint_bytes = None
    for job_id, name in pruned.checkpoints:
        artifacts.remove_checkpoint(settings, job_id, name)
    if pruned:
        log.info(
            "pruned %d log line(s), %d progress row(s), %d idempotency key(s), %d final model(s)",
            pruned.log_lines,
            pruned.progress_rows,
            pruned.idempotency_keys,
            len(pruned.checkpoints),
        )
    return pruned
