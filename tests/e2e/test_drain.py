"""Drain and a worker's own shutdown, end to end (issue 28): three real
worker daemons, a real 2 x 1 gloo job on the real MNIST files. Draining
the node that runs machine 1 moves the job to the other two from the step
it stopped at; the drained node takes no new part until undrained. A
worker sent SIGTERM mid-job hands its part back the same way: the job
neither fails nor uses a restart."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from cli.cluster import LocalCluster
from tests.e2e.conftest import Jobs, record, until

JOB = {"epochs": 1, "batch_size": 64, "max_steps_per_epoch": 150, "seed": 7}


@pytest.fixture(scope="module")
def cluster(
    mnist_dir: Path, tmp_path_factory: pytest.TempPathFactory, script_dir: Path
) -> Iterator[LocalCluster]:
    with LocalCluster(
        state_dir=tmp_path_factory.mktemp("drain"),
        data_dir=mnist_dir,
        workers=3,
        worker_args=["--script-dir", str(script_dir)],
    ) as running:
        yield running


@pytest.fixture
def jobs(cluster: LocalCluster) -> Iterator[Jobs]:
    with cluster.client("admin") as client:
        yield Jobs(client)


def running_at_step(jobs: Jobs, step: int, **spec: Any) -> dict[str, Any]:
    job_id = jobs.submit(machines=2, **(spec or JOB))
    return jobs.wait(
        job_id,
        lambda j: j["status"] == "running" and ((j["progress"] or {}).get("batch") or 0) >= step,
        120,
        f"step {step}",
    )


def machine_1_node(job: dict[str, Any]) -> str:
    name: str = next(p["node_name"] for p in job["parts"] if p["machine_id"] == 1)
    return name


def nodes(jobs: Jobs) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in jobs.client.get("/nodes").json()["data"]}


@pytest.mark.timeout(300)
def test_draining_machine_1s_node_moves_the_job_from_its_step_and_the_node_takes_no_part(
    jobs: Jobs,
) -> None:
    job = running_at_step(jobs, 20)
    drained = machine_1_node(job)
    node_id = nodes(jobs)[drained]["id"]
    asked = time.monotonic()
    answer = jobs.client.post(f"/nodes/{node_id}/drain", json={"deadline_s": 0})
    assert answer.status_code == 200, answer.text
    moved = jobs.wait(
        job["id"],
        lambda j: j["status"] == "running" and len(j["attempts"]) == 2,
        120,
        "the job to start again",
    )
    moved_s = time.monotonic() - asked
    first, second = moved["attempts"]
    step = first["stopped_at_step"]
    assert step is not None and step >= 20, first
    assert first["ended"] == f"drained (node {drained}), stopped after step {step}"
    assert second["resumed_from_step"] == step
    assert drained not in {p["node_name"] for p in moved["parts"]}
    assert nodes(jobs)[drained]["parts"] == []

    # The drained node is the only one free: a new job waits for it.
    waiting = jobs.submit(machines=1, **JOB)
    assert jobs.get(waiting)["status"] == "queued"
    assert nodes(jobs)[drained]["drain"]["reason"] == "drained"

    done = jobs.wait_done(job["id"], 240)
    assert done["status"] == "succeeded" and len(done["attempts"]) == 2, done
    # The waiting job took one of the nodes the moved job left, not the drained one.
    ran = jobs.wait(waiting, lambda j: j["status"] != "queued", 60, "the waiting job to start")
    assert ran["parts"][0]["node_name"] != drained
    jobs.client.post(f"/jobs/{waiting}/cancel").raise_for_status()
    undrained = jobs.client.post(f"/nodes/{node_id}/undrain").json()
    assert undrained["drain"] is None
    record("drain", drain_to_restart_s=round(moved_s, 2), stopped_at_step=step)


# A script job's ranks are the script's own processes (python -m worker.script_rank).
SCRIPT_JOB = {
    "script": {"path": "torchrun_mlp.py", "args": ["--epochs", "1", "--steps-per-epoch", "3000"]},
    "seed": 7,
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["trainer", "script"])
def test_sigterm_to_every_process_of_a_worker_at_once_still_hands_the_part_back(
    jobs: Jobs, cluster: LocalCluster, kind: str
) -> None:
    """What Slurm does at scancel and before the walltime (every process of
    the step) and systemd at ``systemctl stop`` (every process of the unit):
    the ranks get the SIGTERM too, and must leave the stop to their worker
    (worker/shield.py) rather than die of it and fail the job."""
    job = running_at_step(jobs, 20, **(SCRIPT_JOB if kind == "script" else {}))
    leaving = machine_1_node(job)
    worker = next(w for w in cluster.worker_processes if w.name == leaving)
    everyone = [psutil.Process(worker.process.pid)]
    everyone += everyone[0].children(recursive=True)
    assert len(everyone) >= 3, everyone  # the daemon, its fork server, a launcher, ranks
    for process in everyone:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGTERM)
    assert worker.process.wait(60) == 0
    stopped = jobs.wait(job["id"], lambda j: len(j["attempts"]) == 2, 120, "the job to start again")
    first = stopped["attempts"][0]
    step = first["stopped_at_step"]
    assert first["ended"] == f"node leaving (node {leaving}), stopped after step {step}", first
    assert first["error"] is None and step is not None and step >= 20
    # Back to three workers for the next test.
    worker.stop()  # exited: this closes its log
    cluster.worker_processes.remove(worker)
    cluster.start_worker(leaving)
    until(
        lambda: nodes(jobs)[leaving]["state"] == "live" and nodes(jobs)[leaving]["drain"] is None,
        60,
        f"{leaving} back",
    )
    jobs.client.post(f"/jobs/{job['id']}/cancel")
    until(lambda: not any(n["parts"] for n in nodes(jobs).values()), 60, "idle nodes")


@pytest.mark.timeout(300)
def test_a_worker_sent_sigterm_mid_job_hands_its_part_back_at_a_step(
    jobs: Jobs, cluster: LocalCluster
) -> None:
    """Last in this module: it leaves the cluster one worker short."""
    job = running_at_step(jobs, 20)
    leaving = machine_1_node(job)
    worker = next(w for w in cluster.worker_processes if w.name == leaving)
    sent = time.monotonic()
    worker.process.send_signal(signal.SIGTERM)
    assert worker.process.wait(60) == 0  # it waited for its part to stop, then exited
    exited_s = time.monotonic() - sent
    done = jobs.wait_done(job["id"], 240)
    assert done["status"] == "succeeded", done
    first, second = done["attempts"]
    step = first["stopped_at_step"]
    assert first["ended"] == f"node leaving (node {leaving}), stopped after step {step}"
    assert first["error"] is None and second["resumed_from_step"] == step
    assert done["spec"]["max_restarts"] == 0  # and none was needed
    assert leaving not in {p["node_name"] for p in done["parts"]}
    record("sigterm", worker_exit_s=round(exited_s, 2), stopped_at_step=step)
