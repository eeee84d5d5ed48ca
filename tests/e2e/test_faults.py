"""Fault injection on a real cluster: a rank killed, a node killed, the server
killed, a node frozen, a deadline. Each test records what it measured in
test-artifacts/reliability.jsonl (RELIABILITY.md quotes them)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest

from cli.cluster import LocalCluster, ManagedProcess
from tests.e2e.conftest import Jobs, record, still_running, training_processes, until

pytestmark = pytest.mark.e2e


# Long enough epochs that a kill lands mid-epoch after a checkpoint.
EPOCH_STEPS = 120


@pytest.fixture(scope="module")
def faulty(mnist_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two nodes of their own: these tests kill servers and daemons."""
    with LocalCluster(
        state_dir=tmp_path_factory.mktemp("faults"),
        data_dir=mnist_dir,
        workers=2,
        # Retries in the tests should not wait long.
        server_env={"DDPO_RETRY_BACKOFF_S": "0.5"},
    ) as running:
        yield running


@pytest.fixture
def jobs(faulty: LocalCluster) -> Iterator[Jobs]:
    with faulty.client() as client:
        yield Jobs(client)
        for job in client.get("/jobs", params={"limit": 500}).json()["data"]:
            if job["status"] in ("queued", "running"):
                client.post(f"/jobs/{job['id']}/cancel")
        until(
            lambda: not any(n["parts"] for n in client.get("/nodes").json()["data"]),
            30,
            "idle nodes",
        )


def daemon(cluster: LocalCluster, name: str) -> ManagedProcess:
    """The live daemon of this node (a restarted one replaces the old)."""
    return [w for w in cluster.worker_processes if w.name == name][-1]


def rank_process(processes: list[psutil.Process], rank: int) -> psutil.Process:
    """The process whose stdout is this rank's log."""
    for process in processes:
        try:
            if os.readlink(f"/proc/{process.pid}/fd/1").endswith(f"rank-{rank}.log"):
                return process
        except OSError:
            continue
    raise AssertionError(f"no process writes rank-{rank}.log among {processes}")


def kill_tree(process: psutil.Process) -> None:
    for p in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def progress_rows(cluster: LocalCluster, job_id: int) -> list[tuple[int, int, int, int]]:
    """(attempt id, seq, epoch, batch) of every progress row, from the file."""
    with sqlite3.connect(cluster.database_path) as db:
        return list(
            db.execute(
                "SELECT attempt_id, seq, epoch, batch FROM progress WHERE job_id = ? "
                "ORDER BY attempt_id, seq",
                (job_id,),
            )
        )


def test_a_killed_rank_fails_fast_and_the_retry_resumes_from_the_checkpoint(
    jobs: Jobs, faulty: LocalCluster
) -> None:
    job_id = jobs.submit(
        machines=2, epochs=3, max_steps_per_epoch=EPOCH_STEPS, max_restarts=1, seed=3
    )
    job = jobs.wait(
        job_id,
        lambda j: j["checkpoint"] is not None and (j["progress"] or {}).get("epoch") == 2,
        180,
        "the first checkpoint and the second epoch",
    )
    checkpoint_at_kill = job["checkpoint"]["epoch"]
    processes = training_processes(faulty)
    everything = [p for below in processes.values() for p in below]
    victim = rank_process(everything, rank=1)
    victim.kill()
    killed_at = time.monotonic()

    left_running = jobs.wait(job_id, lambda j: j["status"] != "running", 10, "leaving running")
    left_s = time.monotonic() - killed_at
    until(lambda: still_running(everything) == [], 10, "every old rank and launcher to exit")
    all_gone_s = time.monotonic() - killed_at
    assert left_running["status"] == "queued", left_running  # waiting for its restart

    done = jobs.wait_done(job_id, timeout_s=180)
    assert done["status"] == "succeeded", done["error"]
    first, second = done["attempts"]
    assert first["error"]["reason"] == "rank_exited" and first["error"]["rank"] == 1
    assert "SIGKILL" in first["error"]["message"]
    # At most the epoch in progress was lost: the retry began where the last
    # whole checkpoint ended.
    assert second["resumed_from_epoch"] == checkpoint_at_kill
    assert done["result"]["test_accuracy"] > 0.9
    record(
        "kill -9 one rank, max_restarts=1",
        job_left_running_s=round(left_s, 2),
        every_other_process_gone_s=round(all_gone_s, 2),
        resumed_from_epoch=second["resumed_from_epoch"],
        epoch_at_kill=job["progress"]["epoch"],
        result="succeeded",
    )


