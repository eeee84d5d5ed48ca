"""Users' own training on real workers: torchrun-style scripts from the
workers' --script-dir, with their progress, metrics, failures and
checkpoints. (The example trainer package is tested with the dashboard, in
test_dashboard.py; scripts across test hosts in test_multihost.py.)"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil

from cli.cluster import LocalCluster
from tests.e2e.conftest import Jobs, rank_processes, until
from tests.e2e.test_cli import ddpo


def test_a_script_runs_as_a_1x2_job_with_torchruns_environment_and_its_reports(
    jobs: Jobs,
) -> None:
    job_id = jobs.submit(
        processes=2,
        script={"path": "torchrun_mlp.py", "args": ["--epochs", "2", "--steps-per-epoch", "20"]},
    )
    job = jobs.wait_done(job_id, timeout_s=120)
    assert job["status"] == "succeeded", job["error"]
    progress = job["progress"]
    assert (progress["epoch"], progress["batch"], progress["step"]) == (2, 20, 40)
    assert progress["percent"] == 100
    assert 0 <= progress["metrics"]["accuracy"] <= 1
    # Its checkpoint directory became the job's checkpoint.
    assert job["checkpoint"]["epoch"] == 2

    logs = jobs.client.get(f"/jobs/{job_id}/logs").raise_for_status().json()["lines"]
    said = {(line["rank"], line["text"]) for line in logs}
    assert (0, "rank 0 of 2 (local 0, machine 0): epochs 1..2") in said
    assert (1, "rank 1 of 2 (local 1, machine 0): epochs 1..2") in said


def test_a_script_that_raises_fails_the_job_with_rank_failed_and_its_traceback(
    jobs: Jobs,
) -> None:
    job_id = jobs.submit(processes=2, script={"path": "tests/raises.py"}, max_restarts=2)
    job = jobs.wait_done(job_id, timeout_s=120)
    assert job["status"] == "failed"
    error = job["error"]
    assert error["reason"] == "rank_failed", error
    assert error["rank"] == 1
    # 1 (the exception), or -6 when gloo's teardown aborted the rank on its
    # way out while its peer still waited in the barrier (a few runs in a
    # hundred on a busy host): the exception is the cause either way.
    assert error["exit_code"] in (1, -6), error
    assert "ValueError: shard 1 of 2 has no labels" in error["traceback_tail"]
    # The traceback, down to the line that raised.
    assert "Traceback (most recent call last)" in error["traceback_tail"]
    assert ", in check_shard" in error["traceback_tail"]
    assert 'raise ValueError(f"shard {rank} of {world} has no labels")' in error["traceback_tail"]
    # The script's own failure: never retried (what each attempt ended with, if it was).
    assert len(job["attempts"]) == 1, [a["error"] for a in job["attempts"]]
    assert job["progress"]["metrics"] == {"ranks_met": 2.0}


def test_a_script_rank_that_raised_names_the_cause_though_its_part_was_stopped_first(
    jobs: Jobs,
) -> None:
    """Its peer on the other machine lost it at once and reported that
    symptom first; this rank's part was stopped while the rank lingered.
    The rank recorded its exception before exiting (worker/script_rank.py)."""
    job_id = jobs.submit(machines=2, processes=1, script={"path": "tests/raises_then_lingers.py"})
    job = jobs.wait_done(job_id, timeout_s=120)
    assert job["status"] == "failed"
    error = job["error"]
    assert (error["reason"], error["rank"], error["machine_id"]) == ("rank_failed", 1, 1), error
    assert "ValueError: shard 1 of 2 has no labels" in error["traceback_tail"]
    assert [p["status"] for p in job["parts"]] == ["failed", "failed"], job["parts"]


def test_a_script_killed_by_a_signal_resumes_from_its_checkpoint_directory(
    jobs: Jobs, cluster: LocalCluster
) -> None:
    job_id = jobs.submit(
        processes=2,
        max_restarts=1,
        script={
            "path": "torchrun_mlp.py",
            "args": ["--epochs", "3", "--steps-per-epoch", "20", "--step-seconds", "0.05"],
        },
    )
    mid_run = jobs.wait(
        job_id,
        lambda j: (j["checkpoint"] or {}).get("epoch") == 1,
        60,
        "the checkpoint of epoch 1",
    )
    # Percent done counts against the epochs the script said it runs (3).
    assert 33 <= mid_run["progress"]["percent"] < 100, mid_run["progress"]
    (victim,) = until(
        lambda: [
            p for p in rank_processes(cluster) if _runs(p, "torchrun_mlp.py") and _rank(p) == "1"
        ],
        10,
        "rank 1's interpreter",
    )
    victim.send_signal(signal.SIGKILL)  # as the OOM killer would

    job = jobs.wait_done(job_id, timeout_s=120)
    assert job["status"] == "succeeded", job["error"]
    first, second = job["attempts"]
    assert first["error"]["reason"] == "rank_exited"
    assert "killed by SIGKILL" in first["error"]["message"]
    assert second["resumed_from_epoch"] >= 1
    resumed = second["resumed_from_epoch"]
    logs = jobs.client.get(f"/jobs/{job_id}/logs").raise_for_status().json()["lines"]
    texts = [line["text"] for line in logs if line["rank"] == 0]
    assert "rank 0 of 2 (local 0, machine 0): epochs 1..3" in texts
    assert f"rank 0 of 2 (local 0, machine 0): epochs {resumed + 1}..3" in texts
    assert job["checkpoint"]["epoch"] == 3


def _runs(process: psutil.Process, script: str) -> bool:
    try:
        return any(Path(arg).name == script for arg in process.cmdline())
    except psutil.Error:
        return False


def _rank(process: psutil.Process) -> str | None:
    try:
        return process.environ().get("RANK")
    except psutil.Error:
        return None


def test_the_cli_lists_what_nodes_offer_and_submits_scripts_and_params(
    cluster: LocalCluster,
) -> None:
    listed = ddpo(cluster, "trainers")
    assert listed.returncode == 0, listed.stderr
    (charlm,) = [line for line in listed.stdout.splitlines() if line.startswith("charlm ")]
    assert "0.2.0" in charlm and "context=8" in charlm and "node-0, node-1" in charlm
    assert any(line.startswith("torchrun_mlp.py ") for line in listed.stdout.splitlines())

    refused = ddpo(cluster, "submit", "--trainer", "charlm", "--param", "context=0")
    assert refused.returncode == 1
    assert "params.context: 0 is less than the minimum of 1" in refused.stderr

    done = ddpo(
        cluster,
        "submit",
        "--wait",
        "--processes",
        "2",
        "--script",
        "torchrun_mlp.py",
        "--script-args",
        "--epochs 1 --steps-per-epoch 10",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "succeeded" in done.stdout


def test_a_scripts_ranks_see_no_node_secret(jobs: Jobs, cluster: LocalCluster) -> None:
    """Ranks run a job's code (and whatever it imports): their environment
    holds no DDPO_ variable of the daemon's (the join token enrols nodes),
    only the three ddpo sets for scripts, and the node's credential file
    reads as empty to them."""
    credentials = [
        cluster.state_dir / worker.name / "runs.node-credential"
        for worker in cluster.worker_processes
    ]
    for path in credentials:
        assert path.read_text().startswith("ddpo-node-"), path  # there, and the node's
    job_id = jobs.submit(script={"path": "tests/peeks.py", "args": [str(p) for p in credentials]})
    job = jobs.wait_done(job_id, timeout_s=120)
    assert job["status"] == "succeeded", job["error"]
    logs = jobs.client.get(f"/jobs/{job_id}/logs").raise_for_status().json()["lines"]
    said = [line["text"] for line in logs if line["rank"] == 0]
    assert "join token seen: False" in said, said
    assert "DDPO variables: DDPO_CHECKPOINT_DIR, DDPO_PRECISION, DDPO_RUN_DIR" in said, said
    (part,) = job["parts"]
    own = cluster.state_dir / part["node_name"] / "runs.node-credential"
    if os.geteuid() == 0:  # CI: masked by a mount namespace (elsewhere, by its mode alone)
        assert f"{own}: read 0 characters" in said, said
