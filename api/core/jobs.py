"""Jobs and studies come in and are cancelled."""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlmodel import Session

from api.core import lookup, offers
from api.core.context import Core, PlanNeed
from api.core.errors import Conflict, NotFound, TooMany
from api.core.people import Actor, check_may_steer, record
from api.core.placement import needs_a_plan, schedule, write_grouped
from api.core.settlement import cancel
from db import queries
from db.models import utcnow
from ddpo.lifecycle import JobStatus, can_cancel, study_status
from ddpo.schemas import JobSpec, StudyCreate, Topology
from ddpo.schemas.people import AuditAction

log = logging.getLogger(__name__)


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

    def submitting(session: Session) -> tuple[tuple[int, bool], PlanNeed]:
        if idempotency_key is not None:
            existing = queries.get_job_by_idempotency_key(session=session, key=idempotency_key)
            expires = timedelta(hours=core.settings.idempotency_key_hours)
            if existing is not None and existing.created_at <= utcnow() - expires:
                existing.idempotency_key = None  # expired: the key is free again
                session.flush()
                existing = None
            if existing is not None:
                assert existing.id is not None
                if existing.owner != actor.name:
                    raise Conflict(
                        f"Idempotency-Key {idempotency_key!r} was used for job "
                        f"{existing.id} by another submitter"
                    )
                if existing.spec != spec:
                    raise Conflict(
                        f"Idempotency-Key {idempotency_key!r} was used for job "
                        f"{existing.id} with a different spec"
                    )
                return (existing.id, False), False
        # After the key's lookup: a resend of a job already queued is no new one.
        check_room_in_the_queue(core, session, actor, 1)
        job = queries.insert_job(
            session=session,
            spec=spec,
            name=spec.name,
            idempotency_key=idempotency_key,
            owner=actor.name,
        )
        assert job.id is not None
        record(session, actor, AuditAction.JOB_SUBMIT, f"job {job.id}", name=spec.name)
        # Asked only if the group this submit is written with plans anyway.
        return (job.id, True), lambda: needs_a_plan(session, job, core.settings)

    # With the submits and reports waiting meanwhile, and planned with them
    # if it could start: answered once planned, so the answer says whether
    # the job started.
    job_id, created = write_grouped(core, submitting)
    if created:
        log.info("job %d submitted: %s", job_id, spec.model_dump_json())
    return job_id, created


def check_room_in_the_queue(core: Core, session: Session, actor: Actor, adding: int) -> None:
    """One person cannot fill the queue (and every submit's and placement's
    work with it): at most ``max_queued_jobs_per_person`` queued at once."""
    if actor.name is None:
        return  # a server without tokens: nobody to count
    limit = core.settings.max_queued_jobs_per_person
    queued = queries.count_queued_jobs_of(session=session, owner=actor.name)
    if queued + adding > limit:
        raise TooMany(
            f"{actor.name} has {queued} queued job(s); DDPO_MAX_QUEUED_JOBS_PER_PERSON={limit} "
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
