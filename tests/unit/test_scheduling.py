from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

from api.scheduling import (
    NodeCapacity,
    Pending,
    Placement,
    Suits,
    _counts,
    _suitable_and_free,
    could_start,
    place_gang,
    plan,
)
from ddpo.lifecycle import PendingCode
from ddpo.schemas import JobSpec


def node(
    node_id: int, free: int = 1, gpus: int = 0, trainers: tuple[str, ...] = ("mnist",)
) -> NodeCapacity:
    return NodeCapacity(node_id, f"n{node_id}", free, gpus, frozenset(trainers))


def spec(machines: int = 1, processes: int = 1, **kw: object) -> JobSpec:
    return JobSpec.model_validate(
        {"topology": {"num_machines": machines, "num_processes": processes}, **kw}
    )


SHA_A, SHA_B = "a" * 64, "b" * 64
# A job of every kind placement tells apart.
KINDS = [
    spec(1),
    spec(2),
    spec(3),
    spec(1, trainer="resnet"),
    spec(2, 2, backend="nccl"),
    spec(1, trainer="mnist", trainer_version="2"),
    spec(topology={"num_machines": 2, "max_machines": 4, "num_processes": 1}),
    spec(script={"path": "train.py"}),
    spec(2, script={"path": "train.py"}),
    spec(1, script={"path": "train.py", "sha256": SHA_B}),
]


def mixed_node(
    node_id: int, free: int, pick: int, sha: str, gpus: int | None = None, version: str = "0"
) -> NodeCapacity:
    """A node of one mix: ``pick`` 1 has GPUs (unless ``gpus`` says), 2 has
    resnet too, any but 0 holds train.py with content ``sha``."""
    return NodeCapacity(
        node_id,
        f"n{node_id}",
        free_slots=free,
        gpus=(2 if pick == 1 else 0) if gpus is None else gpus,
        trainers=frozenset({"mnist", "resnet"} if pick == 2 else {"mnist"}),
        scripts={"train.py": sha} if pick else {},
        trainer_versions=frozenset({("mnist", version)}),
    )


def test_a_gang_gets_distinct_nodes_one_per_machine_id() -> None:
    decision = place_gang(spec(3), [node(1), node(2), node(3), node(4)])
    assert isinstance(decision, Placement)
    assert len(decision.node_ids) == 3 == len(set(decision.node_ids))


def test_never_a_partial_start() -> None:
    decision = place_gang(spec(3), [node(1), node(2), node(3, free=0)])
    assert isinstance(decision, Pending)
    assert decision.waiting_for_slots and decision.code is PendingCode.WAITING_FOR_SLOTS
    assert "2 of 3" in decision.reason
    assert (decision.nodes_needed, decision.nodes_suitable, decision.nodes_free) == (3, 3, 2)


def test_one_node_is_never_given_two_machine_ids_of_a_job() -> None:
    decision = place_gang(spec(2), [node(1, free=4)])
    assert isinstance(decision, Pending)
    assert not decision.waiting_for_slots


def test_the_emptiest_nodes_are_used_first() -> None:
    decision = place_gang(spec(2), [node(1, free=1), node(2, free=3), node(3, free=2)])
    assert decision == Placement((2, 3))


def test_nccl_needs_a_gpu_per_process_on_every_node() -> None:
    decision = place_gang(spec(2, 2, backend="nccl"), [node(1, gpus=2), node(2, gpus=1)])
    assert isinstance(decision, Pending)
    assert "GPU" in decision.reason and not decision.waiting_for_slots
    assert place_gang(spec(2, 2, backend="nccl"), [node(1, gpus=2), node(2, gpus=4)]) == Placement(
        (1, 2)
    )


