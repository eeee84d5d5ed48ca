"""The preemption policy (api/preemption.py): which running jobs a waiting
job may stop, on the scheduler's own terms, without I/O."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from api.preemption import Preemption, RunningJob, victims_for
from api.scheduling import NodeCapacity
from ddpo.schemas import JobSpec, Topology

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)
MIN_RUN_S = 60.0


def nodes(*names: str, trainers: frozenset[str] = frozenset({"mnist"})) -> list[NodeCapacity]:
    """One slot each, every one taken (the cluster is full)."""
    return [NodeCapacity(i, name, 0, 0, trainers) for i, name in enumerate(names)]


def running(
    job_id: int, priority: int, *on: int, ran_s: float = 3600, preemptible: bool = True
) -> RunningJob:
    return RunningJob(job_id, priority, NOW - timedelta(seconds=ran_s), preemptible, on)


def wants(machines: int) -> JobSpec:
    return JobSpec(topology=Topology(num_machines=machines))


def choose(
    spec: JobSpec, priority: int, cluster: list[NodeCapacity], jobs: list[RunningJob]
) -> Preemption | None:
    return victims_for(spec, priority, cluster, jobs, NOW, MIN_RUN_S)


def test_the_fewest_victims_win_over_lower_priorities() -> None:
    # Two machines: one job across c and d, or the two single jobs on a and b.
    cluster = nodes("a", "b", "c", "d")
    jobs = [running(1, 0, 0), running(2, 0, 1), running(3, 1, 2, 3)]
    chosen = choose(wants(2), 5, cluster, jobs)
    assert chosen is not None
    assert chosen.victims == (3,)
    assert sorted(chosen.placement.node_ids) == [2, 3]


def test_among_as_few_the_lowest_priority_then_the_newest() -> None:
    cluster = nodes("a", "b", "c")
    jobs = [running(1, 2, 0), running(2, 1, 1, ran_s=7200), running(3, 1, 2, ran_s=600)]
    assert choose(wants(1), 5, cluster, jobs) == choose(wants(1), 5, cluster, jobs[::-1])
    chosen = choose(wants(1), 5, cluster, jobs)
    assert chosen is not None and chosen.victims == (3,)  # priority 1, started last
    two = choose(wants(2), 5, cluster, jobs)
    assert two is not None and two.victims == (3, 2)  # both of priority 1, newest first


def test_equal_or_higher_priority_is_never_preempted() -> None:
    cluster = nodes("a", "b")
    jobs = [running(1, 5, 0), running(2, 7, 1)]
    assert choose(wants(1), 5, cluster, jobs) is None
    assert choose(wants(1), 6, cluster, jobs) == choose(wants(1), 6, cluster, jobs[:1])
    chosen = choose(wants(1), 6, cluster, jobs)
    assert chosen is not None and chosen.victims == (1,)


def test_a_job_too_young_or_not_preemptible_is_left_alone() -> None:
    cluster = nodes("a", "b", "c")
    jobs = [
        running(1, 0, 0, ran_s=MIN_RUN_S - 1),
        running(2, 0, 1, preemptible=False),
        running(3, 3, 2, ran_s=MIN_RUN_S),
    ]
    chosen = choose(wants(1), 5, cluster, jobs)
    assert chosen is not None and chosen.victims == (3,)  # the only one allowed
    assert choose(wants(2), 5, cluster, jobs) is None  # one allowed victim is not enough


def test_nothing_is_stopped_for_a_job_that_fits_or_that_no_choice_makes_room_for() -> None:
    free = [NodeCapacity(0, "a", 1, 0, frozenset({"mnist"}))]
    assert choose(wants(1), 5, free, []) is None
    # Victims on nodes that cannot run the waiting job free nothing it can use.
    cluster = nodes("a", "b", trainers=frozenset({"other"}))
    assert choose(wants(1), 5, cluster, [running(1, 0, 0), running(2, 0, 1)]) is None
    # More machines than there are nodes.
    assert choose(wants(3), 5, nodes("a", "b"), [running(1, 0, 0), running(2, 0, 1)]) is None


def test_stopping_one_of_two_jobs_on_a_node_frees_one_slot_there() -> None:
    # Node a runs jobs 1 and 2, node b job 3: two machines need one of a's
    # two jobs and b's, not both of a's.
    cluster = nodes("a", "b")
    jobs = [running(1, 0, 0, ran_s=7200), running(2, 0, 0), running(3, 1, 1)]
    chosen = choose(wants(2), 5, cluster, jobs)
    assert chosen is not None and chosen.victims == (2, 3)
    assert sorted(chosen.placement.node_ids) == [0, 1]


def test_many_running_jobs_still_give_the_fewest_least_valuable() -> None:
    # 60 single-machine jobs: choosing 4 of them is past the exhaustive search.
    cluster = nodes(*(f"n{i}" for i in range(60)))
    jobs = [running(100 + i, i % 3, i, ran_s=3600 + i) for i in range(60)]
    chosen = choose(wants(4), 5, cluster, jobs)
    assert chosen is not None and len(chosen.victims) == 4
    lowest = sorted((j for j in jobs if j.priority == 0), key=lambda j: j.started_at)[::-1]
    assert set(chosen.victims) == {j.job_id for j in lowest[:4]}
    assert len(set(chosen.placement.node_ids)) == 4
