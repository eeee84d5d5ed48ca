"""Read side: turn rows into the public schemas. One read transaction each,
a fixed handful of queries however many parts a job has."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from sqlmodel import Session

from api import elastic
from api.core.errors import NotFound
from api.core.placement import free_capacity, survey_queue
from api.scheduling import Pending, Placement
from db import queries
from db.engine import Database
from db.models import LAUNCHER_RANK, ApiKey, Attempt, Job, LogRow, Node, Part, Study, utcnow
from ddpo.lifecycle import JobStatus, NodeState, PendingCode, describe_stop, study_status
from ddpo.schemas import JobSpec, people, public, report_step


def percent_done(*, epoch: int, batch: int, batches_per_epoch: int, epochs: int) -> float:
    """Share of the whole job's batches done, 0-100."""
    total = batches_per_epoch * epochs
    done = (epoch - 1) * batches_per_epoch + batch
    return round(100.0 * min(max(done, 0), total) / total, 2)


def eta_seconds(
    *, percent: float, started_at: datetime | None, reported_at: datetime, now: datetime
) -> float | None:
    """Time left to the end of training at the pace so far (start-up
    included, evaluation not), counted down since the last report."""
    if started_at is None or percent <= 0:
        return None
    elapsed = (reported_at - started_at).total_seconds()
    remaining = elapsed * (100 - percent) / percent
    return round(max(0.0, remaining - (now - reported_at).total_seconds()), 1)


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 3)


def job_public(
    job: Job,
    attempts: list[Attempt],
    parts: list[tuple[Part, Node]],
    now: datetime,
    queued: public.QueuedJobPublic | None = None,
) -> public.JobPublic:
    """``attempts``: all of the job's, oldest first; ``parts``: the current
    one's; ``queued``: its place in the queue, while queued."""
    assert job.id is not None
    attempt = next((a for a in attempts if a.id == job.current_attempt_id), None)
    return public.JobPublic(
        id=job.id,
        name=job.name,
        owner=job.owner,
        status=job.status,
        pending_reason=job.pending_reason if job.status is JobStatus.QUEUED else None,
        priority=job.priority,
        queue_position=queued.position if queued else None,
        pending=queued.pending if queued else None,
        sweep_id=job.sweep_id,
        spec=job.spec,
        world_size=_machines(job, attempt) * job.spec.topology.num_processes,
        attempt=attempt.number if attempt else 0,
        attempts=[
            _attempt_public(job, a, attempts[i + 1] if i + 1 < len(attempts) else None)
            for i, a in enumerate(attempts)
        ],
        master_addr=attempt.master_addr if attempt else None,
        master_port=attempt.master_port if attempt else None,
        parts=[_part_public(part, node) for part, node in parts],
        progress=_progress_public(job, now),
        timing=_timing_public(job, now),
        result=job.result,
        error=job.error,
        checkpoint=public.CheckpointPublic(
            epoch=job.checkpoint_epoch,
            step=job.checkpoint_step,
            size_bytes=job.checkpoint_bytes or 0,
            url=f"/jobs/{job.id}/model",
        )
        if job.checkpoint_epoch is not None
        else None,
    )


def _progress_public(job: Job, now: datetime) -> public.ProgressPublic | None:
    if job.progress_at is None or not job.progress_batches_per_epoch:
        return None
    # A script says how many epochs it runs; a trainer's are the spec's.
    epochs = job.progress_epochs or job.spec.epochs
    percent = percent_done(
        epoch=job.progress_epoch or 1,
        batch=job.progress_batch or 0,
        batches_per_epoch=job.progress_batches_per_epoch,
        epochs=epochs,
    )
    return public.ProgressPublic(
        epoch=job.progress_epoch or 1,
        epochs=epochs,
        batch=job.progress_batch or 0,
        batches_per_epoch=job.progress_batches_per_epoch,
        percent=percent,
        eta_seconds=eta_seconds(
            percent=percent, started_at=job.started_at, reported_at=job.progress_at, now=now
        )
        if job.status is JobStatus.RUNNING
        else None,
        loss=job.progress_loss,
        samples_per_sec=job.progress_samples_per_sec,
        step=job.progress_step,
        metrics=job.progress_metrics or {},
        updated_at=job.progress_at,
    )