def test_nodes_without_the_trainer_are_not_used() -> None:
    decision = place_gang(spec(1, trainer="resnet"), [node(1)])
    assert isinstance(decision, Pending) and "resnet" in decision.reason
    assert decision.code is PendingCode.NO_SUITABLE_NODES
    assert (decision.nodes_needed, decision.nodes_suitable, decision.nodes_live) == (1, 0, 1)
    assert place_gang(
        spec(1, trainer="resnet"), [node(1), node(2, trainers=("resnet",))]
    ) == Placement((2,))


def test_plan_fills_nodes_in_queue_order_and_counts_slots_it_used() -> None:
    decisions = plan([(1, spec(2)), (2, spec(1)), (3, spec(1))], [node(1), node(2), node(3)])
    assert isinstance(decisions[1], Placement) and isinstance(decisions[2], Placement)
    assert isinstance(decisions[3], Pending)
    used = list(decisions[1].node_ids) + list(decisions[2].node_ids)
    assert sorted(used) == [1, 2, 3]


def test_jobs_behind_a_waiting_job_wait_too() -> None:
    """A big job next in line is not starved by small ones slipping past it."""
    decisions = plan([(1, spec(2)), (2, spec(1))], [node(1), node(2, free=0)])
    assert isinstance(decisions[1], Pending)
    assert decisions[2] == Pending(
        PendingCode.QUEUED_BEHIND,
        "queued behind job 1",
        behind_job=1,
        nodes_needed=1,
        nodes_suitable=2,
        nodes_free=1,
        nodes_live=2,
    )
    assert decisions[2].waiting_for_slots


def test_a_job_wanting_more_nodes_than_are_live_says_so_not_that_it_waits_behind() -> None:
    """3 machines on 2 live nodes: no wait behind another job would start it."""
    decisions = plan([(1, spec(2)), (2, spec(3))], [node(1), node(2, free=0)])
    assert isinstance(decisions[2], Pending)
    assert decisions[2].code is PendingCode.NO_SUITABLE_NODES
    assert decisions[2].reason.startswith("needs 3 live node(s)"), decisions[2].reason
    assert "2 of 2 live node(s) qualify" in decisions[2].reason


def test_a_job_no_node_could_ever_run_does_not_block_the_queue() -> None:
    decisions = plan([(1, spec(1, backend="nccl")), (2, spec(1))], [node(1)])
    assert isinstance(decisions[1], Pending)
    assert decisions[2] == Placement((1,))


def test_could_start_says_what_place_gang_decides_for_every_kind_of_job() -> None:
    """The submit's quick check (asking only as many nodes as it takes)
    against the full placement, over nodes of every mix."""

    def mixed(seed: int) -> list[NodeCapacity]:
        return [
            mixed_node(
                i,
                free=(seed + i) % 3,
                pick=(seed >> i) & 3,
                sha=SHA_A if (seed >> i) & 3 == 3 else SHA_B,
            )
            for i in range(1, 7)
        ]

    for seed in range(200):
        nodes = mixed(seed)
        for job in KINDS:
            placed = isinstance(place_gang(job, nodes), Placement)
            assert could_start(job, nodes) is placed, (seed, job.topology, job.script, nodes)


def _plan_node_by_node(
    queue: list[tuple[int, JobSpec]], nodes: list[NodeCapacity]
) -> dict[int, Placement | Pending]:
    """plan as it was written first: place_gang asked of every node left,
    job by job (what plan's kinds of job and heaps must decide the same as)."""
    current = list(nodes)
    index = {n.node_id: i for i, n in enumerate(current)}
    decisions: dict[int, Placement | Pending] = {}
    head: int | None = None
    for job_id, job in queue:
        if head is not None:
            fit, free = _suitable_and_free(job, current)
            if len(fit) >= job.topology.num_machines:
                decisions[job_id] = Pending(
                    PendingCode.QUEUED_BEHIND,
                    f"queued behind job {head}",
                    behind_job=head,
                    **_counts(job, current, fit, free),
                )
                continue
        decision = place_gang(job, current)
        if isinstance(decision, Placement):
            for node_id in decision.node_ids:
                taken = current[index[node_id]]
                current[index[node_id]] = replace(taken, free_slots=taken.free_slots - 1)
        elif decision.waiting_for_slots:
            head = job_id
        decisions[job_id] = decision
    return decisions


