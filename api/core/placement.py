"""Start the queued jobs that can start now: each on all its machines at
once, in the caller's transaction (the plan itself is api/scheduling.py's,
pure)."""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from api import elastic
from api.core.context import Core, Grouped, PlanNeed, Together
from api.core.people import Actor, record
from api.core.settlement import set_job_status
from api.core.stops import ask_to_stop
from api.preemption import RunningJob, freed, victims_for
from api.scheduling import (
    NodeCapacity,
    Pending,
    Placement,
    Suits,
    could_start,
    free_suitable,
    place_gang,
    plan,
)
from api.settings import ServerSettings
from db import queries
from db.engine import memoized, writes_made
from db.models import Attempt, Job, Node, utcnow
from db.queries import QueuedJob, RunningAttempt
from ddpo.lifecycle import JobStatus, PendingCode, StopReason
from ddpo.schemas.people import AuditAction

log = logging.getLogger(__name__)

T = TypeVar("T")
A = TypeVar("A")


@dataclass(frozen=True)
class Outcome:
    placed: bool
    # The earliest time a queued job's retry backoff ends, if one is still
    # waiting for it: a plan made now says nothing about that job then.
    next_due: datetime | None


def schedule(session: Session, settings: ServerSettings) -> bool:
    """Start every queued job that can start now, each on all its machines
    in this one transaction. True if any started."""
    return plan_and_start(session, settings).placed


def plan_and_start(session: Session, settings: ServerSettings) -> Outcome:
    now = utcnow()
    survey = survey_queue(session, queries.queued_jobs(session=session), now)
    next_due = survey.next_due
    head = survey.head
    if settings.preemption and head is not None and survey.stopping is not None:
        decision = survey.decisions[head.id]
        if isinstance(decision, Pending) and decision.code is PendingCode.WAITING_FOR_SLOTS:
            assert survey.nodes is not None
            preempting = preempt_for(
                session, settings, head, decision, survey.nodes, survey.stopping, now
            )
            if preempting.pending is not None:
                survey.decisions[head.id] = preempting.pending
            next_due = _earliest(next_due, preempting.next_due)
    # The queue was read as a few columns: the jobs that start, and those
    # whose reason changed (a backoff's says which restart), are read whole.
    touched = {
        queued.id: decision
        for queued in survey.jobs
        if isinstance(decision := survey.decisions[queued.id], Placement)
        or (
            decision.code is not PendingCode.RETRY_BACKOFF
            and queued.pending_reason != decision.reason
        )
    }
    starting: list[tuple[Job, list[Machine]]] = []
    for job in queries.get_jobs(session=session, job_ids=list(touched)):
        assert job.id is not None
        decision = touched[job.id]
        if isinstance(decision, Placement):
            starting.append((job, [survey.machines[i] for i in decision.node_ids]))
        else:
            job.pending_reason = decision.reason
    start(session, starting, now)
    growing = grow_elastic(session, settings, survey, now)
    return Outcome(bool(starting), _earliest(next_due, growing))


