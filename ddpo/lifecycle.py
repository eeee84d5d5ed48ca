"""The job and part state machines: pure functions, no I/O.

Every status change in the server goes through :func:`move_job` or
:func:`move_part`, so an illegal move (anything out of a terminal state, a
part jumping from ``assigned`` to ``succeeded``) is refused in one place.
:func:`settle_job` decides what a job becomes once its parts have changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class Named(str, Enum):
    """An enum whose members print as their values, in f-strings too (as
    Python 3.11's StrEnum does; this runs on 3.10)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class JobStatus(Named):
    """Where a job stands.

    ``queued -> running -> succeeded | failed``; ``running -> cancelling ->
    cancelled`` while the ranks are being stopped; ``queued -> cancelled``.
    A retryable failure with restarts left goes ``running -> queued`` (a new
    attempt starts later); a job waiting to retry that runs out of time goes
    ``queued -> failed``. Terminal states are terminal.
    """

    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def is_terminal(self) -> bool:
        return self in _TERMINAL_JOB


class PartStatus(Named):
    """Where one machine id of one attempt stands, on the node it was given to.

    ``assigned -> running -> succeeded | failed``; any live state can go to
    ``stopping`` (the server asked the node to stop it), then ``cancelled``
    once the node confirms; ``lost`` when the node stops heartbeating.
    ``running -> stopped``: asked to stop cooperatively (its attempt's
    ``stop_reason``), its ranks stopped at a step and checkpointed.
    """

    ASSIGNED = "assigned"
    RUNNING = "running"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"
    STOPPED = "stopped"

    def is_terminal(self) -> bool:
        return self in _TERMINAL_PART

    def is_active(self) -> bool:
        """Processes may exist for this part: it holds a slot on its node."""
        return not self.is_terminal()


class StopReason(Named):
    """Why the server asked a running attempt to stop at a step and
    checkpoint (the cooperative stop). None of them is the job's fault: the
    job goes back to the queue at its place, and no restart is used (but a
    pruned trial, which ends)."""

    PREEMPTED = "preempted"  # a queued job of a higher priority needs its slots
    DRAINED = "drained"  # an admin is taking one of its nodes out of service
    RESIZED = "resized"  # an elastic job changes its number of machines
    NODE_LEAVING = "node_leaving"  # one of its nodes' workers is shutting down
    # A sweep's early stopper judged the trial poor: it ends (cancelled, its
    # trial pruned) with the checkpoint of the step it stopped at.
    PRUNED = "pruned"

    @property
    def requeues(self) -> bool:
        """Whether the job goes back to the queue once stopped (all but a
        pruned trial, which ends there)."""
        return self is not StopReason.PRUNED


def describe_stop(reason: StopReason, detail: str | None) -> str:
    """A stop request in words: "preempted by job 12", "drained (node n2)"."""
    words = str(reason).replace("_", " ")
    if not detail:
        return words
    return f"{words} {detail}" if reason is StopReason.PREEMPTED else f"{words} ({detail})"


class NodeState(Named):
    LIVE = "live"
    LOST = "lost"
    REVOKED = "revoked"  # by an admin: its credential is refused, its name retired


_TERMINAL_JOB = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
_TERMINAL_PART = frozenset(
    {
        PartStatus.SUCCEEDED,
        PartStatus.FAILED,
        PartStatus.CANCELLED,
        PartStatus.LOST,
        PartStatus.STOPPED,
    }
)

JOB_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.CANCELLED, JobStatus.FAILED}),
    JobStatus.RUNNING: frozenset(
        {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLING, JobStatus.QUEUED}
    ),
    JobStatus.CANCELLING: frozenset({JobStatus.CANCELLED}),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}

PART_TRANSITIONS: dict[PartStatus, frozenset[PartStatus]] = {
    PartStatus.ASSIGNED: frozenset(
        {
            PartStatus.RUNNING,
            PartStatus.STOPPING,
            PartStatus.FAILED,
            PartStatus.CANCELLED,
            PartStatus.LOST,
        }
    ),
    PartStatus.RUNNING: frozenset(
        {
            PartStatus.SUCCEEDED,
            PartStatus.FAILED,
            PartStatus.STOPPING,
            PartStatus.LOST,
            PartStatus.STOPPED,
        }
    ),
    # A part asked to stop may still finish on its own before the signal lands
    # (or stop at a step: a cooperative stop, then a cancel before it landed).
    PartStatus.STOPPING: frozenset(
        {
            PartStatus.CANCELLED,
            PartStatus.SUCCEEDED,
            PartStatus.FAILED,
            PartStatus.LOST,
            PartStatus.STOPPED,
        }
    ),
    PartStatus.SUCCEEDED: frozenset(),
    PartStatus.FAILED: frozenset(),
    PartStatus.CANCELLED: frozenset(),
    PartStatus.LOST: frozenset(),
    PartStatus.STOPPED: frozenset(),
}