def test_plan_decides_what_place_gang_node_by_node_decides_over_queues_and_node_mixes() -> None:
    """The plan's kinds of job and heaps (one pass over the nodes a kind,
    not one a job) against place_gang asked of the nodes left after each
    placement, over queues of every kind of job on nodes of every mix."""
    rng = random.Random(7)
    for trial in range(400):
        nodes = [
            mixed_node(
                i * 3 % 37,  # ids not in the nodes' order
                free=rng.randint(-1, 3),
                pick=rng.randrange(4),
                sha=rng.choice([SHA_A, SHA_B]),
                gpus=rng.choice([0, 2]),
                version=rng.choice(["1", "2"]),
            )
            for i in range(1, rng.randint(1, 12) + 1)
        ]
        queue = [(j, rng.choice(KINDS)) for j in range(rng.randint(1, 10))]
        assert plan(queue, nodes) == _plan_node_by_node(queue, nodes), (trial, queue, nodes)


def mixed_fleet(rng: random.Random, slots: Callable[[], int]) -> list[NodeCapacity]:
    """1-12 nodes of every mix, ids not in the nodes' order, ``slots()`` free each."""
    return [
        mixed_node(
            i * 3 % 37,
            free=slots(),
            pick=rng.randrange(4),
            sha=rng.choice([SHA_A, SHA_B]),
            gpus=rng.choice([0, 2]),
            version=rng.choice(["1", "2"]),
        )
        for i in range(1, rng.randint(1, 12) + 1)
    ]


def test_plans_sharing_which_nodes_suit_decide_as_plans_that_find_them_anew() -> None:
    """The server keeps which nodes suit each kind of job with its memo of
    the live nodes, for every plan until a node changes: plans on those
    nodes with other free slots and other queues, sharing it, decide what
    place_gang node by node decides."""
    rng = random.Random(11)
    for trial in range(100):
        fleet = mixed_fleet(rng, lambda: 1)
        suits = Suits()
        for turn in range(5):
            nodes = [replace(n, free_slots=rng.randint(-1, 3)) for n in fleet]
            queue = [(j, rng.choice(KINDS)) for j in range(rng.randint(1, 10))]
            decided = plan(queue, nodes, suits)
            assert decided == _plan_node_by_node(queue, nodes), (trial, turn, queue, nodes)
        assert suits.kinds, "the plans kept which nodes suit the kinds they placed"


def test_plans_given_the_slots_in_use_apart_decide_as_plans_given_them_taken_off() -> None:
    """The server plans on its memo of the live nodes, all their slots free,
    and the slots its active parts use (keeping the order each kind's nodes
    are taken in with the memo, for every plan until a node changes): the
    same decisions as place_gang node by node on the nodes with those slots
    taken off, for nodes of several sizes, slots in use beyond a node's,
    and nodes in use that are not live."""
    rng = random.Random(13)
    for trial in range(150):
        fleet = mixed_fleet(rng, lambda: rng.randint(0, 3))
        suits = Suits()
        for turn in range(5):
            used = {n.node_id: rng.randint(0, 4) for n in fleet if rng.random() < 0.5} | {99: 1}
            taken_off = [
                replace(n, free_slots=n.free_slots - used.get(n.node_id, 0)) for n in fleet
            ]
            queue = [(j, rng.choice(KINDS)) for j in range(rng.randint(1, 10))]
            decided = plan(queue, fleet, suits, used)
            expected = _plan_node_by_node(queue, taken_off)
            assert decided == expected, (trial, turn, queue, taken_off)
        assert not suits.kinds or suits.orders, "the plans kept the order they take nodes in"