def grow_elastic(
    session: Session, settings: ServerSettings, survey: QueueSurvey, now: datetime
) -> datetime | None:
    """Ask running elastic jobs below their max to stop at a step and start
    again on more machines, when free nodes are spare: left free by this
    plan and needed by no queued job of their priority or a higher one.
    Returns when a job held back only by the resize interval may grow."""
    # Asked first, of the database: most clusters run no elastic job, and
    # the nodes' free slots cost a pass over every node.
    growable = [
        r
        for r in queries.running_attempts(session=session, elastic=True)
        if r.attempt.stop_reason is None
    ]
    if not growable:
        return None
    nodes = _less_taken(
        survey.nodes if survey.nodes is not None else free_capacity(session),
        Counter(
            node_id
            for decision in survey.decisions.values()
            if isinstance(decision, Placement)
            for node_id in decision.node_ids
        ),
    )
    if not any(n.free_slots > 0 for n in nodes):
        return None
    queued = {q.id: q for q in survey.jobs}
    waiting = [
        elastic.Waiting(queued[job_id].priority, queued[job_id].spec.topology.num_machines)
        for job_id, decision in survey.decisions.items()
        if isinstance(decision, Pending) and decision.code is not PendingCode.NO_SUITABLE_NODES
    ]
    due: datetime | None = None
    # The highest priority first, then the oldest attempt.
    for r in sorted(growable, key=lambda r: (-r.job.priority, r.attempt.created_at)):
        size = elastic.size_of(r.job.spec.topology)
        assert size is not None
        running = r.attempt.num_machines or len(r.node_ids)
        free = free_suitable(r.job.spec, nodes, excluding=r.node_ids)
        spare = elastic.spare(len(free), waiting, r.job.priority)
        target = elastic.grow_to(
            size, running, spare, r.attempt.created_at, now, settings.resize_interval_s
        )
        if target is None:
            if spare > 0 and running < size.max:
                ready = r.attempt.created_at + timedelta(seconds=settings.resize_interval_s)
                due = _earliest(due, ready)
            continue
        detail = f"{running} -> {target}"
        if ask_to_stop(session, r.job, StopReason.RESIZED, detail, now, settings):
            log.info("job %d grows (%s machines): it stops at a step first", r.job.id, detail)
            nodes = _less_taken(nodes, Counter(n.node_id for n in free[: target - running]))
    return due


def _less_taken(nodes: list[NodeCapacity], taken: Counter[int]) -> list[NodeCapacity]:
    """``nodes`` less the slots ``taken`` (node id -> slots): only those
    copied, of thousands."""
    if not taken:
        return nodes
    return [
        replace(n, free_slots=n.free_slots - taken[n.node_id]) if n.node_id in taken else n
        for n in nodes
    ]


