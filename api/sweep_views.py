"""What users read of a sweep: every trial with its values, state and
objective, the best so far, and what the sweep cost in slot-time."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from sqlmodel import Session

from api import sweeps
from api.core.errors import NotFound
from api.core.trials import record_of, reports_of
from db import queries
from db.engine import Database
from db.models import Attempt, Job, Sweep, Trial, utcnow
from ddpo.schemas.sweep import (
    BestTrial,
    SweepPublic,
    SweepsPublic,
    TrialPublic,
    TrialState,
)

# Reports of each trial in a sweep's answer: the newest whole, older ones thinned.
MAX_POINTS_PER_TRIAL = 200


def read_sweep(*, db: Database, sweep_id: int) -> SweepPublic:
    with db.read() as session:
        sweep = queries.get_sweep(session=session, sweep_id=sweep_id)
        if sweep is None:
            raise NotFound(f"sweep {sweep_id} not found")
        return _public(session, [sweep], with_values=True)[0]


def read_sweeps(*, db: Database, limit: int, offset: int) -> SweepsPublic:
    with db.read() as session:
        found = queries.list_sweeps(session=session, limit=limit, offset=offset)
        return SweepsPublic(data=_public(session, found, with_values=False))


def _public(session: Session, found: list[Sweep], with_values: bool) -> list[SweepPublic]:
    """``with_values``: each trial's reports too (one sweep's page; a list
    of sweeps leaves them out)."""
    trials = queries.trials_of_sweeps(session=session, sweep_ids=[s.id or 0 for s in found])
    job_ids = [t.job_id for t in trials]
    jobs = {j.id: j for j in queries.get_jobs(session=session, job_ids=job_ids)}
    attempts: dict[int, list[Attempt]] = defaultdict(list)
    for attempt in queries.attempts_of_jobs(session=session, job_ids=job_ids) if job_ids else []:
        attempts[attempt.job_id].append(attempt)
    by_sweep: dict[int, list[Trial]] = defaultdict(list)
    for trial in trials:
        by_sweep[trial.sweep_id].append(trial)
    now = utcnow()
    return [
        _sweep_public(sweep, by_sweep[sweep.id or 0], jobs, attempts, now, with_values)
        for sweep in found
    ]


def _sweep_public(
    sweep: Sweep,
    trials: list[Trial],
    jobs: dict[int | None, Job],
    attempts: dict[int, list[Attempt]],
    now: datetime,
    with_values: bool,
) -> SweepPublic:
    assert sweep.id is not None
    create = sweep.create
    best = sweeps.best(create, [record_of(t) for t in trials])
    best_trial = next((t for t in trials if best is not None and t.number == best.number), None)
    counts = {state: 0 for state in TrialState}
    for trial in trials:
        counts[trial.state] += 1
    return SweepPublic(
        id=sweep.id,
        name=sweep.name,
        owner=sweep.owner,
        status=sweep.status,
        created_at=sweep.created_at,
        finished_at=sweep.finished_at,
        error=sweep.error,
        spec=create.spec,
        space=create.space,
        objective=create.objective,
        sampler=create.sampler,
        pruner=create.pruner,
        max_trials=create.max_trials,
        max_concurrent=create.max_concurrent,
        counts=counts,
        best=(
            BestTrial(
                number=best_trial.number,
                job_id=best_trial.job_id,
                value=best_trial.value,
                params=best_trial.params,
            )
            if best_trial is not None and best_trial.value is not None
            else None
        ),
        trials=[_trial_public(t, jobs[t.job_id], with_values) for t in trials],
        slot_seconds=round(
            sum(_slot_seconds(jobs[t.job_id], attempts[t.job_id], now) for t in trials), 3
        ),
    )


def _trial_public(trial: Trial, job: Job, with_values: bool) -> TrialPublic:
    reports = sorted(reports_of(trial).items())
    last = reports[-1][0] if reports else None
    if len(reports) > MAX_POINTS_PER_TRIAL:
        stride = -(-len(reports) // MAX_POINTS_PER_TRIAL)
        reports = reports[-1::-stride][::-1]
    return TrialPublic(
        number=trial.number,
        job_id=trial.job_id,
        state=trial.state,
        job_status=job.status,
        params=trial.params,
        value=trial.value,
        step=last,
        pruned_at_step=trial.pruned_at_step,
        values=reports if with_values else [],
        test_accuracy=job.result.test_accuracy if job.result is not None else None,
        started_at=job.started_at,
        finished_at=job.finished_at,
    )


def _slot_seconds(job: Job, attempts: list[Attempt], now: datetime) -> float:
    """Machines x seconds each attempt held them, placed until ended."""
    total = 0.0
    for attempt in attempts:
        end = attempt.finished_at or (job.finished_at if job.status.is_terminal() else now)
        machines = attempt.num_machines or job.spec.topology.num_machines
        total += machines * max(0.0, ((end or now) - attempt.created_at).total_seconds())
    return total