def _timing_public(job: Job, now: datetime) -> public.TimingPublic:
    end = job.finished_at or now
    result = job.result
    return public.TimingPublic(
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        queued_seconds=_seconds(job.created_at, job.started_at or end),
        running_seconds=_seconds(job.started_at, end),
        training_seconds=result.train_seconds if result else None,
        setup_seconds=result.setup_seconds if result else None,
        eval_seconds=result.eval_seconds if result else None,
        threads_per_process=result.threads_per_process if result else None,
    )


def _machines(job: Job, attempt: Attempt | None) -> int:
    """Machines an attempt runs on (an elastic job's vary)."""
    if attempt is None or attempt.num_machines is None:
        return job.spec.topology.num_machines
    return attempt.num_machines


def _attempt_public(job: Job, attempt: Attempt, following: Attempt | None) -> public.AttemptPublic:
    machines = _machines(job, attempt)
    world_size = machines * job.spec.topology.num_processes
    return public.AttemptPublic(
        number=attempt.number,
        started_at=attempt.created_at,
        finished_at=attempt.finished_at,
        num_machines=machines,
        world_size=world_size,
        global_batch=world_size * job.spec.batch_size,
        resumed_from_epoch=attempt.resumed_from_epoch,
        resumed_from_step=attempt.resumed_from_step,
        error=attempt.error,
        stop=public.StopPublic(
            reason=attempt.stop_reason,
            detail=attempt.stop_detail,
            requested_at=attempt.stop_requested_at,
            deadline_at=attempt.stop_deadline_at,
        )
        if attempt.stop_reason is not None
        and attempt.stop_requested_at is not None
        and attempt.stop_deadline_at is not None
        else None,
        stopped_at_step=attempt.stopped_at_step,
        ended=attempt_ending(job, attempt, following),
    )


def attempt_ending(job: Job, attempt: Attempt, following: Attempt | None = None) -> str | None:
    """Why an attempt ended, in words (None while it runs); ``following``,
    the attempt after it, says what an elastic job resized to."""
    if attempt.finished_at is None:
        return None
    if attempt.stop_detail == elastic.SHRUNK and attempt.error is not None:
        words = f"resized after a lost machine ({attempt.error.reason})"
        if following is not None:
            words += f", {_machines(job, attempt)} -> {_machines(job, following)}"
        return words
    if (
        attempt.stop_reason is not None
        and attempt.error is None
        and (attempt.id != job.current_attempt_id or job.status is not JobStatus.SUCCEEDED)
    ):
        words = describe_stop(attempt.stop_reason, attempt.stop_detail)
        if attempt.stopped_at_step is not None:
            words += f", stopped after step {attempt.stopped_at_step}"
        return words
    if attempt.error is not None:
        return f"failed: {attempt.error.reason}"
    if attempt.id == job.current_attempt_id:
        return str(job.status)
    return None


def _part_public(part: Part, node: Node) -> public.PartPublic:
    return public.PartPublic(
        machine_id=part.machine_id,
        node_id=node.id or 0,
        node_name=node.name,
        node_address=node.address,
        status=part.status,
        exit_code=part.exit_code,
        failing_rank=part.failing_rank,
        error=part.error,
        assigned_at=part.assigned_at,
        started_at=part.started_at,
        finished_at=part.finished_at,
    )


