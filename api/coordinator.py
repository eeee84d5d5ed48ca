"""What the server does when something happens: a job is submitted or
cancelled, a node registers or polls, a part reports. Each public method is
one database transaction; status changes go through api.lifecycle and
placement decisions through api.scheduling.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi import HTTPException
from sqlmodel import Session

from api.auth import NodeCredentials, new_node_credential
from api.lifecycle import (
    JobStatus,
    NodeState,
    PartStatus,
    backoff_seconds,
    can_cancel,
    is_retryable,
    move_job,
    move_part,
    settle_job,
    study_status,
)
from api.scheduling import NodeCapacity, Pending, Placement, plan
from api.schemas import (
    Assignment,
    JobError,
    JobSpec,
    LogBatch,
    LogLine,
    NodeRegistration,
    PartFinished,
    PollResponse,
    ProgressBatch,
    Rendezvous,
    RendezvousBound,
    StudyCreate,
    Topology,
)
from api.settings import ServerSettings
from db import queries
from db.engine import Database
from db.models import LAUNCHER_RANK, Attempt, Job, LogRow, Node, Part, ProgressRow, utcnow

log = logging.getLogger(__name__)


class Coordinator:
    """The server's decisions, bound to its database and settings."""

    def __init__(
        self, db: Database, settings: ServerSettings, credentials: NodeCredentials
    ) -> None:
        self.db = db
        self.settings = settings
        self.credentials = credentials
        self._started = time.monotonic()
        # node id -> when a request from it last arrived (monotonic). Any
        # request proves a node alive, and it is noted before the request
        # waits for the database: a node stuck behind a busy server is not
        # a lost node.
        self._sightings: dict[int, float] = {}
        self._sightings_lock = threading.Lock()

    def saw(self, node_id: int) -> None:
        """Note that a request from this node arrived (any request counts)."""
        with self._sightings_lock:
            self._sightings[node_id] = time.monotonic()

    def _seen_within(self, node_id: int, seconds: float) -> bool:
        with self._sightings_lock:
            seen = self._sightings.get(node_id)
        return seen is not None and time.monotonic() - seen < seconds

    # --- jobs -----------------------------------------------------------------

    def submit_job(self, spec: JobSpec, idempotency_key: str | None = None) -> tuple[int, bool]:
        """The job's id, and whether it is new: a key seen before returns its
        job (the same spec) rather than a second one."""
        stored = spec.model_dump(mode="json")
        with self.db.write() as session:
            if idempotency_key is not None:
                existing = queries.get_job_by_idempotency_key(session=session, key=idempotency_key)
                if existing is not None:
                    assert existing.id is not None
                    if existing.spec != stored:
                        raise HTTPException(
                            409,
                            f"Idempotency-Key {idempotency_key!r} was used for job "
                            f"{existing.id} with a different spec",
                        )
                    return existing.id, False
            job = queries.insert_job(
                session=session, spec=stored, name=spec.name, idempotency_key=idempotency_key
            )
            self._schedule(session)
            assert job.id is not None
            log.info("job %d submitted: %s", job.id, spec.model_dump_json())
            return job.id, True

    def cancel_job(self, job_id: int) -> None:
        with self.db.write() as session:
            job = _job_or_404(session, job_id, for_update=True)
            status = JobStatus(job.status)
            if not can_cancel(status):
                raise HTTPException(409, f"job {job_id} is already {status.value}")
            _cancel(session, job, utcnow(), self.settings)

    def submit_study(self, create: StudyCreate) -> int:
        """The study and all its jobs, queued at once; they run in row order."""
        with self.db.write() as session:
            study = queries.insert_study(session=session, name=create.name)
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
                    spec=spec.model_dump(mode="json"),
                    name=spec.name,
                    study_id=study.id,
                    study_index=index,
                )
            self._schedule(session)
            log.info("study %d submitted with %d row(s)", study.id, len(create.rows))
            return study.id

    def cancel_study(self, study_id: int) -> None:
        with self.db.write() as session:
            if queries.get_study(session=session, study_id=study_id) is None:
                raise HTTPException(404, f"study {study_id} not found")
            now = utcnow()
            rows = queries.jobs_of_studies(session=session, study_ids=[study_id])
            if not any(can_cancel(JobStatus(job.status)) for job in rows):
                status = study_status(JobStatus(job.status) for job in rows)
                raise HTTPException(409, f"study {study_id} is already {status.value}")
            for job in rows:
                if can_cancel(JobStatus(job.status)):
                    _cancel(session, job, now, self.settings)

    # --- nodes ----------------------------------------------------------------

    def register_node(
        self, registration: NodeRegistration, caller_node: int | None, enforce: bool
    ) -> tuple[int, str | None]:
        """Create the node, or take it back under the same name after a
        restart. Returns its id and, unless the caller presented the node's
        own credential, a new credential for it (shown this once).

        With tokens enforced, a known name is taken back only with that
        node's credential: the join token makes new nodes, it cannot take
        over a running one. A revoked node's name stays retired either way.

        A restarted worker has no processes left, so whatever parts the
        server still thought it ran are lost.
        """
        now = utcnow()
        credential = None
        with self.db.write() as session:
            node = queries.get_node_by_name(session=session, name=registration.name)
            _check_may_register(node, registration.name, caller_node, enforce)
            if node is None:
                node = Node(name=registration.name, address=registration.address)
                session.add(node)
            if caller_node is None:  # not the node's own (checked above): a new one
                credential, node.credential_digest = new_node_credential()
            node.address = registration.address
            node.slots = registration.slots
            node.gpus = registration.gpus
            node.cpus = registration.cpus
            node.trainers = list(registration.trainers)
            node.state = NodeState.LIVE.value
            node.last_heartbeat_at = now
            session.flush()
            assert node.id is not None
            node_id, new_digest = node.id, node.credential_digest
            orphaned = queries.active_parts_on_nodes(session=session, node_ids=[node.id])
            _lose_parts(session, orphaned, {node.id: node}, "worker_restarted", now, self.settings)
            self._schedule(session)
            log.info(
                "node %d (%s) registered at %s with %d slot(s), %d GPU(s)",
                node.id,
                node.name,
                node.address,
                node.slots,
                node.gpus,
            )
        if credential is not None and new_digest is not None:
            self.credentials.bind(node_id, new_digest)  # once committed
        return node_id, credential

    def revoke_node(self, node_id: int) -> None:
        """Refuse the node's credential from now on, retire its name, and
        take its parts back (their jobs restart elsewhere if they may)."""
        now = utcnow()
        with self.db.write() as session:
            node = queries.get_node(session=session, node_id=node_id)
            if node is None:
                raise HTTPException(404, f"node {node_id} not found")
            if node.state != NodeState.REVOKED.value:
                node.state = NodeState.REVOKED.value
                node.credential_digest = None
                parts = queries.active_parts_on_nodes(session=session, node_ids=[node_id])
                _lose_parts(session, parts, {node_id: node}, "node_revoked", now, self.settings)
                self._schedule(session)
                log.warning("node %d (%s) revoked", node_id, node.name)
        self.credentials.revoke(node_id)

    def node_holds_job(self, node_id: int, job_id: int) -> bool:
        """Whether the node runs (or is about to run) a part of the job."""
        with self.db.read() as session:
            return any(
                p.job_id == job_id
                for p in queries.active_parts_on_nodes(session=session, node_ids=[node_id])
            )

    def poll_node(
        self, node_id: int, active_part_ids: list[int], waiting_for_port: list[int]
    ) -> PollResponse:
        """Heartbeat, place what can be placed, and tell the node what to
        start and what to stop."""
        self.saw(node_id)
        with self.db.write() as session:
            node = _heard_from(session, node_id)
            if node.state != NodeState.LIVE.value:
                log.warning("node %d (%s) is back after being lost", node_id, node.name)
                node.state = NodeState.LIVE.value
                self._schedule(session)  # it has room again
            # Otherwise nothing to place: every event that can make a queued
            # job placeable (a submit, a part ending, a node registering or
            # lost, a backoff ending) schedules in its own transaction. Polls
            # are the busiest writes; with hundreds queued, planning on each
            # one kept nodes waiting on the server for seconds.

            mine = queries.active_parts_on_nodes(session=session, node_ids=[node_id])
            reported = set(active_part_ids)
            attempts = queries.get_attempts(
                session=session, attempt_ids=[p.attempt_id for p in mine]
            )
            start = [
                _assignment(session, p, attempts[p.attempt_id])
                for p in mine
                if p.status == PartStatus.ASSIGNED.value and p.id not in reported
            ]
            waiting = set(waiting_for_port)
            rendezvous = [
                Rendezvous(part_id=p.id, master_port=port)
                for p in mine
                if p.id in waiting and (port := attempts[p.attempt_id].master_port) is not None
            ]
            return PollResponse(
                start=start, stop=_to_stop(session, node_id, mine, reported), rendezvous=rendezvous
            )

    def heartbeat(self, node_id: int, active_part_ids: list[int]) -> list[int]:
        """The node is alive; the parts it runs that it must stop. Sent by the
        daemon's own thread whatever else it is doing (a launch, a transfer
        over a slow link), so it is light: no placement, no assignments. A
        node back from a partition learns here, within a heartbeat, which of
        its parts were given away meanwhile."""
        self.saw(node_id)
        with self.db.write() as session:
            _heard_from(session, node_id)
            mine = queries.active_parts_on_nodes(session=session, node_ids=[node_id])
            return _to_stop(session, node_id, mine, set(active_part_ids))

    def sweep_lost_nodes(self) -> bool:
        """Mark nodes that stopped heartbeating as lost, and their parts with them."""
        if time.monotonic() - self._started < self.settings.heartbeat_timeout_s:
            # Just (re)started: nodes have not had a chance to reach us yet.
            return False
        now = utcnow()
        cutoff = now - timedelta(seconds=self.settings.heartbeat_timeout_s)
        with self.db.write() as session:
            stale = [
                n
                for n in queries.stale_live_nodes(session=session, heartbeat_before=cutoff)
                if n.id is not None
                and not self._seen_within(n.id, self.settings.heartbeat_timeout_s)
            ]
            if not stale:
                return False
            nodes = {n.id: n for n in stale if n.id is not None}
            for node in stale:
                node.state = NodeState.LOST.value
                log.warning(
                    "node %d (%s) lost: no heartbeat since %s",
                    node.id,
                    node.name,
                    node.last_heartbeat_at.isoformat(),
                )
            parts = queries.active_parts_on_nodes(session=session, node_ids=nodes)
            _lose_parts(session, parts, nodes, "node_lost", now, self.settings)
            self._schedule(session)
            return True

    def tick(self, judge_nodes: bool = True) -> bool:
        """The server's clock: lost nodes (unless told the server itself was
        too stalled to judge), deadlines, retries whose backoff has passed.
        True if anything changed (nodes should hear of it)."""
        lost = self.sweep_lost_nodes() if judge_nodes else False
        now = utcnow()
        with self.db.write() as session:
            late = queries.jobs_past_deadline(session=session, now=now)
            for job in late:
                _fail_at_deadline(session, job, now)
            placed = self._schedule(session)
        return lost or bool(late) or placed

    # --- part reports ---------------------------------------------------------

    def part_started(self, part_id: int, node_id: int) -> bool:
        """The node launched the part's processes. False: it should not have."""
        self.saw(node_id)
        with self.db.write() as session:
            part = _owned_part(session, part_id, node_id)
            if part.status != PartStatus.ASSIGNED.value or not _is_current(session, part):
                return False
            part.status = move_part(PartStatus(part.status), PartStatus.RUNNING).value
            part.started_at = utcnow()
            return True

    def record_rendezvous(self, part_id: int, report: RendezvousBound) -> bool:
        """Machine 0's launcher bound the job's rendezvous store on this port;
        the other machines learn it from their next poll."""
        self.saw(report.node_id)
        with self.db.write() as session:
            part = _owned_part(session, part_id, report.node_id)
            if part.machine_id != 0:
                raise HTTPException(
                    409,
                    f"part {part_id} is machine {part.machine_id}; "
                    "only machine 0 hosts the rendezvous",
                )
            attempt = queries.get_attempt(session=session, attempt_id=part.attempt_id)
            assert attempt is not None
            if attempt.master_port is not None and attempt.master_port != report.master_port:
                raise HTTPException(
                    409, f"attempt {attempt.id} already rendezvous at port {attempt.master_port}"
                )
            if not _is_current(session, part) or PartStatus(part.status).is_terminal():
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

    def check_checkpoint_upload(self, part_id: int, node_id: int) -> None:
        """Refuse an upload before its bytes are read: wrong node, not machine 0."""
        with self.db.read() as session:
            part = _owned_part(session, part_id, node_id)
            if part.machine_id != 0:
                raise HTTPException(
                    409, f"part {part_id} is machine {part.machine_id}; rank 0 is on machine 0"
                )

    def record_checkpoint(
        self, part_id: int, node_id: int, epoch: int, staged: Path, size: int
    ) -> bool:
        """Keep an uploaded checkpoint (a staged file) as the job's newest."""
        with self.db.write() as session:
            part = _owned_part(session, part_id, node_id)
            job = _job_or_404(session, part.job_id, for_update=True)
            if job.current_attempt_id != part.attempt_id or (
                job.checkpoint_epoch is not None and epoch < job.checkpoint_epoch
            ):
                staged.unlink(missing_ok=True)
                return False
            folder = self.settings.artifacts_dir / f"job-{job.id}"
            folder.mkdir(parents=True, exist_ok=True)
            final = folder / f"epoch-{epoch}.pt"
            os.replace(staged, final)
            if job.checkpoint_file and job.checkpoint_file != final.name:
                (folder / job.checkpoint_file).unlink(missing_ok=True)
            job.checkpoint_epoch, job.checkpoint_file, job.checkpoint_bytes = (
                epoch,
                final.name,
                size,
            )
            log.info("job %d: checkpoint of epoch %d kept (%d bytes)", job.id, epoch, size)
            return True

    def checkpoint_path(self, job_id: int) -> tuple[Path, int]:
        with self.db.read() as session:
            job = _job_or_404(session, job_id)
            if job.checkpoint_file is None or job.checkpoint_epoch is None:
                status = JobStatus(job.status)
                raise HTTPException(
                    404,
                    f"job {job_id} has no checkpoint: it ended ({status.value}) before its "
                    "first epoch did"
                    if status.is_terminal()
                    else f"job {job_id} has no checkpoint yet: rank 0 writes one at the end "
                    "of every epoch",
                )
            path = self.settings.artifacts_dir / f"job-{job_id}" / job.checkpoint_file
            return path, job.checkpoint_epoch

    def record_progress(self, part_id: int, batch: ProgressBatch) -> bool:
        self.saw(batch.node_id)
        with self.db.write() as session:
            part = _owned_part(session, part_id, batch.node_id)
            if not _is_current(session, part):
                return False
            job = _job_or_404(session, part.job_id)
            seen = queries.known_progress_seqs(
                session=session,
                attempt_id=part.attempt_id,
                seqs=[r.seq for r in batch.reports],
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
                    job.progress_at = latest.at
            return True

    def record_logs(self, part_id: int, batch: LogBatch) -> bool:
        """Store the lines not stored yet. Lines of an attempt that is no
        longer current are kept too (they explain what happened to it),
        except from a part that was lost."""
        self.saw(batch.node_id)
        with self.db.write() as session:
            part = _owned_part(session, part_id, batch.node_id)
            if part.status == PartStatus.LOST.value:
                # Its node was silent and its work given away: what the node
                # says now comes from ranks that ran on, cut off, and is not
                # part of any attempt's record.
                return False
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
                rows=(
                    LogRow(
                        job_id=part.job_id,
                        attempt_id=part.attempt_id,
                        machine_id=part.machine_id,
                        rank=rank,
                        offset=offset,
                        text=line.text,
                        at=line.at,
                    )
                    for (rank, offset), line in fresh.items()
                ),
            )
            return True

    def finish_part(self, part_id: int, report: PartFinished) -> bool:
        """A node's processes for this part have exited; settle the job."""
        self.saw(report.node_id)
        now = utcnow()
        with self.db.write() as session:
            part = _owned_part(session, part_id, report.node_id)
            if PartStatus(part.status).is_terminal():
                return False  # already settled: a resend, or the node was lost meanwhile
            if part.status == PartStatus.ASSIGNED.value and report.status != "cancelled":
                # Its "started" report was lost on the way; it did run.
                part.status = move_part(PartStatus.ASSIGNED, PartStatus.RUNNING).value
            part.status = move_part(PartStatus(part.status), PartStatus(report.status)).value
            part.finished_at = now
            part.exit_code = report.exit_code
            part.failing_rank = report.failing_rank
            part.error = report.traceback_tail or report.message
            job = _job_or_404(session, part.job_id, for_update=True)
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
                self._schedule(session)
                return False
            if report.result is not None and job.status == JobStatus.RUNNING.value:
                job.result = report.result.model_dump(mode="json")
            if report.status == PartStatus.FAILED.value:
                node = queries.get_node(session=session, node_id=part.node_id)
                error = JobError(
                    reason=report.reason or "rank_failed",
                    message=report.message
                    or f"machine {part.machine_id} failed with exit code {report.exit_code}",
                    machine_id=part.machine_id,
                    rank=report.failing_rank,
                    node=node.name if node else None,
                    exit_code=report.exit_code,
                    traceback_tail=report.traceback_tail,
                ).model_dump(mode="json")
                if job.status == JobStatus.QUEUED.value:
                    _explain_given_up_attempt(session, job, part.attempt_id, error, now)
                elif _may_explain(job, report.reason):
                    job.error = error
            _settle(session, job, now, self.settings)
            self._schedule(session)
            return True

    # --- placement ------------------------------------------------------------

    def _schedule(self, session: Session) -> bool:
        """Start every queued job that can start now, each on all its machines
        in this one transaction. True if any started."""
        now = utcnow()
        queue = [
            j
            for j in queries.queued_jobs(session=session)
            if j.not_before is None or j.not_before <= now
        ]
        if not queue:
            return False
        nodes = {n.id: n for n in queries.live_nodes(session=session) if n.id is not None}
        busy = queries.active_part_counts(session=session)
        capacity = [
            NodeCapacity(
                node_id=node_id,
                name=n.name,
                free_slots=n.slots - busy.get(node_id, 0),
                gpus=n.gpus,
                trainers=frozenset(n.trainers),
            )
            for node_id, n in nodes.items()
        ]
        jobs = {j.id: j for j in queue if j.id is not None}
        # A study's jobs run one after another: each waits for the one before.
        for job_id, before in queries.study_predecessors(session=session, jobs=queue).items():
            if not JobStatus(before.status).is_terminal():
                jobs.pop(
                    job_id
                ).pending_reason = f"study {before.study_id}: waiting for job {before.id} to end"
        decisions = plan(
            [(job_id, JobSpec.model_validate(j.spec)) for job_id, j in jobs.items()], capacity
        )
        placed = False
        for job_id, decision in decisions.items():
            job = jobs[job_id]
            if isinstance(decision, Pending):
                job.pending_reason = decision.reason
            elif isinstance(decision, Placement):
                self._start(session, job, [nodes[i] for i in decision.node_ids], now)
                placed = True
        return placed

    def _start(self, session: Session, job: Job, nodes: list[Node], now: datetime) -> None:
        assert job.id is not None
        job.attempt_count += 1
        attempt = queries.insert_attempt(
            session=session, job_id=job.id, number=job.attempt_count, master_addr=nodes[0].address
        )
        assert attempt.id is not None
        # A retry continues from the last whole checkpoint (one of an earlier
        # attempt: the first has none).
        attempt.resumed_from_epoch = job.checkpoint_epoch
        spec = JobSpec.model_validate(job.spec)
        if job.deadline_at is None and spec.max_run_seconds is not None:
            job.deadline_at = now + timedelta(seconds=spec.max_run_seconds)
        for machine_id, node in enumerate(nodes):
            assert node.id is not None
            queries.insert_part(
                session=session,
                job_id=job.id,
                attempt_id=attempt.id,
                machine_id=machine_id,
                node_id=node.id,
            )
        job.current_attempt_id = attempt.id
        job.progress_seq = None
        job.not_before = None
        _set_job_status(session, job, JobStatus.RUNNING, now)
        log.info(
            "job %d attempt %d placed on %s",
            job.id,
            attempt.number,
            ", ".join(n.name for n in nodes),
        )


