"""Sweeps come in, start their trials, stop the poor ones early, and end.

Every decision is made inside a write transaction that holds the sweep's
row (``FOR UPDATE`` on PostgreSQL; SQLite has one writer), from the trial
rows alone (api/search.py rebuilds Optuna's study from them): a server
killed between two decisions loses nothing, and a trial's number is
unique in its sweep, so none is asked twice. Three moments drive it:

- rank 0's progress (api/core/reports.py): the trial's reports of the
  objective are kept, and the pruner judges it at once; a poor trial is
  asked to stop at a step (the cooperative stop, reason ``pruned``);
- a trial's job ending (its trial row is settled with it,
  api/core/trials.py), then :func:`advance` starts the next in the same
  transaction, so the slots it held go to the next trial at once;
- the clock (:func:`advance_running`), each second, for what ended
  without a node's report (a cancel, a lost node, a deadline)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from types import ModuleType

from sqlmodel import Session

from api import sweeps
from api.core import offers
from api.core.context import Core
from api.core.errors import Conflict, InvalidFields, NotFound
from api.core.jobs import check_room_in_the_queue
from api.core.people import Actor, check_may_steer, record
from api.core.placement import SCHEDULER, schedule
from api.core.settlement import cancel
from api.core.stops import ask_to_stop
from api.core.trials import record_of, reports_of
from api.settings import ServerSettings
from db import queries
from db.models import Job, Sweep, Trial, utcnow
from ddpo.lifecycle import JobStatus, StopReason, can_cancel
from ddpo.schemas import ProgressReport
from ddpo.schemas.people import AuditAction
from ddpo.schemas.sweep import SweepCreate, TrialState

log = logging.getLogger(__name__)


def _search() -> ModuleType:
    """api/search.py, loaded with the first decision a sweep needs: Optuna
    brings numpy and its BLAS threads (17 MB here), which a server that
    runs no sweep does without."""
    from api import search

    return search


def submit_sweep(core: Core, create: SweepCreate, actor: Actor) -> int:
    """The sweep, ``actor``'s, with its first trials queued."""
    with core.db.read() as session:
        create = _checked(session, create)
    with core.db.write() as session:
        # The same cap as a job's submit (a sweep queues up to max_concurrent).
        check_room_in_the_queue(core, session, actor, min(create.max_concurrent, create.max_trials))
        sweep = queries.insert_sweep(session=session, create=create, owner=actor.name)
        assert sweep.id is not None
        record(
            session,
            actor,
            AuditAction.SWEEP_SUBMIT,
            f"sweep {sweep.id}",
            name=create.name,
            max_trials=create.max_trials,
            dimensions=sorted(create.space),
        )
        advance(session, sweep, utcnow())
        if sweep.error is not None:  # not even its first trials could be made
            raise InvalidFields([(["space"], sweep.error)])
        schedule(session, core.settings)
        log.info("sweep %d submitted: %s", sweep.id, create.model_dump_json())
        return sweep.id


def _checked(session: Session, create: SweepCreate) -> SweepCreate:
    """The base spec as it will run (params checked, a script pinned), and
    every dimension's extremes and choices valid in it: a value outside the
    spec's bounds or a params.NAME the trainer's schema refuses is a 422
    naming ``space.NAME``, now, not a failed trial later."""
    try:
        spec = offers.checked(session, create.spec)
    except InvalidFields as exc:
        raise InvalidFields([(["spec", *loc], msg) for loc, msg in exc.errors]) from None
    errors: list[tuple[list[str | int], str]] = []
    for name, value in sweeps.corners(create):
        if any(loc[:2] == ["space", name] for loc, _ in errors):
            continue
        try:
            offers.checked(session, sweeps.trial_spec(spec, {name: value}, "corner"))
        except InvalidFields as exc:
            errors += [(["space", name], f"{value!r}: {msg}") for _, msg in exc.errors[:1]]
        except ValueError as exc:  # the spec's own bounds (pydantic)
            errors.append((["space", name], f"{value!r}: {_first_error(exc)}"))
    if errors:
        raise InvalidFields(errors)
    return create.model_copy(update={"spec": spec})


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
    return str(exc)


