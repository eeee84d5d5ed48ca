"""The ``ddpo`` command against a real server and workers, as a user runs it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cli.cluster import LocalCluster, free_port, port_free
from cli.local_cluster import KEPT_PORT
from tests.conftest import REPO
from tests.e2e.conftest import Jobs, until


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


def test_a_kept_local_cluster_is_found_by_the_cli_and_stops_on_ctrl_c(
    mnist_dir: Path, tmp_path: Path
) -> None:
    """``ddpo local-cluster --keep`` in one terminal; in another, ``ddpo``
    with neither DDPO_SERVER nor DDPO_TOKEN set uses it."""
    cluster_file = tmp_path / "cluster.json"
    clean = {k: v for k, v in os.environ.items() if k not in ("DDPO_SERVER", "DDPO_TOKEN")}
    env = {**clean, "DDPO_CLUSTER_FILE": str(cluster_file)}
    # README's examples say localhost:8000: the default, where it is free.
    port = [] if port_free(KEPT_PORT) else ["--port", str(free_port())]
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli",
            "local-cluster",
            "--keep",
            "--workers",
            "2",
            *port,
            "--data-dir",
            str(mnist_dir),
            "--state-dir",
            str(tmp_path / "state"),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as keeper:
        try:
            until(cluster_file.exists, 120, "the cluster file")
            kept = json.loads(cluster_file.read_text())
            assert oct(cluster_file.stat().st_mode & 0o777) == "0o600"
            if not port:
                assert kept["server"] == f"http://127.0.0.1:{KEPT_PORT}"

            def cli(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    [sys.executable, "-m", "cli", *args],
                    cwd=REPO,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )

            # A second cluster on the same state directory would share its
            # database and overwrite its tokens: refused, saying why.
            twin = cli("local-cluster", "--state-dir", str(tmp_path / "state"))
            assert twin.returncode != 0
            assert "is in use by the local cluster of process" in twin.stderr, twin.stderr
            nodes = cli("nodes")
            assert nodes.returncode == 0, nodes.stderr
            assert len(re.findall(r"node-\d .* live", nodes.stdout)) == 2, nodes.stdout
            done = cli("submit", "--wait", "--machines", "2", "--max-steps-per-epoch", "5")
            assert done.returncode == 0, done.stdout + done.stderr
            assert "succeeded" in done.stdout
            keeper.send_signal(signal.SIGINT)
            shown, _ = keeper.communicate(timeout=60)
        finally:
            keeper.kill()
    assert keeper.returncode == 0, shown
    assert "Traceback" not in shown
    assert not cluster_file.exists()
    gone = cli("nodes")
    assert gone.returncode == 1 and "cannot reach the server" in gone.stderr


def test_a_one_shot_local_cluster_prints_the_jobs_json(mnist_dir: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "local-cluster",
            "--json",
            "--max-steps-per-epoch",
            "5",
            "--data-dir",
            str(mnist_dir),
            "--state-dir",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    job = json.loads(done.stdout)  # stdout is the JSON alone; the progress went to stderr
    assert job["status"] == "succeeded" and job["result"]["test_accuracy"] > 0
    assert "starting a server" in done.stderr


def test_a_local_cluster_runs_a_script_from_a_relative_script_dir(
    mnist_dir: Path, tmp_path: Path
) -> None:
    """``--script-dir`` (or DDPO_SCRIPT_DIR) relative to where the user is,
    not to where the workers run; a directory that is not there is said."""

    def local_cluster(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "cli",
                "local-cluster",
                "--json",
                "--data-dir",
                str(mnist_dir),
                "--state-dir",
                str(tmp_path / "state"),
                *args,
            ],
            cwd=REPO,
            env={**{k: v for k, v in os.environ.items() if k != "DDPO_SCRIPT_DIR"}, **env},
            capture_output=True,
            text=True,
            timeout=180,
        )

    script = ["--script", "torchrun_mlp.py", "--script-args", "--epochs 1 --steps-per-epoch 5"]
    done = local_cluster(*script, env={"DDPO_SCRIPT_DIR": "examples/scripts"})
    assert done.returncode == 0, done.stdout + done.stderr
    job = json.loads(done.stdout)
    assert job["status"] == "succeeded" and job["spec"]["script"]["path"] == "torchrun_mlp.py"
    missing = local_cluster("--script-dir", "no/such/dir", *script, env={})
    assert missing.returncode != 0
    assert "--script-dir: no/such/dir" in missing.stderr and "not a directory" in missing.stderr
