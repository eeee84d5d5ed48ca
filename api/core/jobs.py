"""Jobs and studies come in and are cancelled."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

from sqlmodel import Session

from api.core import lookup, offers
from api.core.context import Core, PlanNeed
from api.core.errors import Conflict, NotFound, TooMany
from api.core.people import Actor, check_may_steer, record
from api.core.placement import needs_a_plan, schedule, write_together
from api.core.settlement import cancel
from api.settings import ServerSettings
from db import queries
from db.models import Job, utcnow
from ddpo.lifecycle import JobStatus, can_cancel, study_status
from ddpo.schemas import JobSpec, StudyCreate, Topology
from ddpo.schemas.people import AuditAction

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Submit:
    """What one submit asks of the writer."""

    core: Core
    spec: JobSpec
    actor: Actor
    key: str | None


def submit_job(
    core: Core, spec: JobSpec, actor: Actor, idempotency_key: str | None = None
) -> tuple[int, bool]:
    """The job's id, and whether it is new: a key seen before returns its
    job (the same spec, the same submitter) rather than a second one. The
    job is ``actor``'s."""
    # Checked in a read of its own: the check takes CPU, and no other
    # write waits for it (what the nodes offer may change meanwhile; a job
    # placed later is placed on what they offer then).
    with core.db.read() as session:
        spec = offers.checked(session, spec)
    asked = _Submit(core, spec, actor, idempotency_key)

    # With the submits and reports waiting meanwhile (the submits made
    # together), and planned with them if it could start: answered once
    # planned, so the answer says whether the job started.
    job_id, created = write_together(core, _write_submits, asked)
    if created:
        log.info("job %d submitted: %s", job_id, spec.model_dump_json())
    return job_id, created


# How one of a group's submits was decided: refused, or its job and
# whether it is new (a key sent again has the job it made).
_Decision = tuple[Job, bool] | TooMany


def _write_submits(
    session: Session, asked: list[_Submit]
) -> list[tuple[tuple[int, bool], PlanNeed] | Exception]:
    """Submits that arrived together, in the order they came: their keys
    looked up in one query, each submitter's queued jobs counted once, and
    their new jobs inserted in one statement (a submit's own statements
    were a third of a placed job's under the write lock). A submit refused
    writes nothing. Made before the group's other writes, so nothing but
    these submits changes the counts meanwhile."""
    settings = asked[0].core.settings  # one server's: a group is one server's
    decided, freed = _decide(session, asked, settings)
    if freed:
        for job in freed:
            job.idempotency_key = None  # expired: the key is free again
        session.flush()  # before the new jobs take the keys
    new = [d[0] for d in decided if not isinstance(d, TooMany) and d[1]]
    if new:
        queries.insert_jobs(session=session, jobs=new)
    return [
        _answer(session, one, decision, settings)
        for one, decision in zip(asked, decided, strict=True)
    ]


def _decide(
    session: Session, asked: list[_Submit], settings: ServerSettings
) -> tuple[list[_Decision], list[Job]]:
    """Each submit's decision, and the jobs whose expired keys new jobs take."""
    known: dict[str, Job] = {
        job.idempotency_key: job
        for job in queries.jobs_by_idempotency_keys(
            session=session, keys={one.key for one in asked if one.key is not None}
        )
        if job.idempotency_key is not None
    }
    expired_before = utcnow() - timedelta(hours=settings.idempotency_key_hours)
    queued: dict[str, int] = {}
    decided: list[_Decision] = []
    freed: list[Job] = []
    for one in asked:
        existing = known.get(one.key) if one.key is not None else None
        if existing is not None and existing.created_at > expired_before:
            decided.append((existing, False))  # checked once it has an id
            continue
        # After the key's lookup: a resend of a job already queued is no new one.
        owner = one.actor.name
        if owner is not None:
            if owner not in queued:
                queued[owner] = queries.count_queued_jobs_of(session=session, owner=owner)
            try:
                room_in_the_queue(settings, owner, queued[owner], 1)
            except TooMany as refused:
                decided.append(refused)
                continue
            queued[owner] += 1
        if existing is not None:
            freed.append(existing)
        job = queries.new_job(
            spec=one.spec, name=one.spec.name, owner=owner, idempotency_key=one.key
        )
        if one.key is not None:
            known[one.key] = job
        decided.append((job, True))
    return decided, freed


def _answer(
    session: Session, one: _Submit, decision: _Decision, settings: ServerSettings
) -> tuple[tuple[int, bool], PlanNeed] | Exception:
    """A submit's answer once the group's new jobs have their ids (its
    audit entry written if it made one)."""
    if isinstance(decision, TooMany):
        return decision
    job, created = decision
    assert job.id is not None
    if not created:
        again = _sent_again(job, one)
        return again if again is not None else ((job.id, False), False)
    record(session, one.actor, AuditAction.JOB_SUBMIT, f"job {job.id}", name=one.spec.name)
    # Asked only if the group these submits are written with plans anyway.
    return (job.id, True), partial(needs_a_plan, session, job, settings)