def _public_jobs(db_session: Session, jobs: list[Job]) -> list[public.JobPublic]:
    attempt_ids = [j.current_attempt_id for j in jobs if j.current_attempt_id is not None]
    attempts: dict[int, list[Attempt]] = defaultdict(list)
    for attempt in queries.attempts_of_jobs(
        session=db_session, job_ids=[j.id for j in jobs if j.id is not None]
    ):
        attempts[attempt.job_id].append(attempt)
    parts: dict[int, list[tuple[Part, Node]]] = defaultdict(list)
    for part, node in queries.parts_with_nodes(session=db_session, attempt_ids=attempt_ids):
        parts[part.attempt_id].append((part, node))
    now = utcnow()
    queued = {j.id for j in jobs if j.status is JobStatus.QUEUED and j.id is not None}
    places = {q.job_id: q for q in _queue(db_session, now, only=queued).data} if queued else {}
    return [
        job_public(
            job,
            attempts.get(job.id or 0, []),
            parts.get(job.current_attempt_id, []) if job.current_attempt_id else [],
            now,
            places.get(job.id or 0),
        )
        for job in jobs
    ]


def read_queue(*, db: Database) -> public.QueuePublic:
    with db.read() as session:
        return _queue(session, utcnow())


def _queue(session: Session, now: datetime, only: set[int] | None = None) -> public.QueuePublic:
    """Every queued job in the order placement tries them, with what it
    makes of each now (api/core/placement.py, survey_queue); ``only`` these
    jobs' rows (a job's own view: where it stands needs the whole line
    planned, its row alone needs writing out)."""
    survey = survey_queue(session, queries.queued_jobs(session=session, locking=False), now)
    nodes = survey.nodes if survey.nodes is not None else free_capacity(session)
    data = []
    for position, job in enumerate(survey.jobs, start=1):
        if only is not None and job.id not in only:
            continue
        decision = survey.decisions[job.id]
        if isinstance(decision, Placement):  # it fits: the next turn of the clock starts it
            decision = Pending(
                PendingCode.STARTING,
                "it fits now: it starts at the server's next turn",
                nodes_needed=job.spec.topology.num_machines,
            )
        spec = job.spec
        data.append(
            public.QueuedJobPublic(
                position=position,
                job_id=job.id,
                name=job.name,
                owner=job.owner,
                priority=job.priority,
                created_at=job.created_at,
                needs=public.NeedsPublic(
                    nodes=spec.topology.num_machines,
                    gpus_per_node=spec.topology.num_processes if spec.backend == "nccl" else 0,
                    trainer=None if spec.script else spec.trainer,
                    script=spec.script.path if spec.script else None,
                ),
                pending=public.PendingPublic.model_validate(decision, from_attributes=True),
            )
        )
    return public.QueuePublic(
        data=data,
        count=len(survey.jobs),
        nodes_live=len(nodes),
        slots_free=sum(max(0, n.free_slots) for n in nodes),
    )


def read_job(*, db: Database, job_id: int) -> public.JobPublic:
    with db.read() as session:
        job = queries.get_job(session=session, job_id=job_id)
        if job is None:
            raise NotFound(f"job {job_id} not found")
        return _public_jobs(session, [job])[0]


def read_jobs(
    *, db: Database, status: JobStatus | None, limit: int, offset: int
) -> public.JobsPublic:
    with db.read() as session:
        jobs, count = queries.list_jobs(
            session=session,
            status=status,
            limit=limit,
            offset=offset,
        )
        return public.JobsPublic(data=_public_jobs(session, jobs), count=count)


def read_metrics(*, db: Database, job_id: int, max_points: int) -> public.MetricsPublic:
    with db.read() as session:
        job = queries.get_job(session=session, job_id=job_id)
        if job is None:
            raise NotFound(f"job {job_id} not found")
        rows = [
            r
            for r in queries.progress_of_job(session=session, job_id=job_id)
            if r.attempt_id == job.current_attempt_id
        ]
    # Long jobs: keep an even spread of points, always including the last.
    if len(rows) > max_points:
        stride = len(rows) / max_points
        picked = [rows[int(i * stride)] for i in range(max_points - 1)] + [rows[-1]]
        rows = picked
    points = [
        public.MetricPoint(
            epoch=r.epoch,
            batch=r.batch,
            step=report_step(r.step, r.epoch, r.batch, r.batches_per_epoch),
            loss=r.loss,
            samples_per_sec=r.samples_per_sec,
            metrics=r.metrics or {},
            at=r.at,
        )
        for r in rows
    ]
    return public.MetricsPublic(job_id=job_id, names=_metric_names(points), points=points)


