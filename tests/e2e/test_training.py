"""Jobs posted to a real server, trained by real workers with mp.spawn and
real torch.distributed process groups on the real MNIST files."""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

import psutil
import pytest

from cli.cluster import SERVER_NICE, LocalCluster
from tests.e2e.conftest import (
    SMOKE_STEPS,
    Jobs,
    fork_server,
    rank_processes,
    record,
    still_running,
)


def assert_trained(jobs: Jobs, job: dict[str, Any]) -> None:
    assert job["status"] == "succeeded", job
    # Progress came from rank 0 and reached the end.
    progress = job["progress"]
    assert progress["batch"] == progress["batches_per_epoch"] == SMOKE_STEPS
    assert progress["percent"] == 100.0
    points = jobs.client.get(f"/jobs/{job['id']}/metrics").json()["points"]
    assert len(points) >= 3
    assert points[-1]["loss"] < points[0]["loss"], "the loss did not fall"
    assert all(p["samples_per_sec"] > 0 for p in points)
    # Timing is filled in and adds up.
    timing = job["timing"]
    for key in (
        "created_at",
        "started_at",
        "finished_at",
        "queued_seconds",
        "running_seconds",
        "training_seconds",
        "setup_seconds",
        "eval_seconds",
        "threads_per_process",
    ):
        assert timing[key] is not None, key
    assert 0 < timing["training_seconds"] < timing["running_seconds"]
    # Rank 0 measured the test set.
    assert 0.1 < job["result"]["test_accuracy"] <= 1.0
    assert job["error"] is None


def test_two_machines_one_process_each(jobs: Jobs) -> None:
    job_id = jobs.submit(machines=2, processes=1, batch_size=64, max_steps_per_epoch=SMOKE_STEPS)
    job = jobs.wait_done(job_id)
    assert_trained(jobs, job)
    parts = job["parts"]
    assert sorted(p["machine_id"] for p in parts) == [0, 1]
    assert len({p["node_name"] for p in parts}) == 2, "both machine ids ran on one node"
    assert {p["status"] for p in parts} == {"succeeded"}
    assert job["world_size"] == 2