def advance(session: Session, sweep: Sweep, now: datetime) -> bool:
    """Start the trials the sweep has room for; end it once every trial has
    ended and no more will start. True if anything changed."""
    if sweep.status is not JobStatus.RUNNING:
        return False
    assert sweep.id is not None
    trials = queries.trials_of_sweeps(session=session, sweep_ids=[sweep.id])
    records = [record_of(t) for t in trials]
    started = 0
    for _ in range(sweeps.to_start(sweep.create, records)):
        try:
            records.append(_start_trial(session, sweep, records))
        except ValueError as exc:
            # A value the spec refuses that the checks at submit (each
            # dimension's extremes, one at a time) could not foresee: the
            # sweep ends, saying why, rather than the report that ended a
            # trial failing (and its node sending it forever).
            _give_up(sweep, f"trial {len(records)}: {_first_error(exc)}", now)
            return True
        except Exception as exc:  # the sampler's own failure: the same, logged whole
            log.exception("sweep %d: asking trial %d failed", sweep.id, len(records))
            _give_up(sweep, f"trial {len(records)}: the sampler failed: {exc}", now)
            return True
        started += 1
    if not started and all(r.state.is_terminal() for r in records):
        sweep.status = _ended_status(records)
        sweep.finished_at = now
        best = sweeps.best(sweep.create, records)
        log.info(
            "sweep %d %s: %d trial(s), best %s",
            sweep.id,
            sweep.status,
            len(records),
            f"trial {best.number} ({best.value:g})" if best and best.value is not None else "none",
        )
        return True
    return started > 0


def _give_up(sweep: Sweep, error: str, now: datetime) -> None:
    """No more trials start (those running go on to their end)."""
    log.error("sweep %d cannot go on: %s", sweep.id, error)
    sweep.error = error
    sweep.status = JobStatus.FAILED
    sweep.finished_at = now


def _ended_status(records: Sequence[sweeps.TrialRecord]) -> JobStatus:
    if any(r.state is TrialState.SUCCEEDED for r in records):
        return JobStatus.SUCCEEDED
    return JobStatus.FAILED


def _start_trial(
    session: Session, sweep: Sweep, records: Sequence[sweeps.TrialRecord]
) -> sweeps.TrialRecord:
    assert sweep.id is not None
    number = len(records)
    params, system_attrs = _search().ask(sweep.create, records)
    label = sweep.name or f"sweep {sweep.id}"
    spec = sweeps.trial_spec(sweep.create.spec, params, f"{label}: trial {number}")
    job = queries.insert_job(
        session=session, spec=spec, name=spec.name, owner=sweep.owner, sweep_id=sweep.id
    )
    assert job.id is not None
    queries.insert_trial(
        session=session,
        trial=Trial(
            sweep_id=sweep.id,
            number=number,
            job_id=job.id,
            params=params,
            system_attrs=system_attrs,
        ),
    )
    log.info("sweep %d trial %d: job %d with %s", sweep.id, number, job.id, params)
    return sweeps.TrialRecord(number=number, state=TrialState.QUEUED, params=params)


def job_ended(session: Session, job: Job, now: datetime, settings: ServerSettings) -> None:
    """A trial's job has ended (its trial settled with it): the sweep starts
    its next trial now, and the scheduler places it with the same commit."""
    if job.sweep_id is None or not job.status.is_terminal():
        return
    sweep = queries.get_sweep(session=session, sweep_id=job.sweep_id, for_update=True)
    if sweep is not None and advance(session, sweep, now):
        schedule(session, settings)


def on_progress(
    session: Session,
    job: Job,
    reports: Sequence[ProgressReport],
    now: datetime,
    settings: ServerSettings,
) -> None:
    """Rank 0's new reports of a trial: its objective's values kept by step,
    and the early stopper's judgement, at once."""
    assert job.sweep_id is not None
    sweep = queries.get_sweep(session=session, sweep_id=job.sweep_id, for_update=True)
    trial = queries.trial_of_job(session=session, job_id=job.id or 0)
    if sweep is None or trial is None or trial.state.is_terminal():
        return
    if trial.state is TrialState.QUEUED:
        trial.state = TrialState.RUNNING
    steps = _keep_reports(sweep, trial, reports)
    if not steps:
        return
    if trial.pruned_at_step is not None or job.status is not JobStatus.RUNNING:
        return
    if any(_is_last(r, job.spec.epochs) for r in reports):
        return  # trained to its end: nothing left to save by stopping it
    _judge(session, sweep, trial, job, steps, now, settings)


def _keep_reports(sweep: Sweep, trial: Trial, reports: Sequence[ProgressReport]) -> list[int]:
    """The objective's values among ``reports``, kept on the trial by step;
    the steps they were at (none if no report carried the objective)."""
    new: dict[int, float | None] = {}
    for report in sorted(reports, key=lambda r: r.seq):
        present, value = sweeps.reported(sweep.create.objective.metric, report)
        if present:
            new[sweeps.step_of(report)] = value
    if not new:
        return []
    kept = reports_of(trial)
    sweeps.add_reports(kept, new)
    trial.reports = {str(step): value for step, value in sorted(kept.items())}
    trial.value = kept[max(kept)]
    return sorted(new)