# --- steps shared by the methods above ----------------------------------------


def _cancel(session: Session, job: Job, now: datetime, settings: ServerSettings) -> None:
    status = JobStatus(job.status)
    if status is JobStatus.QUEUED:
        _set_job_status(session, job, JobStatus.CANCELLED, now)
    elif status is JobStatus.RUNNING:
        _set_job_status(session, job, JobStatus.CANCELLING, now)
        _stop_active_parts(session, job)
        _settle(session, job, now, settings)
    log.info("job %d: cancel requested (was %s)", job.id, status.value)


def _check_may_register(
    node: Node | None, name: str, caller_node: int | None, enforce: bool
) -> None:
    if node is not None and node.state == NodeState.REVOKED.value:
        raise HTTPException(
            403,
            f"name: node {name!r} (id {node.id}) was revoked by an admin; "
            "a machine may join again only under a new name",
        )
    if not enforce:
        return
    if caller_node is not None and (node is None or node.id != caller_node):
        raise HTTPException(
            403, f"name: this credential is node {caller_node}'s; it cannot register as {name!r}"
        )
    if caller_node is None and node is not None:
        raise HTTPException(
            409,
            f"name: {name!r} is node {node.id}; only the worker holding that node's "
            "credential (its credential file) registers under it again. If the file is "
            f"lost, an admin revokes node {node.id} and the machine joins under a new name",
        )


