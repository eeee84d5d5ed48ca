"""Node membership and the poll protocol: a node registers (or comes back
under its name), polls for what to start and stop, heartbeats, and may be
revoked by an admin."""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlmodel import Session

from api.core import stops
from api.core.context import Core
from api.core.errors import Conflict, Forbidden, NotFound, TooMany
from api.core.people import Actor, record
from api.core.placement import schedule
from api.core.settlement import lose_parts
from api.credentials import new_node_credential
from api.settings import ServerSettings
from db import queries
from db.models import Attempt, Node, Part, utcnow
from ddpo import store
from ddpo.failures import FailureReason
from ddpo.lifecycle import NodeState, PartStatus, StopReason
from ddpo.schemas import (
    Assignment,
    HeartbeatResponse,
    NodeRegistration,
    PollResponse,
    Rendezvous,
    StoredObject,
    TrackingRun,
)
from ddpo.schemas.people import AuditAction

log = logging.getLogger(__name__)


def register_node(
    core: Core, registration: NodeRegistration, caller_node: int | None, enforce: bool
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
    with core.db.write() as session:
        node = queries.get_node_by_name(session=session, name=registration.name)
        _check_may_register(node, registration.name, caller_node, enforce)
        if node is None:
            _check_room_for_a_new_node(core, session)
            node = Node(name=registration.name, address=registration.address)
            session.add(node)
        if caller_node is None:  # not the node's own (checked above): a new one
            credential, node.credential_digest = new_node_credential()
        node.address = registration.address
        node.slots = registration.slots
        node.gpus = registration.gpus
        node.cpus = registration.cpus
        node.trainers = [offer.name for offer in registration.offers]
        node.trainer_offers = [offer.model_dump(mode="json") for offer in registration.offers]
        node.scripts = {script.path: script.sha256 for script in registration.scripts}
        node.state = NodeState.LIVE
        node.last_heartbeat_at = now
        if node.drain_reason is StopReason.NODE_LEAVING:
            # Its worker left and is back: it takes parts again (an admin's
            # drain stays until undrained).
            node.drain_reason = node.drain_requested_at = node.drain_deadline_at = None
        session.flush()
        assert node.id is not None
        node_id, new_digest = node.id, node.credential_digest
        orphaned = queries.active_parts_on_nodes(session=session, node_ids=[node.id])
        lose_parts(
            session,
            orphaned,
            {node.id: node},
            FailureReason.WORKER_RESTARTED,
            "restarted",
            now,
            core.settings,
        )
        schedule(session, core.settings)
        log.info(
            "node %d (%s) registered at %s with %d slot(s), %d GPU(s)",
            node.id,
            node.name,
            node.address,
            node.slots,
            node.gpus,
        )
    if credential is not None and new_digest is not None:
        core.credentials.bind(node_id, new_digest)  # once committed
    return node_id, credential


def _check_may_register(
    node: Node | None, name: str, caller_node: int | None, enforce: bool
) -> None:
    if node is not None and node.state is NodeState.REVOKED:
        raise Forbidden(
            f"name: node {name!r} (id {node.id}) was revoked by an admin; "
            "a machine may join again only under a new name"
        )
    if not enforce:
        return
    if caller_node is not None and (node is None or node.id != caller_node):
        raise Forbidden(
            f"name: this credential is node {caller_node}'s; it cannot register as {name!r}"
        )
    if caller_node is None and node is not None:
        raise Conflict(
            f"name: {name!r} is node {node.id}; only the worker holding that node's "
            "credential (its credential file) registers under it again. If the file is "
            f"lost, an admin revokes node {node.id} and the machine joins under a new name"
        )


def _check_room_for_a_new_node(core: Core, session: Session) -> None:
    limit = core.settings.max_nodes
    if queries.count_unrevoked_nodes(session=session) >= limit:
        raise Forbidden(
            f"name: this server holds DDPO_MAX_NODES={limit} nodes already; an admin "
            "revokes one, or the server is started with a higher limit"
        )
    wait_s = core.joins.admit()
    if wait_s > 0:
        per_minute = core.settings.registrations_per_minute
        raise TooMany(
            f"{per_minute} new nodes joined in the last minute "
            f"(DDPO_REGISTRATIONS_PER_MINUTE); try again in {wait_s:.0f} s",
            retry_after_s=wait_s,
        )


def revoke_node(core: Core, node_id: int, actor: Actor) -> None:
    """Refuse the node's credential from now on, retire its name, and
    take its parts back (their jobs restart elsewhere if they may). Once
    revoked, revoking again changes nothing and records nothing."""
    now = utcnow()
    with core.db.write() as session:
        node = queries.get_node(session=session, node_id=node_id)
        if node is None:
            raise NotFound(f"node {node_id} not found")
        if node.state is not NodeState.REVOKED:
            node.state = NodeState.REVOKED
            node.credential_digest = None
            parts = queries.active_parts_on_nodes(session=session, node_ids=[node_id])
            record(
                session,
                actor,
                AuditAction.NODE_REVOKE,
                f"node {node_id}",
                name=node.name,
                parts_stopped=len(parts),
            )
            lose_parts(
                session,
                parts,
                {node_id: node},
                FailureReason.NODE_REVOKED,
                "was revoked",
                now,
                core.settings,
            )
            schedule(session, core.settings)
            log.warning("node %d (%s) revoked by %s", node_id, node.name, actor.name)
    core.credentials.revoke(node_id)


def drain_node(core: Core, node_id: int, deadline_s: float, actor: Actor) -> None:
    """Take the node out of service: from now on it takes no new part; its
    parts run until ``deadline_s`` from now, then their jobs are asked to
    stop at a step (within each job's stop grace) and start again
    elsewhere from it. Draining a drained node again sets the new deadline."""
    now = utcnow()
    with core.db.write() as session:
        node = _node_to_change(session, node_id)
        node.drain_reason = StopReason.DRAINED
        node.drain_requested_at = now
        node.drain_deadline_at = now + timedelta(seconds=deadline_s)
        parts = queries.active_parts_on_nodes(session=session, node_ids=[node_id])
        record(
            session,
            actor,
            AuditAction.NODE_DRAIN,
            f"node {node_id}",
            name=node.name,
            deadline_s=deadline_s,
            jobs=sorted({p.job_id for p in parts}),
        )
        stops.drain_due(session, now, core.settings)
        log.warning(
            "node %d (%s) drained by %s: its %d part(s) stop by %s",
            node_id,
            node.name,
            actor.name,
            len(parts),
            node.drain_deadline_at.isoformat(timespec="seconds"),
        )


def undrain_node(core: Core, node_id: int, actor: Actor) -> None:
    """Back in service: the node takes parts again (jobs already asked to
    stop still stop)."""
    with core.db.write() as session:
        node = _node_to_change(session, node_id)
        if node.drain_reason is None:
            return
        node.drain_reason = node.drain_requested_at = node.drain_deadline_at = None
        record(session, actor, AuditAction.NODE_UNDRAIN, f"node {node_id}", name=node.name)
        schedule(session, core.settings)
        log.info("node %d (%s) undrained by %s", node_id, node.name, actor.name)


def leave(core: Core, node_id: int, grace_s: float) -> None:
    """The node's worker is shutting down (SIGTERM: a Slurm walltime, a
    spot notice, systemctl stop): it takes no new part, and its parts'
    jobs are asked to stop at a step within ``grace_s`` (or their own
    grace, if shorter), to start again elsewhere; none fails, none uses a
    restart. It takes parts again once its worker registers anew."""
    now = utcnow()
    with core.db.write() as session:
        node = _known_node(session, node_id)
        node.drain_reason = StopReason.NODE_LEAVING
        node.drain_requested_at = node.drain_deadline_at = now
        parts = queries.active_parts_on_nodes(session=session, node_ids=[node_id])
        for job in queries.get_jobs(session=session, job_ids=sorted({p.job_id for p in parts})):
            stops.ask_to_stop(
                session,
                job,
                StopReason.NODE_LEAVING,
                f"node {node.name}",
                now,
                core.settings,
                within_s=grace_s,
            )
        log.warning(
            "node %d (%s) is leaving: %d part(s) to stop within %g s",
            node_id,
            node.name,
            len(parts),
            grace_s,
        )


def _node_to_change(session: Session, node_id: int) -> Node:
    node = queries.get_node(session=session, node_id=node_id)
    if node is None:
        raise NotFound(f"node {node_id} not found")
    if node.state is NodeState.REVOKED:
        raise Conflict(f"node {node_id} was revoked: it takes no part anyway")
    return node


def node_holds_job(core: Core, node_id: int, job_id: int) -> bool:
    """Whether the node runs (or is about to run) a part of the job."""
    with core.db.read() as session:
        return any(
            p.job_id == job_id
            for p in queries.active_parts_on_nodes(session=session, node_ids=[node_id])
        )


def poll_node(
    core: Core,
    node_id: int,
    active_part_ids: list[int],
    waiting_for_port: list[int],
    asked_to_stop: frozenset[int] = frozenset(),
) -> PollResponse:
    """Tell the node what to start, what to stop, and the rendezvous ports
    it waits for. A read: the poll's sign of life is a sighting (written
    with the others once a sweep interval, api/core/clock.py), and nothing
    else changes, unless the node is back after being lost."""
    core.sightings.saw(node_id)
    with core.db.read() as session:
        if _known_node(session, node_id).state is NodeState.LIVE:
            return _poll_answer(
                session, core, node_id, active_part_ids, waiting_for_port, asked_to_stop
            )
    with core.db.write() as session:
        node = _known_node(session, node_id)
        if node.state is not NodeState.LIVE:
            log.warning("node %d (%s) is back after being lost", node_id, node.name)
            node.state = NodeState.LIVE
            node.last_heartbeat_at = utcnow()
            schedule(session, core.settings)  # it has room again
        # Otherwise nothing to place: every event that can make a queued
        # job placeable (a submit, a part ending, a node registering or
        # lost, a backoff ending) schedules in its own transaction.
        return _poll_answer(
            session, core, node_id, active_part_ids, waiting_for_port, asked_to_stop
        )


def _poll_answer(
    session: Session,
    core: Core,
    node_id: int,
    active_part_ids: list[int],
    waiting_for_port: list[int],
    asked_to_stop: frozenset[int],
) -> PollResponse:
    mine = queries.active_parts_on_nodes(session=session, node_ids=[node_id])
    reported = set(active_part_ids)
    attempts = queries.get_attempts(session=session, attempt_ids=[p.attempt_id for p in mine])
    start = [
        _assignment(session, core.settings, p, attempts[p.attempt_id])
        for p in mine
        if p.status is PartStatus.ASSIGNED and p.id not in reported
    ]
    waiting = set(waiting_for_port)
    rendezvous = [
        Rendezvous(part_id=p.id, master_port=port)
        for p in mine
        if p.id in waiting and (port := attempts[p.attempt_id].master_port) is not None
    ]
    return PollResponse(
        start=start,
        stop=_to_stop(session, node_id, mine, reported),
        # What the node knows already is no news: a poll answered with it
        # would not wait.
        checkpoint_and_stop=[
            r
            for r in stops.requests_for(session, mine, reported, utcnow())
            if r.part_id not in asked_to_stop
        ],
        rendezvous=rendezvous,
    )


def heartbeat(core: Core, node_id: int, active_part_ids: list[int]) -> HeartbeatResponse:
    """The node is alive; the parts it runs that it must stop. Sent by the
    daemon's own thread whatever else it is doing (a launch, a transfer
    over a slow link), so it is light: a read, no placement, no
    assignments. A node back from a partition learns here, within a
    heartbeat, which of its parts were given away meanwhile."""
    core.sightings.saw(node_id)
    with core.db.read() as session:
        _known_node(session, node_id)
        mine = queries.active_parts_on_nodes(session=session, node_ids=[node_id])
        reported = set(active_part_ids)
        return HeartbeatResponse(
            stop=_to_stop(session, node_id, mine, reported),
            checkpoint_and_stop=stops.requests_for(session, mine, reported, utcnow()),
        )


def _known_node(session: Session, node_id: int) -> Node:
    """The node a poll or heartbeat came from, if it may still ask."""
    node = queries.get_node(session=session, node_id=node_id)
    if node is None:
        raise NotFound(f"node {node_id} not found; register again")
    if node.state is NodeState.REVOKED:
        raise Forbidden(f"node {node_id} was revoked by an admin")
    return node


def _to_stop(session: Session, node_id: int, mine: list[Part], reported: set[int]) -> list[int]:
    """What the node runs but should not: parts asked to stop, and parts the
    server has already settled (or never gave this node)."""
    stop = {p.id for p in mine if p.status is PartStatus.STOPPING}
    known = {p.id: p for p in queries.parts_by_ids(session=session, part_ids=reported)}
    for part_id in reported:
        part = known.get(part_id)
        if (
            part is None
            or part.node_id != node_id
            or part.status not in (PartStatus.ASSIGNED, PartStatus.RUNNING)
        ):
            stop.add(part_id)
    return sorted(x for x in stop if x is not None)


def _assignment(
    session: Session, settings: ServerSettings, part: Part, attempt: Attempt
) -> Assignment:
    artifact_store = settings.artifact_store
    job = queries.get_job(session=session, job_id=part.job_id)
    assert job is not None and part.id is not None
    resume_object = None
    if (
        attempt.resumed_from_epoch is not None
        and job.checkpoint_file is not None
        and store.is_object(job.checkpoint_file)
    ):
        resume_object = StoredObject(
            url=job.checkpoint_file, size=job.checkpoint_bytes or 0, sha256=job.checkpoint_sha256
        )
    spec = job.spec
    if attempt.num_machines is not None and attempt.num_machines != spec.topology.num_machines:
        # An elastic job's attempt: its ranks see the world they run in.
        spec = spec.model_copy(update={"topology": spec.topology.sized(attempt.num_machines)})
    return Assignment(
        part_id=part.id,
        job_id=part.job_id,
        attempt_id=part.attempt_id,
        machine_id=part.machine_id,
        spec=spec,
        master_addr=attempt.master_addr,
        master_port=attempt.master_port,
        resume_epoch=attempt.resumed_from_epoch,
        resume_step=attempt.resumed_from_step,
        restart_count=attempt.number - 1,
        checkpoint_store=(
            None
            if artifact_store is None or part.machine_id != 0
            else store.job_folder(artifact_store, part.job_id)
        ),
        resume_object=resume_object,
        tracking=(
            None
            if settings.mlflow_tracking_uri is None
            else TrackingRun(tracking_uri=settings.mlflow_tracking_uri, run_id=job.mlflow_run_id)
        ),
    )
