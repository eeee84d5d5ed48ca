"""Elastic jobs' sizes: pure decisions, no I/O (issue 28).

A job whose ``topology.num_machines`` is a range (``{"min": 2, "max": 4}``)
starts once ``min`` machines fit and takes up to ``max``; it shrinks to the
survivors when a node is lost (if they are still ``min`` or more) and grows
onto free nodes that no queued job of its priority or a higher one needs,
at most once per resize interval. Growing is a cooperative stop (reason
``resized``) and a new attempt on more machines from that step's
checkpoint; shrinking is a new attempt on the machines left from the
latest checkpoint (a lost rank agrees on no step: ``checkpoint_every_steps``
bounds what is trained again). Neither uses a restart. The per-process
batch stays: the global batch is ``batch_size x num_processes x machines``
of each attempt, and a resized run picks its epoch up where its samples
left off (worker/checkpoints.py, resumed_batches).

Beside api/scheduling.py's plan and api/preemption.py's choice, on their
terms (one free slot on each of M distinct suitable nodes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ddpo.schemas import Topology

# The stop detail of an elastic job's attempt that ended because one of its
# machines went away (reason resized; the attempt keeps the failure).
SHRUNK = "a machine lost"


@dataclass(frozen=True)
class Size:
    """How many machines an elastic job may run on."""

    min: int
    max: int

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.max:
            raise ValueError(f"an elastic size needs 1 <= min <= max, not {self.min}..{self.max}")


def size_of(topology: Topology) -> Size | None:
    """An elastic topology's range; None for a job of one size."""
    if topology.max_machines is None:
        return None
    return Size(topology.num_machines, topology.max_machines)


def start_size(size: Size, free_suitable: int) -> int | None:
    """Machines the job starts on: every suitable node with a free slot, up
    to ``max``; None when fewer than ``min`` are free (it waits)."""
    machines = min(size.max, free_suitable)
    return machines if machines >= size.min else None


def after_loss(size: Size, running: int, lost: int) -> int | None:
    """Machines left once ``lost`` of the ``running`` ones are gone: the job
    carries on with them if they are ``min`` or more; None: too few (it
    fails, or restarts if it may, as a job of one size does)."""
    left = running - lost
    return left if left >= size.min else None


@dataclass(frozen=True)
class Waiting:
    """A queued job, as growth sees it: its priority and the free suitable
    nodes it needs."""

    priority: int
    machines: int


def spare(free_suitable: int, waiting: Sequence[Waiting], priority: int) -> int:
    """Free suitable nodes a running job of ``priority`` may grow onto:
    those the queued jobs of its priority or a higher one do not need (a
    job of a lower priority waits: it would only be preempted back)."""
    needed = sum(w.machines for w in waiting if w.priority >= priority)
    return max(0, free_suitable - needed)


def grow_to(
    size: Size,
    running: int,
    spare_nodes: int,
    last_resized_at: datetime | None,
    now: datetime,
    interval_s: float,
) -> int | None:
    """The size to grow to now, or None: already at ``max``, no spare node,
    or resized less than ``interval_s`` ago (a resize costs a stop and a
    start: growing at every free node would cost more than it buys)."""
    if running >= size.max or spare_nodes <= 0:
        return None
    if last_resized_at is not None and (now - last_resized_at).total_seconds() < interval_s:
        return None
    return min(size.max, running + spare_nodes)