def _heard_from(session: Session, node_id: int) -> Node:
    """The node a poll or heartbeat came from, its heartbeat noted."""
    node = queries.get_node(session=session, node_id=node_id)
    if node is None:
        raise HTTPException(404, f"node {node_id} not found; register again")
    if node.state == NodeState.REVOKED.value:
        raise HTTPException(403, f"node {node_id} was revoked by an admin")
    node.last_heartbeat_at = utcnow()
    return node


def _to_stop(session: Session, node_id: int, mine: list[Part], reported: set[int]) -> list[int]:
    """What the node runs but should not: parts asked to stop, and parts the
    server has already settled (or never gave this node)."""
    stop = {p.id for p in mine if p.status == PartStatus.STOPPING.value}
    known = {p.id: p for p in queries.parts_by_ids(session=session, part_ids=reported)}
    for part_id in reported:
        part = known.get(part_id)
        if (
            part is None
            or part.node_id != node_id
            or part.status not in (PartStatus.ASSIGNED.value, PartStatus.RUNNING.value)
        ):
            stop.add(part_id)
    return sorted(x for x in stop if x is not None)


def _job_or_404(session: Session, job_id: int, *, for_update: bool = False) -> Job:
    job = queries.get_job(session=session, job_id=job_id, for_update=for_update)
    if job is None:
        raise HTTPException(404, f"job {job_id} not found")
    return job


