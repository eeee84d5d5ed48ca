"""The ``ddpo`` command against a real server and workers, as a user runs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from typing import Any

from cli.cluster import LocalCluster
from tests.conftest import REPO
from tests.e2e.conftest import Jobs


def ddpo(
    cluster: LocalCluster, *args: str, timeout_s: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=REPO,
        env={**os.environ, **cluster.cli_env()},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_submit_wait_shows_a_moving_progress_bar_and_exits_0(cluster: LocalCluster) -> None:
    done = ddpo(cluster, "submit", "--wait", "--max-steps-per-epoch", "120", "--epochs", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    bars = re.findall(r"\[[#-]{30}\]\s+([\d.]+)%", done.stdout)
    assert len(set(bars)) >= 3, done.stdout  # it moved
    assert [float(b) for b in bars] == sorted(float(b) for b in bars)
    assert "loss" in done.stdout and "ETA" in done.stdout
    assert re.search(r"test accuracy \d+\.\d+%", done.stdout), done.stdout


def test_submit_wait_on_a_failing_job_exits_1_with_the_error(cluster: LocalCluster) -> None:
    done = ddpo(cluster, "submit", "--wait", "--trainer", "crash", "--machines", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "error (rank_failed)" in done.stdout
    assert "ValueError: injected failure on rank 1" in done.stdout


def test_submit_rejects_a_bad_spec_naming_the_field(cluster: LocalCluster) -> None:
    done = ddpo(cluster, "submit", "--processes", "0")
    assert done.returncode != 0
    assert "topology.num_processes" in done.stderr
    done = ddpo(cluster, "submit", "--performance", '{"channels_last": "sideways"}')
    assert done.returncode != 0
    assert "performance.channels_last" in done.stderr


def test_submit_carries_the_whole_spec(cluster: LocalCluster, jobs: Jobs) -> None:
    done = ddpo(
        cluster,
        "submit",
        "--json",
        "--name=spec-check",
        "--processes=2",
        "--batch-size=64",
        "--epochs=2",
        "--lr=0.25",
        "--seed=7",
        "--max-steps-per-epoch=3",
        "--max-restarts=2",
        "--max-run-seconds=600",
        "--idempotency-key=spec-check-1",
        '--performance={"channels_last": false, "same_host_allreduce": "gloo"}',
    )
    assert done.returncode == 0, done.stderr
    spec = json.loads(done.stdout)["spec"]
    assert (spec["max_restarts"], spec["max_run_seconds"]) == (2, 600)
    assert spec["topology"] == {"num_machines": 1, "num_processes": 2}
    assert (spec["batch_size"], spec["epochs"], spec["lr"], spec["seed"]) == (64, 2, 0.25, 7)
    assert spec["performance"]["channels_last"] is False
    assert spec["performance"]["same_host_allreduce"] == "gloo"
    assert jobs.wait_done(json.loads(done.stdout)["id"])["status"] == "succeeded"


def test_logs_of_a_finished_job_are_rank_0s_lines(cluster: LocalCluster, jobs: Jobs) -> None:
    job_id = jobs.submit(processes=2, batch_size=64, max_steps_per_epoch=25)
    assert jobs.wait_done(job_id)["status"] == "succeeded"

    done = ddpo(cluster, "logs", str(job_id), "--rank", "0")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    epochs = [line for line in lines if line.startswith("Train Epoch: 1 [")]
    assert len(epochs) == 4  # every 10 batches and the last one: 1, 11, 21, 25
    assert lines[-1].startswith("Test set: average loss")

    # All of them, each labelled with where it came from; and only the tail.
    every = ddpo(cluster, "logs", str(job_id)).stdout.splitlines()
    assert all(re.match(r"\[m0 (rank [01]|launcher)\] ", line) for line in every), every
    assert ddpo(cluster, "logs", str(job_id), "--rank", "0", "--tail", "1").stdout == (
        lines[-1] + "\n"
    )


def test_logs_follow_streams_a_running_job(cluster: LocalCluster, jobs: Jobs) -> None:
    job_id = jobs.submit(max_steps_per_epoch=300)
    jobs.wait(job_id, lambda j: j["status"] == "running", 60, "the job to start")
    with subprocess.Popen(
        [sys.executable, "-m", "cli", "logs", str(job_id), "--rank", "0", "--follow"],
        cwd=REPO,
        env={**os.environ, **cluster.cli_env()},
        stdout=subprocess.PIPE,
        text=True,
    ) as follower:
        try:
            assert follower.stdout is not None
            first = follower.stdout.readline()
            assert first.startswith("Train Epoch: 1 ["), first
            # The line came while the job was still training: it was streamed.
            assert jobs.get(job_id)["status"] == "running"
            rest = follower.stdout.read()  # until the stream ends with the job
            assert follower.wait(timeout=120) == 0
        finally:
            follower.kill()
    assert jobs.get(job_id)["status"] == "succeeded"
    assert rest.splitlines()[-1].startswith("Test set: average loss")


def test_list_show_nodes_and_cancel(cluster: LocalCluster, jobs: Jobs) -> None:
    job_id = jobs.submit(name="cli-check")  # a whole epoch: long enough to cancel
    jobs.wait(job_id, lambda j: j["status"] == "running", 60, "the job to start")

    listed: dict[str, Any] = json.loads(ddpo(cluster, "list", "--json").stdout)
    assert job_id in [j["id"] for j in listed["data"]]
    table = ddpo(cluster, "list", "--status", "running").stdout
    assert re.search(rf"^\s*{job_id}\s+running\s+1 x 1 .* cli-check$", table, re.M), table

    shown = json.loads(ddpo(cluster, "show", str(job_id), "--json").stdout)
    assert shown["id"] == job_id and shown["name"] == "cli-check"
    nodes = ddpo(cluster, "nodes").stdout
    assert re.search(rf"node-\d .* live .* job {job_id} m0 \(running\)", nodes), nodes

    cancelled = ddpo(cluster, "cancel", str(job_id))
    assert cancelled.returncode == 0
    assert re.match(rf"job {job_id} (cancelling|cancelled)", cancelled.stdout)
    deadline = time.monotonic() + 10
    while jobs.get(job_id)["status"] != "cancelled":
        assert time.monotonic() < deadline, "not cancelled within 10 s"
        time.sleep(0.2)
    missing = ddpo(cluster, "show", "999999")
    assert missing.returncode != 0 and "job 999999 not found" in missing.stderr
