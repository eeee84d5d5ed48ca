"""The queue with real worker daemons (issue 18's scenario): two nodes of
two slots each, jobs that hold their slots until the test lets them go. Four
1 x 1 jobs run two per node at once; a 2 x 2 job waits with numbers that
match the nodes; a later, higher-priority job starts before an earlier one;
raising a priority moves a job up at once; the 2 x 2 job runs when a slot
frees on each node."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.cluster import LocalCluster
from tests.conftest import REPO
from tests.e2e.conftest import until
from tests.e2e.trainers import hold_marker

pytestmark = pytest.mark.e2e


@pytest.fixture
def two_by_two(tmp_path: Path) -> Iterator[LocalCluster]:
    empty_data = tmp_path / "no-data"  # the hold trainer reads nothing
    empty_data.mkdir()
    with LocalCluster(
        state_dir=tmp_path / "cluster",
        data_dir=empty_data,
        workers=2,
        worker_slots=2,
        extra_env={"PYTHONPATH": str(REPO)},
        worker_args=["--trainer", "hold=tests.e2e.trainers:HOLD"],
    ) as cluster:
        yield cluster


class Held:
    """Jobs of the hold trainer, each let go when the test says."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self.names: dict[int, str] = {}

    def submit(self, machines: int = 1, processes: int = 1, priority: int = 0) -> int:
        name = f"held-{uuid.uuid4().hex[:8]}"
        body = {
            "trainer": "hold",
            "name": name,
            "priority": priority,
            "topology": {"num_machines": machines, "num_processes": processes},
        }
        answer = self.client.post("/jobs", json=body)
        assert answer.status_code == 201, answer.text
        job_id: int = answer.json()["id"]
        self.names[job_id] = name
        return job_id

    def job(self, job_id: int) -> dict[str, Any]:
        answer: dict[str, Any] = self.client.get(f"/jobs/{job_id}").raise_for_status().json()
        return answer

    def release(self, job_id: int) -> None:
        Path(hold_marker(self.names[job_id])).touch()

    def release_all(self) -> None:
        for job_id in self.names:
            self.release(job_id)

    def status(self, job_id: int) -> str:
        return str(self.job(job_id)["status"])

    def queue(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = self.client.get("/queue").raise_for_status().json()["data"]
        return data


def test_two_nodes_of_two_slots_run_steer_and_explain_their_queue(
    two_by_two: LocalCluster,
) -> None:
    with two_by_two.client() as client:
        held = Held(client)
        try:
            run_the_scenario(held)
        finally:
            held.release_all()
            for job_id in held.names:
                Path(hold_marker(held.names[job_id])).unlink(missing_ok=True)


def run_the_scenario(held: Held) -> None:
    small = [held.submit() for _ in range(4)]
    until(lambda: all(held.status(j) == "running" for j in small), 120, "four 1 x 1 jobs to run")
    nodes_of = {j: held.job(j)["parts"][0]["node_name"] for j in small}
    assert sorted(nodes_of.values()) == ["node-0", "node-0", "node-1", "node-1"]

    big = held.submit(machines=2, processes=2)
    [entry] = held.queue()
    pending = entry["pending"]
    assert entry["job_id"] == big and entry["position"] == 1
    assert (pending["code"], pending["nodes_needed"], pending["nodes_suitable"]) == (
        "waiting_for_slots",
        2,
        2,
    )
    assert (pending["nodes_free"], pending["nodes_live"]) == (0, 2)
    assert held.job(big)["pending"] == pending and held.job(big)["queue_position"] == 1

    # Later but higher: tried first. Raised above it: first at once.
    low = held.submit()
    high = held.submit(priority=5)
    assert [q["job_id"] for q in held.queue()] == [high, big, low]
    raised = held.client.patch(f"/jobs/{big}", json={"priority": 10})
    assert raised.status_code == 200 and raised.json()["queue_position"] == 1
    assert [q["job_id"] for q in held.queue()] == [big, high, low]
    held.client.patch(f"/jobs/{big}", json={"priority": 0}).raise_for_status()
    assert [q["job_id"] for q in held.queue()] == [high, big, low]

    # One slot frees on node-0: the higher-priority 1 x 1 job takes it
    # before the earlier one, and the 2 x 2 job still waits, now for node-1.
    on_0 = [j for j in small if nodes_of[j] == "node-0"]
    on_1 = [j for j in small if nodes_of[j] == "node-1"]
    held.release(on_0[0])
    until(lambda: held.status(high) == "running", 60, "the higher-priority job to start")
    assert held.status(low) == "queued" and held.status(big) == "queued"

    # A slot frees on each node. Whichever frees first is kept for the 2 x 2
    # job (no backfill: the 1 x 1 job behind it does not take it), so it runs.
    held.release(on_0[1])
    held.release(on_1[0])
    until(lambda: held.status(big) == "running", 60, "the 2 x 2 job to start")
    job = held.job(big)
    assert sorted(p["node_name"] for p in job["parts"]) == ["node-0", "node-1"]
    [entry] = held.queue()
    assert entry["job_id"] == low and entry["pending"]["code"] == "waiting_for_slots"
    assert (entry["pending"]["nodes_free"], entry["pending"]["nodes_live"]) == (0, 2)

    held.release_all()
    until(lambda: all(held.status(j) == "succeeded" for j in held.names), 120, "all to succeed")
