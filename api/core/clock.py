"""The server's clock: nodes silent for too long are lost, jobs past their
deadline fail, and retries whose backoff has passed start."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlmodel import Session

from api.core import lookup, sweeps
from api.core.context import Core, PlanMemo
from api.core.placement import plan_and_start, schedule
from api.core.settlement import fail_at_deadline, lose_parts, may_explain, settle
from api.core.stops import drain_due, stop_overdue
from api.settings import ServerSettings
from db import queries
from db.engine import RowsBusy
from db.models import Job, Node, Part, utcnow
from ddpo.failures import FailureReason
from ddpo.lifecycle import NodeState, PartStatus, move_part
from ddpo.schemas import JobError

log = logging.getLogger(__name__)

# How long writing the nodes' sightings waits for a node's row that a write
# holds before leaving them for the next turn (write_sightings).
SIGHTINGS_ROW_WAIT_S = 0.1

# What placement reads: the queue, the parts holding slots, the nodes.
PLACEMENT_READS = (Job, Part, Node)


def tick(core: Core, judge_nodes: bool = True) -> bool:
    """One turn of the clock: lost nodes (unless told the server itself was
    too stalled to judge), deadlines, retries whose backoff has passed.
    True if anything changed."""
    lost = sweep_lost_nodes(core) if judge_nodes else False
    now = utcnow()
    writes = core.db.writes_to(PLACEMENT_READS)  # before reading: later writes count
    memo = core.plan_memo
    with core.db.write() as session:
        late = queries.jobs_past_deadline(session=session, now=now)
        for job in late:
            fail_at_deadline(session, job, now)
        unstarted = fail_parts_never_started(session, core.settings, now)
        overdue = stop_overdue(session, now)
        drained = drain_due(session, now, core.settings)
        changed = bool(late or unstarted or overdue or drained)
        fresh = changed or not memo.still_holds(writes, now)
        outcome = plan_and_start(session, core.settings) if fresh else None
    if outcome is not None:  # committed: the plan is in the database
        core.plan_memo = PlanMemo(writes, outcome.next_due)
    swept = sweeps.advance_running(core)
    return lost or changed or swept or (outcome is not None and outcome.placed)


def fail_parts_never_started(session: Session, settings: ServerSettings, now: datetime) -> bool:
    """A node that takes a part and never starts it (while it keeps polling
    and heartbeating, so it is not lost) would hold the job forever: past
    ``start_timeout_s`` the part fails with launch_failed, which retries."""
    timeout_s = settings.start_timeout_s
    parts = queries.parts_never_started(
        session=session, assigned_before=now - timedelta(seconds=timeout_s)
    )
    for part in parts:
        node = queries.get_node(session=session, node_id=part.node_id)
        what = (
            f"node {node.name if node else part.node_id} did not start machine "
            f"{part.machine_id} within DDPO_START_TIMEOUT_S={timeout_s:g} of being given it"
        )
        part.status = move_part(part.status, PartStatus.FAILED)
        part.finished_at = now
        part.error = what
        job = lookup.job(session, part.job_id, for_update=True)
        if job.current_attempt_id != part.attempt_id:
            continue
        log.warning("job %d: %s", job.id, what)
        if may_explain(job, FailureReason.LAUNCH_FAILED):
            job.error = JobError(
                reason=FailureReason.LAUNCH_FAILED,
                message=what,
                machine_id=part.machine_id,
                node=node.name if node else None,
            )
        settle(session, job, now, settings)
    return bool(parts)


def write_sightings(core: Core) -> None:
    """The nodes this server heard from since the last turn, written as
    their heartbeat times in one transaction (every server does this each
    sweep interval; the one that sweeps judges on what all of them wrote,
    so a node's silence is judged at most one interval late)."""
    heard = core.sightings.take_unwritten()
    if not heard:
        return
    try:
        # Beside the writer (on PostgreSQL), not under the write lock: with
        # thousands of nodes this is the longest write a server makes each
        # interval, and nothing that the lock keeps consistent reads it (the
        # sweep judges silence by what has committed, as it would were this
        # written just after it). A node's row a writer holds (its state
        # changing) is not waited for long: the writer never waits on this.
        with core.db.write(exclusive=False, row_wait_s=SIGHTINGS_ROW_WAIT_S) as session:
            queries.note_heard(session=session, node_ids=heard, at=utcnow())
    except RowsBusy:
        core.sightings.put_back(heard)
        log.info("a node's row was held by a write: its sightings are written next turn")
    except BaseException:
        core.sightings.put_back(heard)
        raise


def _silent(core: Core, stale: list[Node]) -> list[Node]:
    """Of nodes whose heartbeat time is stale, those this server has not
    heard from within the heartbeat timeout either."""
    timeout_s = core.settings.heartbeat_timeout_s
    return [
        node
        for node in stale
        if node.id is not None and not core.sightings.seen_within(node.id, timeout_s)
    ]


def sweep_lost_nodes(core: Core) -> bool:
    """Mark nodes that stopped heartbeating as lost, and their parts with them."""
    timeout_s = core.settings.heartbeat_timeout_s
    if core.sightings.listening_for() < timeout_s:
        # Just (re)started: nodes have not had a chance to reach us yet.
        return False
    now = utcnow()
    cutoff = now - timedelta(seconds=timeout_s)
    # Looked for first without the write lock: nearly every turn finds no
    # node silent, and the lock is everyone's (with thousands of nodes,
    # the search held it for a tenth of the time placements could use).
    with core.db.read() as session:
        if not _silent(core, queries.stale_live_nodes(session=session, heartbeat_before=cutoff)):
            return False
    with core.db.write() as session:
        stale = _silent(core, queries.stale_live_nodes(session=session, heartbeat_before=cutoff))
        if not stale:
            return False
        nodes = {n.id: n for n in stale if n.id is not None}
        for node in stale:
            node.state = NodeState.LOST
            log.warning(
                "node %d (%s) lost: no heartbeat since %s",
                node.id,
                node.name,
                node.last_heartbeat_at.isoformat(),
            )
        parts = queries.active_parts_on_nodes(session=session, node_ids=nodes)
        lose_parts(
            session,
            parts,
            nodes,
            FailureReason.NODE_LOST,
            "stopped heartbeating",
            now,
            core.settings,
        )
        schedule(session, core.settings)
        return True