def _earliest(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else min(a, b)


@dataclass(frozen=True)
class Preempting:
    """What preemption makes of the head of the queue: its reason while the
    jobs it preempts stop (None: it preempts nothing, its reason stands),
    and when a job too young to preempt now comes of age."""

    pending: Pending | None
    next_due: datetime | None


def preempt_for(
    session: Session,
    settings: ServerSettings,
    head: QueuedJob,
    waiting: Pending,
    nodes: list[NodeCapacity],
    stopping: list[RunningAttempt],
    now: datetime,
) -> Preempting:
    """Ask the running jobs that ``head`` (the first job waiting for slots)
    may preempt to stop at a step, if stopping them makes room for it
    (api/preemption.py chooses). Jobs asked to stop already (``stopping``)
    are counted as gone: their slots are on their way."""
    after_stops = freed(nodes, [r.node_ids for r in stopping])
    running = queries.running_attempts(session=session, below_priority=head.priority)
    candidates = [
        RunningJob(
            job_id=r.job.id,
            priority=r.job.priority,
            started_at=r.attempt.created_at,
            preemptible=r.job.spec.preemptible,
            node_ids=r.node_ids,
        )
        for r in running
        if r.attempt.stop_reason is None and r.job.id is not None
    ]
    choice = victims_for(
        head.spec, head.priority, after_stops, candidates, now, settings.preemption_min_run_s
    )
    if choice is None:
        return Preempting(None, _coming_of_age(head, candidates, settings, now))
    jobs = {r.job.id: r.job for r in running}
    for victim in choice.victims:
        if ask_to_stop(session, jobs[victim], StopReason.PREEMPTED, _by(head.id), now, settings):
            record(
                session,
                SCHEDULER,
                AuditAction.JOB_PREEMPT,
                f"job {victim}",
                by_job=head.id,
                by_priority=head.priority,
                priority=jobs[victim].priority,
            )
            log.warning(
                "job %d (priority %d) preempts job %d (priority %d)",
                head.id,
                head.priority,
                victim,
                jobs[victim].priority,
            )
    mine = [r.job.id for r in stopping if r.attempt.stop_detail == _by(head.id)]
    return Preempting(_preempting(head, waiting, [*mine, *choice.victims]), None)


# Who the audit log says preempted a job: the server's own scheduler.
SCHEDULER = Actor(name="scheduler", role=None)


def _by(job_id: int) -> str:
    return f"by job {job_id}"


def _preempting(head: QueuedJob, waiting: Pending, victims: Iterable[int | None]) -> Pending:
    """``head``'s reason (it was ``waiting`` for slots): the jobs it preempts."""
    named = sorted({v for v in victims if v is not None})
    return replace(
        waiting,
        code=PendingCode.PREEMPTING,
        reason=f"preempting job{'s' if len(named) > 1 else ''} {', '.join(map(str, named))} "
        f"(priority {head.priority} goes first): they stop at a step and checkpoint, "
        "then this job starts",
        preempting=tuple(named),
    )


def _being_preempted(
    head: QueuedJob, waiting: Pending, nodes: list[NodeCapacity], stopping: list[RunningAttempt]
) -> Pending | None:
    """``head``'s reason while the jobs it preempted stop: once they have,
    it fits (else it is still waiting for slots, and may preempt more)."""
    mine = [r.job.id for r in stopping if r.attempt.stop_detail == _by(head.id)]
    if not mine:
        return None
    if not isinstance(
        place_gang(head.spec, freed(nodes, [r.node_ids for r in stopping])), Placement
    ):
        return None
    return _preempting(head, waiting, mine)


def _coming_of_age(
    head: QueuedJob, candidates: list[RunningJob], settings: ServerSettings, now: datetime
) -> datetime | None:
    """When the first job ``head`` could preempt but for its age is old
    enough: a plan then may preempt it (nothing else changes to say so)."""
    young = [
        job.started_at + timedelta(seconds=settings.preemption_min_run_s)
        for job in candidates
        if job.priority < head.priority and job.preemptible
    ]
    later = [t for t in young if t > now]
    return min(later) if later else None


def needs_a_plan(session: Session, job: Job, settings: ServerSettings) -> bool:
    """Whether the queue needs planning now that ``job`` has joined it
    (then in the same transaction, :func:`write_grouped`); if not, the
    job's reason is set here. Nothing else has changed since the queue was
    last planned (whatever frees a slot or brings a node plans it again),
    so a job that could not start even at the head of the line takes
    nothing from anyone, and the others' plan stands: only a job that could
    start now needs the whole queue planned, to see whether it or one
    before it starts. A submit into a busy cluster costs the same with a
    thousand jobs queued as with none."""
    nodes = free_capacity(session)
    if could_start(job.spec, nodes) or (
        settings.preemption and _may_preempt(session, job.priority)
    ):
        return True
    decision = place_gang(job.spec, nodes)
    assert isinstance(decision, Pending)
    job.pending_reason = decision.reason
    return False


def write_grouped(
    core: Core,
    work: Callable[[Session], tuple[T, PlanNeed]],
    together: Together | None = None,
    asked: Any = None,
) -> T:
    """``work``'s value, once it has committed: it is made in one
    transaction with the other submits and reports that were waiting for
    the writer meanwhile (Core.writes), and if it or any of them says the
    queue needs planning, the queue is planned in that transaction too. A
    submit is answered once planned, so its answer says whether the job
    started. With ``together``, it may be made by that with the group's
    other writes of its kind (Grouped)."""
    grouped = Grouped(work, together, asked)
    core.writes.run(grouped, lambda take: _write_group(core, take))
    if grouped.error is not None:
        raise grouped.error
    return cast(T, grouped.value)


def write_together(
    core: Core,
    together: Callable[[Session, list[A]], list[tuple[T, PlanNeed] | Exception]],
    asked: A,
) -> T:
    """write_grouped for a write of a kind made many at once: ``asked`` is
    made by ``together`` with the group's others of its kind, or, written
    alone (a savepoint each, after a write raised having written), as a
    batch of one whose refusal is raised."""

    def alone(session: Session) -> tuple[T, PlanNeed]:
        (outcome,) = together(session, [asked])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return write_grouped(core, alone, together, asked)


def _write_group(core: Core, take: Callable[[], list[Grouped[Any]]]) -> None:
    """One transaction for the whole group, taken (``take``) once the
    transaction holds the write lock (GroupedWrites). A write that raises
    (a refusal: a full queue, another node's part) has its error and leaves nothing,
    and the others stand. Most refuse before they write anything, so the
    writes run one after another without a savepoint each (two round trips
    a write, a fifth of a placed job's statements); one that raises having
    written has the group written again, each write in a savepoint of its
    own (a node sending such reports costs the writer one group twice at
    most, not every group). The plan after them (and the checks of
    whether it is needed) has no savepoint either (two more round trips a
    group): a plan or a check that fails has the group written again
    without either, and the clock's next tick plans the queue.
    An error of the transaction itself (its commit) is raised: every one
    in the group has it (GroupedWrites.run)."""
    savepoints, planning = False, True
    while True:
        try:
            _write(core, take, savepoints=savepoints, planning=planning)
            return
        except _WroteThenRaised:
            savepoints = True
        except _PlanFailed as failed:
            log.error(
                "planning the queue failed; the clock's next tick plans it again",
                exc_info=failed.__cause__,
            )
            planning = False
        for grouped in take():
            grouped.value, grouped.error = None, None


class _WroteThenRaised(Exception):
    """A write of a group raised once it had written: what it wrote cannot
    be told from the others' without a savepoint."""


class _PlanFailed(Exception):
    """The plan a group asked for, or a check of whether it needs one,
    raised: what it wrote cannot be told from the group's writes without a
    savepoint (and a failed statement ends a PostgreSQL transaction)."""


def _write(
    core: Core, take: Callable[[], list[Grouped[Any]]], *, savepoints: bool, planning: bool
) -> None:
    with core.db.write() as session:
        group = take()  # now that the lock is held: see GroupedWrites
        alone = group if savepoints else _write_kinds_together(session, group)
        for grouped in alone:
            try:
                grouped.value, grouped.need = _run(session, grouped, savepoints=savepoints)
            except _WroteThenRaised:
                raise
            except Exception as exc:
                grouped.error = exc
        if planning:
            try:
                if _wants_a_plan([grouped.need for grouped in group if grouped.error is None]):
                    schedule(session, core.settings)
            except Exception as exc:
                raise _PlanFailed() from exc


def _write_kinds_together(session: Session, group: list[Grouped[Any]]) -> list[Grouped[Any]]:
    """Makes the group's writes that name a ``together``, one call for each
    kind, before the others (writes that arrived together may be made in
    any order), and returns the others. A call that raises has the group
    written again with a savepoint each (a failed statement ends a
    PostgreSQL transaction)."""
    kinds: dict[Together, list[Grouped[Any]]] = {}
    alone: list[Grouped[Any]] = []
    for grouped in group:
        if grouped.together is None:
            alone.append(grouped)
        else:
            kinds.setdefault(grouped.together, []).append(grouped)
    for together, members in kinds.items():
        try:
            outcomes = together(session, [member.asked for member in members])
            session.flush()  # what they changed, failing here rather than in another's write
        except Exception as exc:
            raise _WroteThenRaised() from exc
        for member, outcome in zip(members, outcomes, strict=True):
            if isinstance(outcome, Exception):
                member.error = outcome
            else:
                member.value, member.need = outcome
    return alone


def _run(session: Session, grouped: Grouped[T], *, savepoints: bool) -> tuple[T, PlanNeed]:
    """One write of a group: in a savepoint of its own, or without one,
    raising _WroteThenRaised if it raises having written."""
    if savepoints:
        with session.begin_nested():
            return grouped.work(session)
    session.flush()  # the writes before it, so that its own show
    before = writes_made(session)
    try:
        return grouped.work(session)
    except Exception as exc:
        # A failed statement ends a PostgreSQL transaction, written or not.
        if _wrote_since(session, before) or isinstance(exc, SQLAlchemyError):
            raise _WroteThenRaised() from exc
        raise


def _wrote_since(session: Session, before: int) -> bool:
    """Whether ``session`` has written, or has changes pending, since it
    had made ``before`` writes (db/engine.py writes_made) with none pending."""
    return (
        writes_made(session) != before
        or bool(session.new)
        or bool(session.deleted)
        or any(session.is_modified(row) for row in session.dirty)
    )


def _wants_a_plan(needs: list[PlanNeed]) -> bool:
    """Whether any write of a group says the queue needs planning, asking
    the checks only while none has said yes (a check that raises is raised:
    _write)."""
    if any(need is True for need in needs):
        return True
    return any(need() for need in needs if callable(need))


def _may_preempt(session: Session, priority: int) -> bool:
    """Whether any running job has a lower priority than a job just
    submitted: then it may preempt (the whole queue is planned to see)."""
    return bool(queries.running_attempts(session=session, below_priority=priority))


@dataclass(frozen=True)
class QueueSurvey:
    """Every queued job in the order it is tried, and what placement makes
    of each now."""

    jobs: list[QueuedJob]
    decisions: dict[int, Placement | Pending]
    next_due: datetime | None
    # The live nodes and the slots in use on them, by node id; None when no
    # job was due (nothing to place: the nodes were not read).
    live: LiveNodes | None
    used: dict[int, int] = field(default_factory=dict)
    # The first job waiting for slots (it may preempt), and the running
    # jobs asked to stop at a step (read only when there is such a job).
    head: QueuedJob | None = None
    stopping: list[RunningAttempt] | None = None

    @functools.cached_property
    def nodes(self) -> list[NodeCapacity] | None:
        """The live nodes with their free slots now (a pass over every node,
        made only when asked: a plan does without)."""
        return None if self.live is None else _less_used(self.live, self.used)

    @property
    def machines(self) -> dict[int, Machine]:
        """The live nodes, by id (empty when no job was due)."""
        return {} if self.live is None else self.live.machines


def survey_queue(session: Session, jobs: list[QueuedJob], now: datetime) -> QueueSurvey:
    """What placement decides for ``jobs`` (queued, in the order tried) now.
    A pure plan (api/scheduling.py) over the nodes' free slots, after the
    jobs that wait for a retry's backoff or for their study's job before."""
    decisions: dict[int, Placement | Pending] = {}
    due: dict[int, QueuedJob] = {}
    next_due: datetime | None = None
    for job in jobs:
        if job.not_before is None or job.not_before <= now:
            due[job.id] = job
            continue
        decisions[job.id] = Pending(
            PendingCode.RETRY_BACKOFF,
            f"{job.pending_reason or 'a restart'}, once its backoff ends at "
            f"{job.not_before.isoformat(timespec='seconds')}",
        )
        if next_due is None or job.not_before < next_due:
            next_due = job.not_before
    if not due:
        return QueueSurvey(jobs, decisions, next_due, None)
    live = live_nodes(session)
    used = queries.active_part_counts(session=session)
    elastic_jobs = [job_id for job_id, j in due.items() if j.spec.topology.elastic]
    for job_id in queries.jobs_with_active_parts(session=session, job_ids=elastic_jobs):
        del due[job_id]
        decisions[job_id] = Pending(
            PendingCode.RESIZING,
            "waiting for the machines of its last attempt to stop; it starts again on as "
            "many as are free then",
        )
    # A study's jobs run one after another: each waits for the one before.
    for job_id, before in queries.study_predecessors(session=session, jobs=due.values()).items():
        if not before.status.is_terminal():
            del due[job_id]
            decisions[job_id] = Pending(
                PendingCode.STUDY_ORDER,
                f"study {before.study_id}: waiting for job {before.id} to end",
                behind_job=before.id,
            )
    decisions.update(
        plan([(job_id, j.spec) for job_id, j in due.items()], live.nodes, live.suits, used)
    )
    head = next(
        (
            job
            for job in jobs
            if isinstance(d := decisions[job.id], Pending)
            and d.code is PendingCode.WAITING_FOR_SLOTS
        ),
        None,
    )
    if head is None:
        return QueueSurvey(jobs, decisions, next_due, live, used)
    stopping = queries.running_attempts(session=session, stopping=True)
    survey = QueueSurvey(jobs, decisions, next_due, live, used, head, stopping)
    waiting = decisions[head.id]
    assert isinstance(waiting, Pending) and survey.nodes is not None
    if (pending := _being_preempted(head, waiting, survey.nodes, stopping)) is not None:
        decisions[head.id] = pending
    return survey


@dataclass(frozen=True)
class Machine:
    """A node a job starts on, as placement knows it (LiveNodes)."""

    node_id: int
    name: str
    address: str


@dataclass(frozen=True)
class LiveNodes:
    """Every live node, all its slots free, and which of them suit each
    kind of job (filled in by the plans made on them: with thousands of
    nodes, finding them was a third of a plan's time)."""

    nodes: list[NodeCapacity]
    # Each node as a job starting on it needs it, by id: a plan starts jobs
    # without reading the rows of the nodes it chose (a round trip under
    # the write lock).
    machines: dict[int, Machine]
    suits: Suits = field(default_factory=Suits)


def live_nodes(session: Session) -> LiveNodes:
    """Read again only once the node table has changed (db/engine.py memoized)."""
    return memoized(session, "live_nodes", (Node,), lambda: _live_nodes(session))


def free_capacity(session: Session) -> list[NodeCapacity]:
    """Every live node, with the slots its active parts leave free."""
    return _less_used(live_nodes(session), queries.active_part_counts(session=session))


def _less_used(live: LiveNodes, used: dict[int, int]) -> list[NodeCapacity]:
    return [
        replace(node, free_slots=node.free_slots - used[node.node_id])
        if node.node_id in used
        else node
        for node in live.nodes
    ]


def _live_nodes(session: Session) -> LiveNodes:
    """Every live node, all its slots free."""
    rows = queries.live_node_capacities(session=session)
    return LiveNodes(
        [
            NodeCapacity(
                node_id,
                name,
                slots,
                gpus,
                frozenset(trainers),
                scripts,
                frozenset((o["name"], o.get("version", "0")) for o in offers or ()),
            )
            for node_id, name, _, slots, gpus, trainers, scripts, offers in rows
        ],
        {node_id: Machine(node_id, name, address) for node_id, name, address, *_ in rows},
    )


def start(session: Session, starting: list[tuple[Job, list[Machine]]], now: datetime) -> None:
    """A new attempt of each job, machine i on its ``nodes[i]``: all the
    attempts written in one statement, then all their parts in another,
    and each job changed after them (one statement for each row's write,
    not one a field, and not three for each job a plan starts)."""
    if not starting:
        return
    # A retry continues from the last whole checkpoint (one of an earlier
    # attempt: the first has none).
    attempts = [
        Attempt(
            job_id=_id_of(job),
            number=job.attempt_count + 1,
            master_addr=nodes[0].address,
            num_machines=len(nodes),
            resumed_from_epoch=job.checkpoint_epoch,
            resumed_from_step=job.checkpoint_step,
        )
        for job, nodes in starting
    ]
    queries.insert_attempts(session=session, attempts=attempts)
    queries.insert_parts(
        session=session,
        machines=[
            (attempt.job_id, _id_of(attempt), [node.node_id for node in nodes])
            for attempt, (_, nodes) in zip(attempts, starting, strict=True)
        ],
    )
    for attempt, (job, nodes) in zip(attempts, starting, strict=True):
        job.attempt_count += 1
        if job.deadline_at is None and job.spec.max_run_seconds is not None:
            job.deadline_at = now + timedelta(seconds=job.spec.max_run_seconds)
        job.current_attempt_id = attempt.id
        job.progress_seq = None
        job.not_before = None
        set_job_status(session, job, JobStatus.RUNNING, now)
        log.info(
            "job %d attempt %d placed on %s",
            job.id,
            attempt.number,
            ", ".join(n.name for n in nodes),
        )


def _id_of(row: Job | Attempt) -> int:
    assert row.id is not None
    return row.id
