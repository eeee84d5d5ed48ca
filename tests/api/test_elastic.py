"""Elastic jobs as the server keeps them (issue 28), with nodes spoken for
by hand: a range of machines starts on what is free, shrinks past a lost
node and grows onto a spare one, and neither uses a restart.
tests/e2e/test_elastic.py runs the same on test hosts with real training."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.conftest import ProtocolNode, wait_for
from tests.api.test_jobs_api import submit
from tests.api.test_monitoring import scrape
from tests.api.test_preemption import job, put_stop_checkpoint, serve
from tests.api.test_retries import started

ONE_TO_THREE = {"num_machines": {"min": 1, "max": 3}, "num_processes": 1}


def machines_of(assignment: dict[str, Any]) -> int:
    count: int = assignment["spec"]["topology"]["num_machines"]
    return count


def test_a_range_is_stored_as_its_least_and_most_and_bad_ranges_name_the_field(
    tmp_path: Any,
) -> None:
    with serve(tmp_path) as client:
        stored = submit(client, topology=ONE_TO_THREE)["spec"]["topology"]
        assert stored == {"num_machines": 1, "max_machines": 3, "num_processes": 1}
        for topology, words in [
            ({"num_machines": {"min": 3, "max": 2}}, "max 2 is below min 3"),
            ({"num_machines": {"min": 0, "max": 2}}, "num_machines.min"),
            ({"num_machines": {"min": 1}}, "num_machines.max"),
            ({"num_machines": {"min": 1, "max": 2, "step": 1}}, "not step"),
        ]:
            refused = client.post("/jobs", json={"topology": topology})
            assert refused.status_code == 422, refused.text
            assert words in refused.text and "topology" in refused.text


def test_a_range_job_starts_on_every_free_node_up_to_its_max(tmp_path: Any) -> None:
    with serve(tmp_path) as client:
        nodes = [ProtocolNode(client, name) for name in "abcd"]
        job_id = submit(client, topology=ONE_TO_THREE, batch_size=32)["id"]
        given = [a for n in nodes for a in n.poll()["start"]]
        assert sorted(a["machine_id"] for a in given) == [0, 1, 2]
        # Each machine's ranks see the world of this attempt.
        assert {machines_of(a) for a in given} == {3}
        attempt = job(client, job_id)["attempts"][0]
        assert (attempt["num_machines"], attempt["world_size"], attempt["global_batch"]) == (
            3,
            3,
            96,
        )


def test_an_elastic_job_waits_for_its_min(tmp_path: Any) -> None:
    with serve(tmp_path) as client:
        ProtocolNode(client, "a")
        queued = submit(client, topology={"num_machines": {"min": 2, "max": 3}})
        assert queued["status"] == "queued"
        assert "needs 2 live node(s)" in queued["pending_reason"]


def test_a_lost_node_shrinks_the_job_to_the_rest_without_a_restart(tmp_path: Any) -> None:
    with serve(tmp_path, heartbeat_timeout_s=1.5) as client:
        a, b, c = (ProtocolNode(client, name) for name in "abc")
        job_id = submit(client, topology=ONE_TO_THREE, batch_size=32, max_restarts=0)["id"]
        parts = {n.name: started(n) for n in (a, b, c)}
        first = next(n for n in (a, b, c) if parts[n.name]["machine_id"] == 0)
        assert put_stop_checkpoint(first, parts[first.name]["part_id"], epoch=1, step=7)

        # c falls silent; a and b keep polling with their parts.
        def shrunk() -> bool:
            for node in (a, b):
                node.poll([parts[node.name]["part_id"]])
            return bool(job(client, job_id)["status"] == "queued")

        wait_for(shrunk, 10, "the job to give up the attempt c was in")
        view = job(client, job_id)
        assert view["error"] is None
        # Not a failure to retry after a backoff: the next attempt waits
        # only for a and b to stop what they ran, to start on both.
        assert view["pending"]["code"] == "resizing"
        ended = view["attempts"][0]
        assert ended["stop"] is None or ended["stop"]["reason"] == "resized"
        assert ended["error"]["reason"] == "node_lost"

        for node in (a, b):  # their ranks are stopped, then they start again
            part_id = parts[node.name]["part_id"]
            assert node.poll([part_id])["stop"] == [part_id]
            assert node.poll([part_id])["start"] == []
            node.finish(part_id, "cancelled").raise_for_status()
        again = started_together([a, b])
        assert sorted(x["machine_id"] for x in again) == [0, 1]
        assert {machines_of(x) for x in again} == {2}
        assert {(x["resume_epoch"], x["resume_step"]) for x in again} == {(0, 7)}

        view = job(client, job_id)
        assert view["status"] == "running" and view["world_size"] == 2
        assert [x["world_size"] for x in view["attempts"]] == [3, 2]
        assert view["attempts"][0]["ended"] == "resized after a lost machine (node_lost), 3 -> 2"
        assert view["attempts"][1]["resumed_from_step"] == 7
        assert scrape(client)[("ddpo_stops_total", (("reason", "resized"),))] == 1


def test_a_crash_taken_for_a_lost_machine_is_a_restart_after_all(tmp_path: Any) -> None:
    with serve(tmp_path) as client:
        a, b = ProtocolNode(client, "a"), ProtocolNode(client, "b")
        job_id = submit(client, topology=ONE_TO_THREE, max_restarts=0)["id"]
        parts = {n.name: started(n)["part_id"] for n in (a, b)}
        a.finish(parts["a"], "failed", reason="peer_failure", exit_code=1).raise_for_status()
        assert job(client, job_id)["status"] == "queued"
        # The cause: b's rank was killed (the OOM killer), not a lost node.
        b.finish(
            parts["b"], "failed", reason="rank_exited", exit_code=-9, failing_rank=1
        ).raise_for_status()
        ended = job(client, job_id)["attempts"][0]
        assert ended["error"]["reason"] == "rank_exited" and ended["stop"] is None
        assert ended["ended"] == "failed: rank_exited"


def started_together(nodes: list[ProtocolNode]) -> list[dict[str, Any]]:
    """One new assignment for each node, polling them all in turn (a node
    that stops polling is lost, by the short heartbeat timeout)."""
    given: dict[str, dict[str, Any]] = {}

    def each_has_one() -> bool:
        for node in nodes:
            for start in node.poll([given[node.name]["part_id"]] if node.name in given else [])[
                "start"
            ]:
                given[node.name] = start
        return len(given) == len(nodes)

    wait_for(each_has_one, 10, "an assignment on each node")
    for node in nodes:
        node.client.post(
            f"/parts/{given[node.name]['part_id']}/started", json={"node_id": node.node_id}
        ).raise_for_status()
    return [given[node.name] for node in nodes]


def grow_setup(client: httpx.Client) -> tuple[int, list[ProtocolNode], list[dict[str, Any]]]:
    """An elastic 1..3 job running on a and b (the only nodes)."""
    a, b = ProtocolNode(client, "a"), ProtocolNode(client, "b")
    job_id = submit(client, topology=ONE_TO_THREE, max_restarts=0)["id"]
    return job_id, [a, b], [started(a), started(b)]


def asked(node: ProtocolNode, assignment: dict[str, Any]) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = node.poll([assignment["part_id"]])["checkpoint_and_stop"]
    return requests


def test_a_free_node_grows_the_job_at_a_step_without_a_restart(tmp_path: Any) -> None:
    with serve(tmp_path, resize_interval_s=0) as client:
        job_id, (a, b), (on_a, on_b) = grow_setup(client)
        assert {machines_of(on_a), machines_of(on_b)} == {2}
        c = ProtocolNode(client, "c")  # joins: the job is asked to stop, to grow
        for node, given in ((a, on_a), (b, on_b)):
            assert [(r["reason"], r["detail"]) for r in asked(node, given)] == [
                ("resized", "2 -> 3")
            ]
        first, given = (a, on_a) if on_a["machine_id"] == 0 else (b, on_b)
        assert put_stop_checkpoint(first, given["part_id"], epoch=1, step=9)
        for node, given in ((a, on_a), (b, on_b)):
            node.finish(given["part_id"], "stopped", exit_code=0, step=9).raise_for_status()
        grown = [started(node) for node in (a, b, c)]
        assert {machines_of(x) for x in grown} == {3}
        assert {x["resume_step"] for x in grown} == {9}
        view = job(client, job_id)
        assert [x["world_size"] for x in view["attempts"]] == [2, 3]
        assert view["attempts"][0]["ended"] == "resized (2 -> 3), stopped after step 9"

        # The grown attempt's first checkpoint counts its steps in its own
        # (bigger) batches: a lower number than the step it resumed from,
        # and still the newest.
        first = next(n for n, x in zip((a, b, c), grown, strict=True) if x["machine_id"] == 0)
        part_id = next(x["part_id"] for x in grown if x["machine_id"] == 0)
        assert put_stop_checkpoint(first, part_id, epoch=1, step=8)
        assert job(client, job_id)["checkpoint"]["step"] == 8


@pytest.mark.parametrize(
    "waiting_priority,grows", [(0, False), (1, False), (-1, True)], ids=["equal", "higher", "lower"]
)
def test_a_node_a_queued_job_of_its_priority_needs_is_not_spare(
    tmp_path: Any, waiting_priority: int, grows: bool
) -> None:
    with serve(tmp_path, resize_interval_s=0, preemption=False) as client:
        _, (a, _b), (on_a, _) = grow_setup(client)
        waiting = submit(
            client, topology={"num_machines": 2, "num_processes": 1}, priority=waiting_priority
        )
        assert waiting["status"] == "queued"
        ProtocolNode(client, "c")
        assert bool(asked(a, on_a)) is grows


def test_a_job_grows_at_most_once_per_resize_interval(tmp_path: Any) -> None:
    with serve(tmp_path, resize_interval_s=3600) as client:
        job_id, (a, _b), (on_a, _) = grow_setup(client)
        ProtocolNode(client, "c")
        assert asked(a, on_a) == []
        assert job(client, job_id)["attempts"][0]["stop"] is None