def _sent_again(existing: Job, one: _Submit) -> Conflict | None:
    """Why a submit under a key already taken may not have the job it
    made: another submitter's, or another spec."""
    if existing.owner != one.actor.name:
        return Conflict(
            f"Idempotency-Key {one.key!r} was used for job {existing.id} by another submitter"
        )
    if existing.spec != one.spec:
        return Conflict(
            f"Idempotency-Key {one.key!r} was used for job {existing.id} with a different spec"
        )
    return None


def check_room_in_the_queue(core: Core, session: Session, actor: Actor, adding: int) -> None:
    """One person cannot fill the queue (and every submit's and placement's
    work with it): at most ``max_queued_jobs_per_person`` queued at once."""
    if actor.name is None:
        return  # a server without tokens: nobody to count
    queued = queries.count_queued_jobs_of(session=session, owner=actor.name)
    room_in_the_queue(core.settings, actor.name, queued, adding)


def room_in_the_queue(settings: ServerSettings, owner: str, queued: int, adding: int) -> None:
    """Raises TooMany if ``owner``, with ``queued`` jobs queued, may not add ``adding``."""
    limit = settings.max_queued_jobs_per_person
    if queued + adding > limit:
        raise TooMany(
            f"{owner} has {queued} queued job(s); DDPO_MAX_QUEUED_JOBS_PER_PERSON={limit} "
            f"allows {max(0, limit - queued)} more: wait for some to start, or cancel some",
            retry_after_s=30,
        )


def cancel_job(core: Core, job_id: int, actor: Actor) -> None:
    """Its owner or an admin cancels it."""
    with core.db.write() as session:
        job = lookup.job(session, job_id, for_update=True)
        check_may_steer(actor, job.owner, f"job {job_id}", "cancel")
        if not can_cancel(job.status):
            raise Conflict(f"job {job_id} is already {job.status.value}")
        record(session, actor, AuditAction.JOB_CANCEL, f"job {job_id}", status=job.status.value)
        cancel(session, job, utcnow(), core.settings)


def set_priority(core: Core, job_id: int, priority: int, actor: Actor) -> None:
    """A queued job's new priority, set by its owner or an admin: its place
    in the queue moves at once, and if that puts it first where it fits, it
    starts."""
    with core.db.write() as session:
        job = lookup.job(session, job_id, for_update=True)
        check_may_steer(actor, job.owner, f"job {job_id}", "change the priority of")
        if job.status is not JobStatus.QUEUED:
            raise Conflict(
                f"priority: job {job_id} is {job.status.value}; only a queued job's "
                "priority can change"
            )
        if job.priority != priority:
            log.info("job %d: priority %d -> %d by %s", job_id, job.priority, priority, actor.name)
            record(
                session,
                actor,
                AuditAction.JOB_PRIORITY,
                f"job {job_id}",
                **{"from": job.priority, "to": priority},
            )
            job.priority = priority
            schedule(session, core.settings)


def submit_study(core: Core, create: StudyCreate, actor: Actor) -> int:
    """The study and all its jobs, queued at once, ``actor``'s; they run in
    row order."""
    with core.db.read() as session:
        create = create.model_copy(update={"spec": offers.checked(session, create.spec)})
    with core.db.write() as session:
        check_room_in_the_queue(core, session, actor, len(create.rows))
        study = queries.insert_study(session=session, name=create.name, owner=actor.name)
        assert study.id is not None
        for index, row in enumerate(create.rows):
            spec = create.spec.model_copy(
                update={
                    "topology": Topology(
                        num_machines=row.num_machines, num_processes=row.num_processes
                    ),
                    "batch_size": row.batch_size,
                    "name": f"{create.name or f'study {study.id}'}: "
                    f"{row.num_machines} x {row.num_processes}, batch {row.batch_size}",
                }
            )
            queries.insert_job(
                session=session,
                spec=spec,
                name=spec.name,
                study_id=study.id,
                study_index=index,
                owner=actor.name,
            )
        record(
            session,
            actor,
            AuditAction.STUDY_SUBMIT,
            f"study {study.id}",
            name=create.name,
            jobs=len(create.rows),
        )
        schedule(session, core.settings)
        log.info("study %d submitted with %d row(s)", study.id, len(create.rows))
        return study.id


def cancel_study(core: Core, study_id: int, actor: Actor) -> None:
    """Its owner or an admin cancels every job of it not yet ended."""
    with core.db.write() as session:
        study = queries.get_study(session=session, study_id=study_id)
        if study is None:
            raise NotFound(f"study {study_id} not found")
        check_may_steer(actor, study.owner, f"study {study_id}", "cancel")
        now = utcnow()
        jobs = queries.jobs_of_studies(session=session, study_ids=[study_id])
        if not any(can_cancel(job.status) for job in jobs):
            status = study_status(job.status for job in jobs)
            raise Conflict(f"study {study_id} is already {status.value}")
        record(session, actor, AuditAction.STUDY_CANCEL, f"study {study_id}")
        for job in jobs:
            if can_cancel(job.status):
                cancel(session, job, now, core.settings)
