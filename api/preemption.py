"""Which running jobs a waiting job may stop to start: pure decisions, no I/O.

Beside :mod:`api.scheduling`'s plan, and on its terms (one free slot on
each of M distinct suitable nodes). A job stopped for another is stopped
cooperatively, at a step, and goes back to the queue at its own place
(issue 28); this module only chooses. The rules:

- only jobs of strictly lower priority, never an equal one (two jobs of one
  priority would take turns stopping each other);
- never a job whose spec says ``preemptible: false``, nor one that has run
  for less than the minimum run time (a job stopped as soon as it started
  has only paid to start: that is thrashing);
- the fewest victims that make room; among as few, the lowest priorities,
  then the most recently started (the least work to save and redo).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from api.scheduling import NodeCapacity, Placement, place_gang
from ddpo.schemas import JobSpec

# Sets of victims tried for the fewest before settling for a good few:
# enough for every choice of up to 3 among 40 running jobs.
MAX_TRIES = 10_000


@dataclass(frozen=True)
class RunningJob:
    job_id: int
    priority: int
    started_at: datetime
    preemptible: bool
    # One slot on each: the nodes its parts run on.
    node_ids: tuple[int, ...]


@dataclass(frozen=True)
class Preemption:
    """Stop ``victims`` (in the order given: the first is the least
    valuable) and the waiting job fits on ``placement``."""

    victims: tuple[int, ...]
    placement: Placement


def victims_for(
    spec: JobSpec,
    priority: int,
    nodes: Sequence[NodeCapacity],
    running: Sequence[RunningJob],
    now: datetime,
    min_run_s: float,
) -> Preemption | None:
    """The running jobs to stop so that a job of ``spec`` at ``priority``
    starts on ``nodes`` (their free slots now), or None when no allowed
    choice makes room (or it fits already: nothing to stop)."""
    if isinstance(place_gang(spec, nodes), Placement):
        return None
    candidates = sorted(
        (
            job
            for job in running
            if job.priority < priority
            and job.preemptible
            and (now - job.started_at).total_seconds() >= min_run_s
        ),
        # Least valuable first: lowest priority, then the newest.
        key=lambda job: (job.priority, -job.started_at.timestamp(), -job.job_id),
    )
    if not isinstance(place_gang(spec, freed(nodes, candidates)), Placement):
        return None  # not even all of them together make room
    tries = 0
    for size in range(1, len(candidates) + 1):
        # Combinations come in order of their first members' places in the
        # list: the first that makes room is the least valuable of its size.
        for chosen in itertools.combinations(candidates, size):
            tries += 1
            if tries > MAX_TRIES:
                return _few(spec, nodes, candidates)
            placement = place_gang(spec, freed(nodes, chosen))
            if isinstance(placement, Placement):
                return Preemption(tuple(job.job_id for job in chosen), placement)
    return None  # unreachable: all of them made room


def _few(
    spec: JobSpec, nodes: Sequence[NodeCapacity], candidates: Sequence[RunningJob]
) -> Preemption | None:
    """Past :data:`MAX_TRIES`: the least valuable first until there is room,
    then each taken back, the most valuable first, while there still is."""
    chosen: list[RunningJob] = []
    for job in candidates:
        chosen.append(job)
        if isinstance(place_gang(spec, freed(nodes, chosen)), Placement):
            break
    for job in reversed(list(chosen)):
        without = [other for other in chosen if other is not job]
        if isinstance(place_gang(spec, freed(nodes, without)), Placement):
            chosen = without
    placement = place_gang(spec, freed(nodes, chosen))
    if not isinstance(placement, Placement):
        return None
    return Preemption(tuple(job.job_id for job in chosen), placement)


def freed(
    nodes: Sequence[NodeCapacity], victims: Sequence[RunningJob | tuple[int, ...]]
) -> list[NodeCapacity]:
    """The nodes as they would be once ``victims`` (jobs, or the nodes each
    holds a slot on) stopped."""
    slots: dict[int, int] = {}
    for job in victims:
        for node_id in job.node_ids if isinstance(job, RunningJob) else job:
            slots[node_id] = slots.get(node_id, 0) + 1
    return [
        replace(node, free_slots=node.free_slots + slots[node.node_id])
        if node.node_id in slots
        else node
        for node in nodes
    ]