def _owned_part(session: Session, part_id: int, node_id: int) -> Part:
    part = queries.get_part(session=session, part_id=part_id)
    if part is None:
        raise HTTPException(404, f"part {part_id} not found")
    if part.node_id != node_id:
        raise HTTPException(403, f"part {part_id} is not assigned to node {node_id}")
    return part


def _is_current(session: Session, part: Part) -> bool:
    """Whether the part belongs to the attempt its job is running now: the
    fence every report from a node passes."""
    job = queries.get_job(session=session, job_id=part.job_id)
    return (
        job is not None
        and job.current_attempt_id == part.attempt_id
        and job.status == JobStatus.RUNNING.value
    )


def _may_explain(job: Job, reason: str | None) -> bool:
    """Whether a failure with this reason should become the job's error: the
    first one, unless that only said a peer went away and this one says why."""
    if job.status == JobStatus.CANCELLING.value or job.status == JobStatus.CANCELLED.value:
        return False
    if job.error is None:
        return True
    return job.error.get("reason") == "peer_failure" and reason != "peer_failure"


def _assignment(session: Session, part: Part, attempt: Attempt) -> Assignment:
    job = queries.get_job(session=session, job_id=part.job_id)
    assert job is not None and part.id is not None
    return Assignment(
        part_id=part.id,
        job_id=part.job_id,
        attempt_id=part.attempt_id,
        machine_id=part.machine_id,
        spec=JobSpec.model_validate(job.spec),
        master_addr=attempt.master_addr,
        master_port=attempt.master_port,
        resume_epoch=attempt.resumed_from_epoch,
    )


