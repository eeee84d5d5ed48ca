"""Gang placement: pure decisions, no I/O.

The coordinator reads the queue and the nodes inside one write transaction,
asks :func:`plan` what to start, and writes the answer in that same
transaction, so a job is either placed on all of its machines or on none.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypedDict

from ddpo.lifecycle import PendingCode
from ddpo.schemas import JobSpec


@dataclass(frozen=True)
class NodeCapacity:
    node_id: int
    name: str
    free_slots: int
    gpus: int
    trainers: frozenset[str]
    # Script path -> SHA-256 of its content on this node.
    scripts: Mapping[str, str] = field(default_factory=dict)
    # (trainer, version) of each trainer it offers.
    trainer_versions: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Placement:
    """``node_ids[machine_id]`` is the node that runs that machine id."""

    node_ids: tuple[int, ...]


@dataclass(frozen=True)
class Pending:
    code: PendingCode
    reason: str
    # The numbers behind the reason: the nodes it needs (one free slot on
    # each), the live nodes that have what it needs, those of them with a
    # free slot now, and every live node.
    nodes_needed: int = 0
    nodes_suitable: int = 0
    nodes_free: int = 0
    nodes_live: int = 0
    behind_job: int | None = None
    # The running jobs it is stopping to make room (preempting).
    preempting: tuple[int, ...] = ()

    @property
    def waiting_for_slots(self) -> bool:
        """Enough suitable nodes exist but are busy: the job is next in line,
        and jobs behind it wait so it is not starved by smaller ones."""
        return self.code in (PendingCode.WAITING_FOR_SLOTS, PendingCode.QUEUED_BEHIND)


def _suits(node: NodeCapacity, spec: JobSpec) -> bool:
    if spec.script is not None:
        held = node.scripts.get(spec.script.path)
        if held is None or spec.script.sha256 not in (None, held):
            return False
    elif spec.trainer not in node.trainers or (
        spec.trainer_version is not None
        and (spec.trainer, spec.trainer_version) not in node.trainer_versions
    ):
        return False
    return not (spec.backend == "nccl" and node.gpus < spec.topology.num_processes)


def _same_script(spec: JobSpec, suitable: list[NodeCapacity]) -> list[NodeCapacity]:
    """A script not pinned to one content runs on nodes that all have the
    same: those of the content most nodes with a free slot have."""
    if spec.script is None or spec.script.sha256 is not None:
        return suitable
    path = spec.script.path
    groups: dict[str, list[NodeCapacity]] = {}
    for node in suitable:
        groups.setdefault(node.scripts[path], []).append(node)
    if len(groups) <= 1:
        return suitable
    return max(
        groups.values(), key=lambda g: (sum(n.free_slots > 0 for n in g), len(g), -g[0].node_id)
    )


def _requirement(spec: JobSpec) -> str:
    need = spec.needs
    if spec.backend == "nccl":
        need += f" and {spec.topology.num_processes} GPU(s) for nccl"
    return need


def _suitable_and_free(
    spec: JobSpec, nodes: Sequence[NodeCapacity]
) -> tuple[list[NodeCapacity], list[NodeCapacity]]:
    suitable = _same_script(spec, [n for n in nodes if _suits(n, spec)])
    return suitable, [n for n in suitable if n.free_slots > 0]


class Counts(TypedDict):
    nodes_needed: int
    nodes_suitable: int
    nodes_free: int
    nodes_live: int


def _counts(
    spec: JobSpec,
    nodes: Sequence[NodeCapacity],
    suitable: Sequence[NodeCapacity],
    free: Sequence[NodeCapacity],
) -> Counts:
    """Pending's numbers: what the job needs against what there is now."""
    return {
        "nodes_needed": spec.topology.num_machines,
        "nodes_suitable": len(suitable),
        "nodes_free": len(free),
        "nodes_live": len(nodes),
    }


def place_gang(spec: JobSpec, nodes: Sequence[NodeCapacity]) -> Placement | Pending:
    """M distinct suitable nodes with a free slot each, or why not (an
    elastic job: at least its min, as many as are free up to its max)."""
    machines = spec.topology.num_machines
    suitable, free = _suitable_and_free(spec, nodes)
    counts = _counts(spec, nodes, suitable, free)
    if len(suitable) < machines:
        return Pending(
            PendingCode.NO_SUITABLE_NODES,
            f"needs {machines} live node(s) with {_requirement(spec)}; "
            f"{len(suitable)} of {len(nodes)} live node(s) qualify",
            **counts,
        )
    if len(free) < machines:
        return Pending(
            PendingCode.WAITING_FOR_SLOTS,
            f"waiting for {machines} free node(s); {len(free)} of {len(suitable)} "
            f"suitable node(s) have a free slot",
            **counts,
        )
    # An elastic job takes every free suitable node, up to its max.
    machines = min(len(free), spec.topology.most_machines)
    # Spread load: the emptiest nodes first, then the oldest, for stable picks.
    chosen = heapq.nsmallest(machines, free, key=lambda n: (-n.free_slots, n.node_id))
    return Placement(tuple(n.node_id for n in chosen))


def could_start(spec: JobSpec, nodes: Iterable[NodeCapacity]) -> bool:
    """Whether ``place_gang`` would place ``spec`` on ``nodes`` now, asked
    of as few nodes as it takes: in a cluster with room, the first few
    (rather than a pass over thousands for each submit)."""
    if spec.script is not None and spec.script.sha256 is None:
        # Which nodes count depends on the content most of them have.
        return isinstance(place_gang(spec, list(nodes)), Placement)
    needed = spec.topology.num_machines
    for node in nodes:
        if node.free_slots > 0 and _suits(node, spec):
            needed -= 1
            if needed == 0:
                return True
    return False


def free_suitable(
    spec: JobSpec, nodes: Sequence[NodeCapacity], excluding: Collection[int] = ()
) -> list[NodeCapacity]:
    """The nodes with a free slot that could run a machine of ``spec``,
    but for ``excluding`` (those it runs on already: a machine per node)."""
    return [n for n in _suitable_and_free(spec, nodes)[1] if n.node_id not in excluding]


def plan(
    queue: Sequence[tuple[int, JobSpec]], nodes: Sequence[NodeCapacity]
) -> dict[int, Placement | Pending]:
    """Decide for each queued job (in queue order) where it starts, or why not.

    First come, first served: once a job is waiting only for busy nodes, the
    jobs behind it wait too. Jobs that no current node could ever run (say,
    nccl with no GPU node) do not hold up the queue.
    """
    current = list(nodes)
    index = {n.node_id: i for i, n in enumerate(current)}
    decisions: dict[int, Placement | Pending] = {}
    head: int | None = None
    for job_id, spec in queue:
        if head is not None:
            suitable, free = _suitable_and_free(spec, current)
            if len(suitable) >= spec.topology.num_machines:
                decisions[job_id] = Pending(
                    PendingCode.QUEUED_BEHIND,
                    f"queued behind job {head}",
                    behind_job=head,
                    **_counts(spec, current, suitable, free),
                )
                continue
        decision = place_gang(spec, current)
        if isinstance(decision, Placement):
            for node_id in decision.node_ids:
                taken = current[index[node_id]]
                current[index[node_id]] = replace(taken, free_slots=taken.free_slots - 1)
        elif decision.waiting_for_slots:
            head = job_id
        decisions[job_id] = decision
    return decisions