def _metric_names(points: list[public.MetricPoint]) -> list[str]:
    names: dict[str, None] = {}
    for built_in in ("loss", "samples_per_sec"):
        if any(getattr(p, built_in) is not None for p in points):
            names[built_in] = None
    for point in points:
        names.update(dict.fromkeys(point.metrics))
    return list(names)


# However long its lines, a page of logs stays about this size (10,000 lines
# of 4,000 four-byte characters would be 160 MB): a reader pages on with
# next_since, and the server never builds an answer it cannot afford to
# cache.
LOG_PAGE_BYTES = 2**20
# What a line costs in the answer besides its text.
LOG_LINE_OVERHEAD_BYTES = 100


def _within_bytes(rows: list[LogRow], budget: int, keep_newest: bool) -> list[LogRow]:
    """As many of ``rows`` as fit in ``budget`` bytes (at least one): the
    oldest first, or the newest with ``keep_newest`` (a tail)."""
    kept = 0
    spent = 0
    for row in reversed(rows) if keep_newest else rows:
        spent += len(row.text.encode()) + LOG_LINE_OVERHEAD_BYTES
        if kept and spent > budget:
            break
        kept += 1
    return rows[len(rows) - kept :] if keep_newest else rows[:kept]


def read_logs(
    *,
    db: Database,
    job_id: int,
    since: int,
    machine_id: int | None,
    rank: int | None,
    limit: int,
    tail: bool,
) -> public.LogsPublic:
    with db.read() as session:
        job = queries.get_job(session=session, job_id=job_id)
        if job is None:
            raise NotFound(f"job {job_id} not found")
        rows = queries.logs_of_job(
            session=session,
            job_id=job_id,
            since=since,
            machine_id=machine_id,
            rank=rank,
            limit=limit,
            newest=tail,
        )
    rows = _within_bytes(rows, LOG_PAGE_BYTES, keep_newest=tail)
    return public.LogsPublic(
        lines=[
            public.LogLinePublic(
                id=r.id or 0,
                machine_id=r.machine_id,
                rank=None if r.rank == LAUNCHER_RANK else r.rank,
                text=r.text,
                at=r.at,
            )
            for r in rows
        ],
        next_since=(rows[-1].id or since) if rows else since,
        job_status=job.status,
    )


def read_nodes(
    *, db: Database, state: NodeState | None, limit: int, offset: int
) -> public.NodesPublic:
    with db.read() as session:
        nodes, count = queries.list_nodes(session=session, state=state, limit=limit, offset=offset)
        return public.NodesPublic(data=_public_nodes(session, nodes), count=count)


def read_node(*, db: Database, node_id: int) -> public.NodePublic:
    with db.read() as session:
        node = queries.get_node(session=session, node_id=node_id)
        if node is None:
            raise NotFound(f"node {node_id} not found")
        return _public_nodes(session, [node])[0]


def _public_nodes(session: Session, nodes: list[Node]) -> list[public.NodePublic]:
    active = queries.active_parts_on_nodes(
        session=session, node_ids=[n.id for n in nodes if n.id is not None]
    )
    by_node: dict[int, list[public.NodePart]] = defaultdict(list)
    for part in active:
        by_node[part.node_id].append(
            public.NodePart(job_id=part.job_id, machine_id=part.machine_id, status=part.status)
        )
    return [
        public.NodePublic(
            id=n.id or 0,
            name=n.name,
            address=n.address,
            slots=n.slots,
            gpus=n.gpus,
            cpus=n.cpus,
            trainers=n.trainers,
            state=n.state,
            registered_at=n.registered_at,
            last_heartbeat_at=n.last_heartbeat_at,
            parts=by_node.get(n.id or 0, []),
            drain=public.DrainPublic(
                reason=n.drain_reason,
                requested_at=n.drain_requested_at,
                deadline_at=n.drain_deadline_at,
            )
            if n.drain_reason is not None
            and n.drain_requested_at is not None
            and n.drain_deadline_at is not None
            else None,
        )
        for n in nodes
    ]


