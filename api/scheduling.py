"""Gang placement: pure decisions, no I/O.

The coordinator reads the queue and the nodes inside one write transaction,
asks :func:`plan` what to start, and writes the answer in that same
transaction, so a job is either placed on all of its machines or on none.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
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
    suitable, free = _suitable_and_free(spec, nodes)
    return _gang(
        spec,
        _counts(spec, nodes, suitable, free),
        # Spread load: the emptiest nodes first, then the oldest, for stable picks.
        lambda machines: [
            n.node_id
            for n in heapq.nsmallest(machines, free, key=lambda n: (-n.free_slots, n.node_id))
        ],
    )


def _gang(spec: JobSpec, counts: Counts, choose: Callable[[int], list[int]]) -> Placement | Pending:
    """place_gang's decision from the counts, ``choose`` picking that many
    of the free suitable nodes."""
    machines = spec.topology.num_machines
    suitable, free, live = counts["nodes_suitable"], counts["nodes_free"], counts["nodes_live"]
    if suitable < machines:
        return Pending(
            PendingCode.NO_SUITABLE_NODES,
            f"needs {machines} live node(s) with {_requirement(spec)}; "
            f"{suitable} of {live} live node(s) qualify",
            **counts,
        )
    if free < machines:
        return Pending(
            PendingCode.WAITING_FOR_SLOTS,
            f"waiting for {machines} free node(s); {free} of {suitable} "
            f"suitable node(s) have a free slot",
            **counts,
        )
    # An elastic job takes every free suitable node, up to its max.
    return Placement(tuple(choose(min(free, spec.topology.most_machines))))


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


@dataclass
class Suits:
    """Which nodes (indices into a plan's list) suit each kind of job
    (_suit_key), and each node's index: true of a list for as long as its
    nodes stay the same but for their free slots, which neither depends on.

    With plans given the slots in use apart (:func:`plan`'s ``used``), the
    list's own free slots stay the same too, and so does the order
    placement takes each kind's nodes in (``orders``): a plan then makes its
    heaps of the nodes with slots in use alone, not of thousands."""

    kinds: dict[tuple[object, ...], frozenset[int]] = field(default_factory=dict)
    index: dict[int, int] | None = None
    orders: dict[tuple[object, ...], list[int]] = field(default_factory=dict)


def plan(
    queue: Sequence[tuple[int, JobSpec]],
    nodes: Sequence[NodeCapacity],
    suits: Suits | None = None,
    used: Mapping[int, int] | None = None,
) -> dict[int, Placement | Pending]:
    """Decide for each queued job (in queue order) where it starts, or why not.

    First come, first served: once a job is waiting only for busy nodes, the
    jobs behind it wait too. Jobs that no current node could ever run (say,
    nccl with no GPU node) do not hold up the queue.

    The same decisions as :func:`place_gang` asked of the nodes left after
    each placement, without its passes over every node a job: which nodes
    suit a kind of job is found once a plan (:class:`_Taking`), or once for
    many plans: ``suits``, kept by the caller with ``nodes`` while the nodes
    are the same (filled in here). ``used``: slots in use on nodes, by id,
    to take off ``nodes``' free slots (the server's nodes all free, and its
    active parts): ``nodes`` then stay the same from plan to plan, and so
    does the order a kind's nodes are taken in (kept in ``suits`` too).
    """
    taking = _Taking(nodes, Suits() if suits is None else suits, used)
    decisions: dict[int, Placement | Pending] = {}
    head: int | None = None
    for job_id, spec in queue:
        kind = taking.kind(spec)
        if head is not None:
            counts = taking.counts(spec, kind)
            if counts["nodes_suitable"] >= spec.topology.num_machines:
                decisions[job_id] = Pending(
                    PendingCode.QUEUED_BEHIND,
                    f"queued behind job {head}",
                    behind_job=head,
                    **counts,
                )
                continue
        decision = (
            place_gang(spec, taking.current)
            if kind is None
            else _gang(spec, taking.counts(spec, kind), partial(taking.pick, kind))
        )
        if isinstance(decision, Placement):
            for node_id in decision.node_ids:
                taking.take(node_id)
        elif decision.waiting_for_slots:
            head = job_id
        decisions[job_id] = decision
    return decisions


def _suit_key(spec: JobSpec) -> tuple[object, ...] | None:
    """What :func:`_suits` asks of a node about ``spec`` (None: a script not
    pinned to one content, whose nodes depend on the content most have)."""
    if spec.script is not None:
        if spec.script.sha256 is None:
            return None
        need: tuple[object, ...] = ("script", spec.script.path, spec.script.sha256)
    else:
        need = ("trainer", spec.trainer, spec.trainer_version)
    return (*need, spec.backend, spec.topology.num_processes)


@dataclass
class _Kind:
    """The nodes that suit one kind of job, and those of them free."""

    members: frozenset[int]  # indices into _Taking.nodes
    free: int  # members with a free slot
    # (-free slots, node id, index) of free members, place_gang's order; an
    # entry whose node's slots have changed since is stale, skipped. Every
    # free member's, or (with ``order``) those of members whose slots are
    # not their node's in the list.
    heap: list[tuple[int, int, int]]
    # The members free in the list, in that order (by their slots there),
    # skipping those whose slots changed (in the heap); ``position``: the
    # first not taken yet.
    order: Sequence[int] = ()
    position: int = 0


class _Taking:
    """The nodes as a plan takes their slots, with which suit each kind of
    job (computed once a plan: with thousands of nodes, a pass over every
    node for each job was most of a plan's time). A node's free slots are
    its own in ``nodes`` but for those in ``slots`` (in use, or taken by
    this plan)."""

    def __init__(
        self, nodes: Sequence[NodeCapacity], suits: Suits, used: Mapping[int, int] | None
    ) -> None:
        self.nodes = nodes
        if suits.index is None:
            suits.index = {n.node_id: i for i, n in enumerate(nodes)}
        self._index = suits.index
        self._kinds: dict[tuple[object, ...], _Kind] = {}
        self._suits = suits
        # Given the slots in use apart, the list's own stay the same plan
        # after plan: the order of each kind's free nodes in it is kept.
        self._ordered = used is not None
        self.slots: dict[int, int] = {}
        for node_id, in_use in (used or {}).items():
            i = self._index.get(node_id)
            if i is not None and in_use:
                self.slots[i] = nodes[i].free_slots - in_use

    def free_slots(self, i: int) -> int:
        return self.slots.get(i, self.nodes[i].free_slots)

    @property
    def current(self) -> list[NodeCapacity]:
        """Every node with its free slots now (a pass over all of them)."""
        return [
            replace(n, free_slots=self.slots[i]) if i in self.slots else n
            for i, n in enumerate(self.nodes)
        ]

    def kind(self, spec: JobSpec) -> _Kind | None:
        key = _suit_key(spec)
        if key is None:
            return None
        kind = self._kinds.get(key)
        if kind is None:
            members = self._suits.kinds.get(key)
            if members is None:
                members = frozenset(i for i, n in enumerate(self.nodes) if _suits(n, spec))
                self._suits.kinds[key] = members
            kind = self._kinds[key] = (
                self._ordered_kind(key, members) if self._ordered else self._heaped_kind(members)
            )
        return kind

    def _heaped_kind(self, members: frozenset[int]) -> _Kind:
        heap = [
            (-slots, self.nodes[i].node_id, i) for i in members if (slots := self.free_slots(i)) > 0
        ]
        heapq.heapify(heap)
        return _Kind(members, len(heap), heap)

    def _ordered_kind(self, key: tuple[object, ...], members: frozenset[int]) -> _Kind:
        order = self._suits.orders.get(key)
        if order is None:
            free = [i for i in members if self.nodes[i].free_slots > 0]
            free.sort(key=lambda i: (-self.nodes[i].free_slots, self.nodes[i].node_id))
            order = self._suits.orders[key] = free
        changed = [i for i in self.slots if i in members]
        heap = [(-self.slots[i], self.nodes[i].node_id, i) for i in changed if self.slots[i] > 0]
        heapq.heapify(heap)
        free_in_list = sum(1 for i in changed if self.nodes[i].free_slots > 0)
        return _Kind(members, len(order) - free_in_list + len(heap), heap, order)

    def counts(self, spec: JobSpec, kind: _Kind | None) -> Counts:
        if kind is None:
            current = self.current
            suitable, free = _suitable_and_free(spec, current)
            return _counts(spec, current, suitable, free)
        return {
            "nodes_needed": spec.topology.num_machines,
            "nodes_suitable": len(kind.members),
            "nodes_free": kind.free,
            "nodes_live": len(self.nodes),
        }

    def pick(self, kind: _Kind, machines: int) -> list[int]:
        """The ``machines`` free members place_gang would choose, taken off
        the kind's order and heap (:meth:`take` puts back what is left of
        each in the heap)."""
        chosen: list[int] = []
        heap, order = kind.heap, kind.order
        while len(chosen) < machines:
            while heap and -heap[0][0] != self.free_slots(heap[0][2]):
                heapq.heappop(heap)  # stale: its node's slots changed since
            while kind.position < len(order) and order[kind.position] in self.slots:
                kind.position += 1  # its slots changed: it is in the heap if free
            if kind.position < len(order):
                i = order[kind.position]
                listed = (-self.nodes[i].free_slots, self.nodes[i].node_id, i)
                if not heap or listed < heap[0]:
                    kind.position += 1
                    chosen.append(listed[1])
                    continue
            chosen.append(heapq.heappop(heap)[1])
        return chosen

    def take(self, node_id: int) -> None:
        """One slot of the node taken."""
        i = self._index[node_id]
        before = self.free_slots(i)
        after = self.slots[i] = before - 1
        for kind in self._kinds.values():
            if i not in kind.members:
                continue
            if after > 0:
                heapq.heappush(kind.heap, (-after, node_id, i))
            elif before > 0:
                kind.free -= 1
