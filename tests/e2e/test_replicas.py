"""Two real servers on one PostgreSQL database, real workers split between
them (each speaks to its own server first, the other if that one cannot be
reached): a cancel sent to one stops a job whose node polls the other, a
node revoked through one is shut out by the other, and killing one server
mid-training leaves the job to succeed through the other. (CI's
PostgreSQL lane; SQLite has one server per database file.)"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.cluster import LocalCluster
from tests.databases import fresh_database_url, on_postgres
from tests.e2e.conftest import SMOKE_STEPS, record, until

pytestmark = pytest.mark.skipif(
    not on_postgres(), reason="several servers share a PostgreSQL database (CI's PostgreSQL lane)"
)


@pytest.fixture(scope="module")
def replicated(mnist_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    state = tmp_path_factory.mktemp("replicated")
    with LocalCluster(
        state_dir=state,
        data_dir=mnist_dir,
        workers=2,
        database=fresh_database_url(state),
        replicas=2,
    ) as cluster:
        yield cluster


def on(cluster: LocalCluster, replica: int, role: str = "user") -> httpx.Client:
    return httpx.Client(
        base_url=cluster.replica_url(replica), timeout=30, headers=cluster.headers(role)
    )


def job(client: httpx.Client, job_id: int) -> dict[str, Any]:
    answer: dict[str, Any] = client.get(f"/jobs/{job_id}").raise_for_status().json()
    return answer


def first_server_of(cluster: LocalCluster, node_name: str) -> int:
    """The server a worker speaks to first (cli/cluster.py: worker i, server i % 2)."""
    index = next(i for i, w in enumerate(cluster.worker_processes) if w.name == node_name)
    return index % cluster.replicas


def test_a_cancel_sent_to_one_server_stops_a_job_whose_node_polls_the_other(
    replicated: LocalCluster,
) -> None:
    with on(replicated, 0) as first:
        job_id = first.post("/jobs", json={"name": "cancelled-across"}).raise_for_status().json()
        job_id = job_id["id"]  # a whole epoch: far longer than the test
        running = until(
            lambda: (j := job(first, job_id))["progress"] is not None and j,
            120,
            "training to report progress",
        )
    node = running["parts"][0]["node_name"]
    other = 1 - first_server_of(replicated, node)
    with on(replicated, other) as elsewhere:
        elsewhere.post(f"/jobs/{job_id}/cancel").raise_for_status()
        asked = time.monotonic()
        done = until(
            lambda: (j := job(elsewhere, job_id))["status"] == "cancelled" and j,
            2,  # the bound users are promised
            "the job to be cancelled within 2 s",
        )
        took_s = time.monotonic() - asked
    assert {p["status"] for p in done["parts"]} == {"cancelled"}
    record(
        "cancel sent to the other server of two (PostgreSQL)",
        cancelled_and_ranks_gone_s=round(took_s, 2),
    )


def test_a_node_revoked_through_one_server_is_shut_out_by_the_other(
    replicated: LocalCluster,
) -> None:
    worker = replicated.start_worker("node-2")  # the third: its first server is server 0
    replicated.wait_for_nodes(3, 120)
    with on(replicated, 1, "admin") as admin:
        nodes = admin.get("/nodes").raise_for_status().json()["data"]
        node_id = next(n["id"] for n in nodes if n["name"] == "node-2")
        admin.post(f"/nodes/{node_id}/revoke").raise_for_status()
        revoked = time.monotonic()
    # Refused by server 0 at its next request (a heartbeat, within seconds):
    # the worker says so and stops.
    until(lambda: worker.process.poll() is not None, 30, "the revoked worker to stop")
    record(
        "node revoked through the other server of two (PostgreSQL)",
        worker_stopped_s=round(time.monotonic() - revoked, 2),
    )
    assert "revoked" in worker.log_tail(20_000)


def test_killing_one_server_mid_training_leaves_the_job_to_succeed_through_the_other(
    replicated: LocalCluster,
) -> None:
    with on(replicated, 1) as survivor:
        body = {
            "name": "outlives-a-server",
            "topology": {"num_machines": 2, "num_processes": 1},
            "max_steps_per_epoch": 6 * SMOKE_STEPS,
        }
        job_id = survivor.post("/jobs", json=body).raise_for_status().json()["id"]
        until(
            lambda: job(survivor, job_id)["progress"] is not None,
            120,
            "training to report progress",
        )
        # Server 0: the first worker's own, and the one that sweeps.
        killed = replicated.replica_processes[0]
        killed.process.send_signal(signal.SIGKILL)
        killed.stop()  # reaps it
        finished = until(
            lambda: (j := job(survivor, job_id))["status"] in ("succeeded", "failed") and j,
            180,
            "the job to end",
        )
    assert finished["status"] == "succeeded", finished["error"]
    assert len(finished["attempts"]) == 1, "the job restarted: a node was taken for lost"
    assert "this server sweeps now" in replicated.replica_processes[1].log_tail(1_000_000)