def study_rows(jobs: list[Job], now: datetime) -> list[public.StudyRowPublic]:
    """The scaling table: speedup and efficiency against the first row."""
    rows = []
    baseline: tuple[float, int] | None = None  # first row's training seconds, world size
    for job in jobs:
        spec, result = job.spec, job.result
        world_size = spec.topology.world_size
        training = result.train_seconds if result else None
        if job.study_index == 0 and training:
            baseline = (training, world_size)
        speedup = round(baseline[0] / training, 3) if baseline and training else None
        rows.append(
            public.StudyRowPublic(
                job_id=job.id or 0,
                status=job.status,
                num_machines=spec.topology.num_machines,
                num_processes=spec.topology.num_processes,
                world_size=world_size,
                batch_size=spec.batch_size,
                global_batch_size=spec.batch_size * world_size,
                threads_per_process=result.threads_per_process if result else None,
                wall_seconds=_seconds(job.started_at, job.finished_at or now)
                if job.started_at
                else None,
                training_seconds=training,
                samples_per_sec=result.samples_per_sec if result else None,
                speedup=speedup,
                efficiency=round(speedup / (world_size / baseline[1]), 3)
                if speedup and baseline
                else None,
                train_loss=result.train_loss if result else None,
                test_accuracy=result.test_accuracy if result else None,
            )
        )
    return rows


def _public_studies(session: Session, studies: list[Study]) -> list[public.StudyPublic]:
    jobs: dict[int, list[Job]] = defaultdict(list)
    for job in queries.jobs_of_studies(
        session=session, study_ids=[s.id for s in studies if s.id is not None]
    ):
        if job.study_id is not None:
            jobs[job.study_id].append(job)
    now = utcnow()
    answers = []
    for study in studies:
        mine = jobs.get(study.id or 0, [])
        answers.append(
            public.StudyPublic(
                id=study.id or 0,
                name=study.name,
                owner=study.owner,
                status=study_status(j.status for j in mine),
                created_at=study.created_at,
                spec=mine[0].spec if mine else JobSpec(),
                rows=study_rows(mine, now),
            )
        )
    return answers


def read_study(*, db: Database, study_id: int) -> public.StudyPublic:
    with db.read() as session:
        study = queries.get_study(session=session, study_id=study_id)
        if study is None:
            raise NotFound(f"study {study_id} not found")
        return _public_studies(session, [study])[0]


def read_studies(*, db: Database, limit: int, offset: int) -> public.StudiesPublic:
    with db.read() as session:
        studies = queries.list_studies(session=session, limit=limit, offset=offset)
        return public.StudiesPublic(data=_public_studies(session, studies))


def key_public(key: ApiKey) -> people.KeyPublic:
    return people.KeyPublic.model_validate(key, from_attributes=True)


def read_keys(*, db: Database) -> people.KeysPublic:
    with db.read() as session:
        return people.KeysPublic(data=[key_public(k) for k in queries.list_keys(session=session)])


def read_audit(
    *,
    db: Database,
    limit: int,
    before: int | None,
    actor: str | None,
    action: people.AuditAction | None,
    target: str | None,
) -> people.AuditPublic:
    with db.read() as session:
        rows = queries.audit_entries(
            session=session, limit=limit, before=before, actor=actor, action=action, target=target
        )
    entries = [people.AuditEntryPublic.model_validate(r, from_attributes=True) for r in rows]
    return people.AuditPublic(
        data=entries, next_before=entries[-1].id if len(entries) == limit else None
    )