def _lose_parts(
    session: Session,
    parts: Iterable[Part],
    nodes: dict[int, Node],
    reason: str,
    now: datetime,
    settings: ServerSettings,
) -> None:
    what = {"node_lost": "stopped heartbeating", "node_revoked": "was revoked"}.get(
        reason, "restarted"
    )
    for part in parts:
        part.status = move_part(PartStatus(part.status), PartStatus.LOST).value
        part.finished_at = now
        node = nodes[part.node_id]
        part.error = f"node {node.name} {what}"
        job = _job_or_404(session, part.job_id, for_update=True)
        if job.current_attempt_id != part.attempt_id:
            continue
        if _may_explain(job, reason):
            job.error = JobError(
                reason=reason,
                message=f"node {node.name} (machine {part.machine_id}) {what}",
                machine_id=part.machine_id,
                node=node.name,
            ).model_dump(mode="json")
        _settle(session, job, now, settings)


def _settle(session: Session, job: Job, now: datetime, settings: ServerSettings) -> None:
    if job.current_attempt_id is None:
        return
    parts = queries.parts_of_attempt(session=session, attempt_id=job.current_attempt_id)
    current = JobStatus(job.status)
    new = settle_job(current, (PartStatus(p.status) for p in parts))
    if new is current:
        return
    if new is JobStatus.FAILED:
        if job.error is None:
            job.error = JobError(
                reason="part_stopped", message="a part stopped without being asked to"
            ).model_dump(mode="json")
        _stop_active_parts(session, job)
        if _restarts_left(job, now):
            _requeue(session, job, now, settings)
            return
    _set_job_status(session, job, new, now)