def test_a_killed_node_is_lost_and_its_peers_stopped(jobs: Jobs, faulty: LocalCluster) -> None:
    job_id = jobs.submit(machines=2)  # a whole epoch: far longer than the test
    job = jobs.wait(job_id, lambda j: j["progress"] is not None, 120, "training")
    processes = training_processes(faulty)
    everything = [p for below in processes.values() for p in below]
    victim = job["parts"][1]["node_name"]
    killed = daemon(faulty, victim)
    kill_tree(psutil.Process(killed.process.pid))
    killed_at = time.monotonic()
    killed.stop()  # reaps it

    # The surviving peer's collective breaks at once and its ranks end...
    until(lambda: still_running(everything) == [], 15, "no rank left anywhere")
    gone_s = time.monotonic() - killed_at
    # ... but "peer_failure" is a symptom: the job fails once the node's
    # heartbeats are overdue and its part is lost, naming that as the cause.
    failed = jobs.wait(job_id, lambda j: j["status"] == "failed", 15 - gone_s, "the job to fail")
    failed_s = time.monotonic() - killed_at
    assert failed["error"]["reason"] == "node_lost", failed["error"]
    assert failed["error"]["node"] == victim
    nodes = {n["name"]: n["state"] for n in jobs.client.get("/nodes").json()["data"]}
    assert nodes[victim] == "lost"
    record(
        "kill -9 a worker daemon and its ranks (2-machine job)",
        every_rank_gone_s=round(gone_s, 2),
        job_failed_naming_the_lost_node_s=round(failed_s, 2),
    )

    # The node comes back under its name and takes work again.
    faulty.start_worker(victim)
    faulty.wait_for_nodes(2)
    again = jobs.submit(machines=2, max_steps_per_epoch=5)
    assert jobs.wait_done(again)["status"] == "succeeded"


def test_the_server_killed_mid_training_loses_nothing(jobs: Jobs, faulty: LocalCluster) -> None:
    job_id = jobs.submit(machines=2, epochs=2, max_steps_per_epoch=EPOCH_STEPS)
    jobs.wait(job_id, lambda j: j["progress"] is not None, 120, "training")
    assert faulty.server is not None
    faulty.server.process.send_signal(signal.SIGKILL)
    faulty.server.stop()  # reaps it
    down_at = time.monotonic()
    until(lambda: time.monotonic() - down_at > 3, 5, "the workers to miss the server")
    faulty.start_server()  # same port, same database file
    restarted_s = time.monotonic() - down_at

    done = jobs.wait_done(job_id, timeout_s=180)
    assert done["status"] == "succeeded", done["error"]
    assert len(done["attempts"]) == 1
    # Every report rank 0 wrote is in the database once, in order.
    rows = progress_rows(faulty, job_id)
    run_dir = next(faulty.state_dir.glob(f"node-*/runs/job-{job_id}/attempt-*-machine-0"))
    written = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    assert [(seq, epoch, batch) for _, seq, epoch, batch in rows] == [
        (r["seq"], r["epoch"], r["batch"]) for r in written
    ]
    record(
        "kill -9 the server mid-training, restart it",
        server_down_s=round(restarted_s, 2),
        progress_reports_written=len(written),
        progress_rows_stored=len(rows),
        result="succeeded",
    )


def test_a_frozen_node_is_replaced_and_its_stale_ranks_die(
    jobs: Jobs, faulty: LocalCluster
) -> None:
    job_id = jobs.submit(epochs=2, max_steps_per_epoch=EPOCH_STEPS * 4, max_restarts=1)
    job = jobs.wait(job_id, lambda j: j["progress"] is not None, 120, "training")
    frozen = job["parts"][0]["node_name"]
    stale = training_processes(faulty)[frozen]
    assert stale, "nothing runs on the node"
    psutil.Process(
        daemon(faulty, frozen).process.pid
    ).suspend()  # SIGSTOP: a partition, as the server sees it
    stopped_at = time.monotonic()
    try:
        moved = jobs.wait(
            job_id,
            lambda j: j["attempt"] == 2 and j["status"] == "running",
            20,
            "the job to restart elsewhere",
        )
        moved_s = time.monotonic() - stopped_at
        assert moved["parts"][0]["node_name"] != frozen
        assert moved["attempts"][0]["error"]["reason"] == "node_lost"
        first = attempt_id(faulty, job_id, number=1)
        first_attempt_rows = [r for r in progress_rows(faulty, job_id) if r[0] == first]
    finally:
        psutil.Process(daemon(faulty, frozen).process.pid).resume()
    resumed_at = time.monotonic()
    until(lambda: still_running(stale) == [], 10, "the stale ranks to be stopped")
    stale_gone_s = time.monotonic() - resumed_at

    done = jobs.wait_done(job_id, timeout_s=240)
    assert done["status"] == "succeeded", done["error"]
    # The thawed node's buffered reports were refused: the old attempt's rows
    # are what they were when it was given up.
    after = [r for r in progress_rows(faulty, job_id) if r[0] == first]
    assert after == first_attempt_rows
    record(
        "SIGSTOP a worker daemon (1-machine job, max_restarts=1), SIGCONT later",
        restarted_on_another_node_s=round(moved_s, 2),
        stale_ranks_gone_after_resume_s=round(stale_gone_s, 2),
        old_attempt_rows_after_resume=len(after) - len(first_attempt_rows),
    )


