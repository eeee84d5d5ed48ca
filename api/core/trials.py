"""A sweep's trial follows its job: its state and final value are set in
the transaction that ends the job (api/core/settlement.py calls this), so
no ended trial is ever left looking alive. Starting the next trial is the
sweep's own business (api/core/sweeps.py)."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlmodel import Session

from api import sweeps
from db import queries
from db.models import Job, Trial
from ddpo.lifecycle import JobStatus, StopReason
from ddpo.schemas.sweep import TrialState

log = logging.getLogger(__name__)


def trial_ended(session: Session, job: Job, now: datetime) -> None:
    trial = queries.trial_of_job(session=session, job_id=job.id or 0)
    if trial is None or trial.state.is_terminal():
        return
    sweep = queries.get_sweep(session=session, sweep_id=trial.sweep_id)
    assert sweep is not None
    trial.state = _state_of(session, job)
    trial.finished_at = now
    if trial.state is TrialState.SUCCEEDED:  # else its value stays its last report
        trial.pruned_at_step = None  # it ended before the stop landed
        metric = sweep.create.objective.metric
        trial.value = sweeps.final_value(metric, job.result, reports_of(trial))
        if trial.value is None:
            log.warning(
                "sweep %d trial %d (job %d) succeeded without reporting %s",
                sweep.id,
                trial.number,
                job.id,
                sweep.create.objective.metric,
            )
    log.info("sweep %d trial %d (job %d): %s", sweep.id, trial.number, job.id, trial.state)


def _state_of(session: Session, job: Job) -> TrialState:
    if job.status is JobStatus.SUCCEEDED:
        return TrialState.SUCCEEDED
    if job.status is JobStatus.FAILED:
        return TrialState.FAILED
    attempt = (
        queries.get_attempt(session=session, attempt_id=job.current_attempt_id)
        if job.current_attempt_id is not None
        else None
    )
    if attempt is not None and attempt.stop_reason is StopReason.PRUNED:
        return TrialState.PRUNED
    return TrialState.CANCELLED


def reports_of(trial: Trial) -> dict[int, float | None]:
    """The trial's reports by step (JSON keeps the steps as strings)."""
    return {int(step): value for step, value in trial.reports.items()}


def record_of(trial: Trial) -> sweeps.TrialRecord:
    return sweeps.TrialRecord(
        number=trial.number,
        state=trial.state,
        params=dict(trial.params),
        reports=reports_of(trial),
        system_attrs=dict(trial.system_attrs),
        value=trial.value,
    )