def _restarts_left(job: Job, now: datetime) -> bool:
    """Whether this failed attempt may be followed by another."""
    spec = JobSpec.model_validate(job.spec)
    error = JobError.model_validate(job.error) if job.error else None
    return (
        error is not None
        and is_retryable(error.reason, error.exit_code)
        and job.attempt_count - 1 < spec.max_restarts
        and (job.deadline_at is None or job.deadline_at > now)
    )


def _requeue(session: Session, job: Job, now: datetime, settings: ServerSettings) -> None:
    """Give up the current attempt and queue the job for a new one, after a
    backoff. The old attempt's parts are being stopped: they hold their
    nodes' slots until their nodes confirm, so the new attempt cannot start
    beside a stale one."""
    spec = JobSpec.model_validate(job.spec)
    restarts_done = job.attempt_count - 1
    wait = backoff_seconds(restarts_done, settings.retry_backoff_s, settings.retry_backoff_max_s)
    error = job.error or {}
    _set_job_status(session, job, JobStatus.QUEUED, now)  # keeps the error on the attempt
    job.not_before = now + timedelta(seconds=wait)
    job.pending_reason = (
        f"restart {restarts_done + 1} of {spec.max_restarts} after {error.get('reason')}"
        + (
            f", from the checkpoint of epoch {job.checkpoint_epoch}"
            if job.checkpoint_epoch is not None
            else ", from the start (no checkpoint yet)"
        )
    )
    job.error = None
    log.warning(
        "job %d attempt %d failed (%s): %s",
        job.id,
        job.attempt_count,
        error.get("reason"),
        job.pending_reason,
    )