def test_one_machine_two_processes(jobs: Jobs) -> None:
    job_id = jobs.submit(machines=1, processes=2, batch_size=64, max_steps_per_epoch=SMOKE_STEPS)
    job = jobs.wait_done(job_id)
    assert_trained(jobs, job)
    assert [p["machine_id"] for p in job["parts"]] == [0]
    assert job["world_size"] == 2
    # Each rank gets its share of the node's cores.
    assert job["timing"]["threads_per_process"] == max(1, len(os.sched_getaffinity(0)) // 2)


def test_cancel_stops_every_rank_on_every_node(jobs: Jobs, cluster: LocalCluster) -> None:
    # A whole epoch: far longer than the test. Restarts are for failures, not cancels.
    job_id = jobs.submit(machines=2, processes=1, max_restarts=2)
    jobs.wait(job_id, lambda j: j["progress"] is not None, 120, "training to report progress")
    ranks = rank_processes(cluster)
    # Per node: the launcher and one rank.
    assert len(ranks) >= 4, ranks

    jobs.client.post(f"/jobs/{job_id}/cancel").raise_for_status()
    asked_at = time.monotonic()
    job = jobs.wait(job_id, lambda j: j["status"] == "cancelled", 10, "cancelled within 10 s")
    cancelled_s = time.monotonic() - asked_at
    assert still_running(ranks) == [], "ranks still running after the job was cancelled"
    record(
        "cancel a running 2-machine job (max_restarts=2)",
        cancelled_and_ranks_gone_s=round(cancelled_s, 2),
    )
    assert {p["status"] for p in job["parts"]} == {"cancelled"}
    assert len(job["attempts"]) == 1


def test_a_dead_fork_server_takes_its_launchers_along_and_is_replaced(
    jobs: Jobs, cluster: LocalCluster
) -> None:
    job_id = jobs.submit()  # a whole epoch: far longer than the test
    job = jobs.wait(job_id, lambda j: j["progress"] is not None, 120, "training to report progress")
    node = job["parts"][0]["node_name"]
    server = fork_server(cluster, node)
    assert server is not None, f"{node} has no fork server"
    ranks = rank_processes(cluster)
    server.kill()

    job = jobs.wait_done(job_id, timeout_s=30)
    assert job["status"] == "failed"
    assert job["error"]["reason"] == "launcher_died"
    assert "SIGTERM" in job["error"]["message"], job["error"]
    assert still_running(ranks) == [], "ranks outlived their fork server"

    # The node starts a new server once idle, and runs the next job.
    deadline = time.monotonic() + 30
    while (new := fork_server(cluster, node)) is None or new.pid == server.pid:
        assert time.monotonic() < deadline, f"{node} started no new fork server"
        time.sleep(0.1)
    next_id = jobs.submit(machines=2, processes=1, max_steps_per_epoch=5)
    assert jobs.wait_done(next_id)["status"] == "succeeded"


@pytest.mark.parametrize("trainer", ["crash", "crash-then-linger"])
def test_a_rank_that_raises_fails_the_job_and_workers_carry_on(jobs: Jobs, trainer: str) -> None:
    """The job's error names the rank that raised, not its peer that lost it
    (whose report may reach the server first, and stop the part of the rank
    that raised before its launcher has recorded why)."""
    job_id = jobs.submit(machines=2, processes=1, trainer=trainer)
    job = jobs.wait_done(job_id, timeout_s=120)
    assert job["status"] == "failed"
    error, parts = job["error"], job["parts"]
    assert (error["rank"], error["machine_id"], error["reason"]) == (1, 1, "rank_failed"), parts
    assert "ValueError: injected failure on rank 1" in error["traceback_tail"]
    assert all(p["status"] in ("failed", "cancelled") for p in parts)

    # Both nodes take the next job.
    next_id = jobs.submit(machines=2, processes=1, max_steps_per_epoch=5)
    assert jobs.wait_done(next_id)["status"] == "succeeded"


@pytest.mark.parametrize("allreduce", ["shared_memory", "gloo"])
def test_a_rank_that_dies_mid_step_fails_the_job(jobs: Jobs, allreduce: str) -> None:
    job_id = jobs.submit(
        machines=1,
        processes=2,
        trainer="dies",
        performance={"same_host_allreduce": allreduce},
    )
    # Well inside the process-group timeout: the launcher sees the death, not
    # the survivor's collective timing out.
    job = jobs.wait_done(job_id, timeout_s=30)
    assert job["status"] == "failed"
    assert job["error"]["rank"] == 1
    assert job["error"]["reason"] == "rank_exited"
    assert job["error"]["message"].endswith("exited with code 3"), job["error"]


def test_three_jobs_at_once_on_two_single_slot_nodes(jobs: Jobs) -> None:
    shapes = [2, 1, 2]  # machines per job
    ids = [jobs.submit(machines=m, max_steps_per_epoch=5) for m in shapes]
    done = [jobs.wait_done(job_id, timeout_s=240) for job_id in ids]
    assert [j["status"] for j in done] == ["succeeded"] * 3

    intervals: dict[str, list[tuple[str, str, int]]] = {}
    for job, machines in zip(done, shapes, strict=True):
        assert job["attempt"] == 1
        assert len(job["parts"]) == machines
        assert len({p["node_name"] for p in job["parts"]}) == machines
        for part in job["parts"]:
            intervals.setdefault(part["node_name"], []).append(
                (part["assigned_at"], part["finished_at"], job["id"])
            )
    # A single-slot node never ran two parts at once.
    for node, spans in intervals.items():
        spans.sort()
        for (_, end, first), (start, _, second) in itertools.pairwise(spans):
            assert end <= start, f"{node} ran jobs {first} and {second} at once"


def test_two_jobs_on_one_host_run_side_by_side(jobs: Jobs) -> None:
    """Both workers live on 127.0.0.1: each job's machine 0 binds its own
    rendezvous port, so concurrent jobs on one host never collide."""
    ids = [jobs.submit(max_steps_per_epoch=SMOKE_STEPS) for _ in range(2)]
    running = [
        jobs.wait(i, lambda j: j["master_port"] is not None, 60, "a rendezvous port") for i in ids
    ]
    assert running[0]["master_port"] != running[1]["master_port"]
    assert {r["parts"][0]["node_name"] for r in running} == {"node-0", "node-1"}
    assert [jobs.wait_done(i)["status"] for i in ids] == ["succeeded", "succeeded"]


def test_nodes_show_what_they_run(jobs: Jobs, cluster: LocalCluster) -> None:
    with cluster.client() as client:
        nodes = client.get("/nodes").json()["data"]
    assert sorted(n["name"] for n in nodes) == ["node-0", "node-1"]
    assert all(n["state"] == "live" and "crash" in n["trainers"] for n in nodes)


def test_a_local_clusters_server_yields_the_cores_to_training(cluster: LocalCluster) -> None:
    assert cluster.server is not None
    server = psutil.Process(cluster.server.process.pid)
    assert server.nice() == SERVER_NICE
    workers = [psutil.Process(w.process.pid) for w in cluster.worker_processes]
    assert all(w.nice() == 0 for w in workers)  # the training keeps its priority