class IllegalTransition(ValueError):
    """A status change the state machine does not allow."""


def move_job(current: JobStatus, new: JobStatus) -> JobStatus:
    if new not in JOB_TRANSITIONS[current]:
        raise IllegalTransition(f"job cannot go from {current.value} to {new.value}")
    return new


def move_part(current: PartStatus, new: PartStatus) -> PartStatus:
    if new not in PART_TRANSITIONS[current]:
        raise IllegalTransition(f"part cannot go from {current.value} to {new.value}")
    return new


def can_cancel(status: JobStatus) -> bool:
    return status in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.CANCELLING)


def settle_job(
    current: JobStatus, parts: Iterable[PartStatus], stopping: bool = False
) -> JobStatus:
    """What a job becomes given the statuses of its current attempt's parts.

    A running job fails as soon as one part fails, is lost, or was stopped
    without being asked to (the others are then stopped by the caller); it
    succeeds when every part has. A cancelling job is cancelled once no part
    can still have processes.

    ``stopping``: the server asked the attempt to stop at a step (a
    cooperative stop). Its parts end one by one, each when its ranks have
    stopped, so nothing is decided until all have ended: then the job
    succeeded if every part had finished before the request landed, else it
    goes back to the queue (``queued``; the caller fails it instead when a
    part's training code raised, which no stop causes).
    """
    statuses = list(parts)
    if current is JobStatus.RUNNING and statuses and stopping:
        if not all(s.is_terminal() for s in statuses):
            return current
        if all(s is PartStatus.SUCCEEDED for s in statuses):
            return JobStatus.SUCCEEDED
        return JobStatus.QUEUED
    if current is JobStatus.RUNNING and statuses:
        if any(
            s in (PartStatus.FAILED, PartStatus.LOST, PartStatus.CANCELLED, PartStatus.STOPPED)
            for s in statuses
        ):
            return JobStatus.FAILED
        if all(s is PartStatus.SUCCEEDED for s in statuses):
            return JobStatus.SUCCEEDED
    if current is JobStatus.CANCELLING and all(s.is_terminal() for s in statuses):
        return JobStatus.CANCELLED
    return current


def backoff_seconds(restarts_done: int, base_s: float, cap_s: float) -> float:
    """Wait before restart ``restarts_done + 1``: doubling from ``base_s``, at
    most ``cap_s``."""
    return min(cap_s, base_s * 2.0**restarts_done)


def study_status(jobs: Iterable[JobStatus]) -> JobStatus:
    """A study's status from its jobs': running until every job has ended,
    then succeeded only if all did, cancelled if any was, else failed."""
    statuses = list(jobs)
    if all(s is JobStatus.QUEUED for s in statuses):
        return JobStatus.QUEUED
    if not all(s.is_terminal() for s in statuses):
        return JobStatus.RUNNING
    if all(s is JobStatus.SUCCEEDED for s in statuses):
        return JobStatus.SUCCEEDED
    if any(s is JobStatus.CANCELLED for s in statuses):
        return JobStatus.CANCELLED
    return JobStatus.FAILED


class PendingCode(Named):
    """Why a queued job is not running, as a program reads it."""

    # Fewer live nodes have what it needs than it has machines.
    NO_SUITABLE_NODES = "no_suitable_nodes"
    WAITING_FOR_SLOTS = "waiting_for_slots"  # enough have, too few of them have a free slot
    QUEUED_BEHIND = "queued_behind"  # a job ahead of it waits for slots (no backfill)
    STUDY_ORDER = "study_order"  # the study's job before it has not ended
    RETRY_BACKOFF = "retry_backoff"  # a restart waits out its backoff
    # An elastic job waits for its last attempt's machines to stop, to start
    # again on all of those left (not on the first one free).
    RESIZING = "resizing"
    STARTING = "starting"  # it fits now: placed at the server's next turn
    # Jobs of a lower priority are stopping (at a step, checkpointing) to make room.
    PREEMPTING = "preempting"