def _judge(
    session: Session,
    sweep: Sweep,
    trial: Trial,
    job: Job,
    steps: Sequence[int],
    now: datetime,
    settings: ServerSettings,
) -> None:
    """The pruner's judgement of the trial at each of its new reports' steps
    in turn; a poor trial is asked to stop at a step."""
    arrived = set(steps)
    earlier = [s for s in reports_of(trial) if s not in arrived]
    if sweep.create.pruner.kind == "none" or not _search().judged(
        sweep.create, earlier, sorted(arrived)
    ):
        # Nothing to ask (ASHA between its rungs): every trial's rows are
        # read only for a judgement, which costs the writer the more, the
        # more trials and reports the sweep has.
        return
    records = [
        record_of(t) for t in queries.trials_of_sweeps(session=session, sweep_ids=[sweep.id or 0])
    ]
    try:
        step, system_attrs = _search().pruned_at(sweep.create, records, trial.number, steps)
    except Exception:
        # The trial trains on unjudged rather than its node's report
        # failing (and being sent again forever).
        log.exception("sweep %d trial %d: the pruner failed", sweep.id, trial.number)
        return
    trial.system_attrs = system_attrs
    if step is None:
        return
    detail = f"sweep {sweep.id} trial {trial.number} at step {step}"
    if ask_to_stop(session, job, StopReason.PRUNED, detail, now, settings):
        trial.pruned_at_step = step
        record(
            session,
            SCHEDULER,
            AuditAction.SWEEP_PRUNE,
            f"job {job.id}",
            sweep=sweep.id,
            trial=trial.number,
            step=step,
            value=trial.value,
        )
        log.info(
            "sweep %d trial %d (job %d) pruned at step %d", sweep.id, trial.number, job.id, step
        )


def _is_last(report: ProgressReport, epochs: int) -> bool:
    last_epoch = report.epochs if report.epochs is not None else epochs
    return report.epoch >= last_epoch and report.batch >= report.batches_per_epoch


def advance_running(core: Core) -> bool:
    """The clock's turn: running sweeps whose trials ended without a node's
    report (cancelled, lost, past a deadline) start their next ones."""
    with core.db.read() as session:
        ids = [s.id for s in _due(session) if s.id is not None]
    changed = False
    for sweep_id in ids:
        with core.db.write() as session:
            sweep = queries.get_sweep(session=session, sweep_id=sweep_id, for_update=True)
            if sweep is not None and advance(session, sweep, utcnow()):
                schedule(session, core.settings)
                changed = True
    return changed


def _due(session: Session) -> list[Sweep]:
    """Running sweeps with a trial to start or nothing left to run: read
    first (the trials' states alone), so a clock turn with nothing to do
    takes no write lock."""
    running = queries.running_sweeps(session=session)
    states = queries.trial_states_of_sweeps(session=session, sweep_ids=[s.id or 0 for s in running])
    due = []
    for sweep in running:
        mine = states.get(sweep.id or 0, [])
        records = [sweeps.TrialRecord(n, state, {}) for n, state in enumerate(mine)]
        if sweeps.to_start(sweep.create, records) or all(s.is_terminal() for s in mine):
            due.append(sweep)
    return due


def cancel_sweep(core: Core, sweep_id: int, actor: Actor) -> None:
    """Its owner or an admin ends it: no new trial starts, and every trial
    not yet ended is cancelled."""
    with core.db.write() as session:
        sweep = queries.get_sweep(session=session, sweep_id=sweep_id, for_update=True)
        if sweep is None:
            raise NotFound(f"sweep {sweep_id} not found")
        check_may_steer(actor, sweep.owner, f"sweep {sweep_id}", "cancel")
        if sweep.status is not JobStatus.RUNNING:
            raise Conflict(f"sweep {sweep_id} is already {sweep.status.value}")
        record(session, actor, AuditAction.SWEEP_CANCEL, f"sweep {sweep_id}")
        now = utcnow()
        sweep.status = JobStatus.CANCELLED
        sweep.finished_at = now
        trials = queries.trials_of_sweeps(session=session, sweep_ids=[sweep_id])
        jobs = queries.get_jobs(session=session, job_ids=[t.job_id for t in trials])
        for job in jobs:
            if can_cancel(job.status):
                cancel(session, job, now, core.settings)
        schedule(session, core.settings)