def attempt_id(cluster: LocalCluster, job_id: int, number: int) -> int:
    with sqlite3.connect(cluster.database_path) as db:
        row = db.execute(
            "SELECT id FROM attempt WHERE job_id = ? AND number = ?", (job_id, number)
        ).fetchone()
    assert row is not None, f"job {job_id} has no attempt {number}"
    found: int = row[0]
    return found


def test_a_deadline_stops_every_rank_without_a_retry(jobs: Jobs, faulty: LocalCluster) -> None:
    job_id = jobs.submit(machines=2, max_run_seconds=6, max_restarts=2)
    jobs.wait(job_id, lambda j: j["progress"] is not None, 120, "training")
    processes = [p for below in training_processes(faulty).values() for p in below]
    done = jobs.wait_done(job_id, timeout_s=30)
    ended_at = time.monotonic()
    assert done["status"] == "failed" and done["error"]["reason"] == "deadline"
    until(lambda: still_running(processes) == [], 10, "every rank to stop")
    started = datetime.fromisoformat(done["timing"]["started_at"])
    finished = datetime.fromisoformat(done["timing"]["finished_at"])
    record(
        "max_run_seconds=6 on a 2-machine job",
        failed_after_start_s=round((finished - started).total_seconds(), 2),
        ranks_gone_after_failure_seen_s=round(time.monotonic() - ended_at, 2),
        attempts=len(done["attempts"]),
    )
    assert len(done["attempts"]) == 1


def test_the_server_killed_mid_sweep_loses_and_repeats_no_trial(
    jobs: Jobs, faulty: LocalCluster
) -> None:
    body = {
        "name": "through a kill",
        "spec": {"epochs": 2, "max_steps_per_epoch": EPOCH_STEPS},
        "space": {"lr": {"type": "float", "low": 0.1, "high": 2, "log": True}},
        "max_trials": 5,
        "max_concurrent": 2,
        "sampler": {"kind": "random", "seed": 11},
        "pruner": {"kind": "none"},
    }
    sweep_id = jobs.client.post("/sweeps", json=body).raise_for_status().json()["id"]

    def training() -> bool:
        sweep = jobs.client.get(f"/sweeps/{sweep_id}").json()
        return any(jobs.get(t["job_id"])["progress"] for t in sweep["trials"])

    until(training, 120, "a trial to train")
    assert faulty.server is not None
    faulty.server.process.send_signal(signal.SIGKILL)
    faulty.server.stop()  # reaps it
    faulty.start_server()  # same port, same database file

    def ended() -> dict[str, Any] | None:
        sweep: dict[str, Any] = jobs.client.get(f"/sweeps/{sweep_id}").json()
        return sweep if sweep["status"] != "running" else None

    sweep = until(ended, 300, "the sweep to end")
    assert sweep["status"] == "succeeded"
    trials = sweep["trials"]
    assert [t["number"] for t in trials] == list(range(5))
    assert [t["state"] for t in trials] == ["succeeded"] * 5
    assert len({t["job_id"] for t in trials}) == 5
    # Each trial ran once: one job per trial, one attempt per job.
    named = [
        j
        for j in jobs.client.get("/jobs", params={"limit": 500}).json()["data"]
        if (j["name"] or "").startswith("through a kill: trial")
    ]
    assert sorted(j["id"] for j in named) == sorted(t["job_id"] for t in trials)
    assert all(len(jobs.get(t["job_id"])["attempts"]) == 1 for t in trials)
    # Those asked after the restart are those the sweep's seed gives anyway.
    again = jobs.client.post("/sweeps", json={**body, "max_concurrent": 5}).json()
    assert [t["params"] for t in again["trials"]] == [t["params"] for t in trials]
    jobs.client.post(f"/sweeps/{again['id']}/cancel").raise_for_status()