def _explain_given_up_attempt(
    session: Session, job: Job, attempt_id: int, error: dict[str, Any], now: datetime
) -> None:
    """A report that arrives after its attempt was given up for a retry. The
    retry was decided on the first failure heard of; if that only said a
    peer went away and this one names the cause, the cause is kept, and a
    cause that a retry cannot fix (the training code raised) ends the job."""
    attempt = queries.get_attempt(session=session, attempt_id=attempt_id)
    if attempt is None or attempt.error is None:
        return
    if attempt.error.get("reason") != "peer_failure" or error["reason"] == "peer_failure":
        return
    attempt.error = error
    if not is_retryable(error["reason"], error.get("exit_code")):
        job.error = error
        _set_job_status(session, job, JobStatus.FAILED, now)


def _fail_at_deadline(session: Session, job: Job, now: datetime) -> None:
    spec = JobSpec.model_validate(job.spec)
    job.error = JobError(
        reason="deadline",
        message=f"still {job.status} after max_run_seconds={spec.max_run_seconds:g}",
    ).model_dump(mode="json")
    _stop_active_parts(session, job)
    _set_job_status(session, job, JobStatus.FAILED, now)


def _set_job_status(session: Session, job: Job, new: JobStatus, now: datetime) -> None:
    job.status = move_job(JobStatus(job.status), new).value
    if new is JobStatus.RUNNING:
        job.started_at = job.started_at or now  # the first start: retries do not reset it
        job.pending_reason = None
    if new.is_terminal():
        job.finished_at = now
        job.pending_reason = None
        job.not_before = None
    if (new.is_terminal() or new is JobStatus.QUEUED) and job.current_attempt_id is not None:
        # The current attempt is over: the job ended, or gave it up to retry.
        attempt = queries.get_attempt(session=session, attempt_id=job.current_attempt_id)
        if attempt is not None and attempt.finished_at is None:
            attempt.finished_at = now
            failed = new in (JobStatus.FAILED, JobStatus.QUEUED)
            attempt.error = job.error if failed else None
    log.info("job %d: %s", job.id, new.value)


def _stop_active_parts(session: Session, job: Job) -> None:
    if job.current_attempt_id is None:
        return
    for part in queries.parts_of_attempt(session=session, attempt_id=job.current_attempt_id):
        if part.status in (PartStatus.ASSIGNED.value, PartStatus.RUNNING.value):
            part.status = move_part(PartStatus(part.status), PartStatus.STOPPING).value
