"""The small things a newcomer trips on, each as a user meets it at the
terminal: Ctrl-C on ``submit --wait`` says the job goes on and how to cancel
it; ``cancel`` takes several ids; a job wanting more machines than there are
live nodes says so; ``keys`` alone lists them; an error names its command
once; a mistyped ``--performance`` key gets the nearest known one; ``model``
fetches a job's model."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cli.cluster import LocalCluster
from tests.conftest import REPO
from tests.e2e.conftest import Jobs

pytestmark = pytest.mark.e2e


def ddpo(
    cluster: LocalCluster, *args: str, role: str = "user", timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    assert cluster.tokens is not None
    env = {**os.environ, **cluster.cli_env(), "DDPO_TOKEN": getattr(cluster.tokens, role)}
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_ctrl_c_on_submit_wait_leaves_the_job_and_says_how_to_cancel_it(
    cluster: LocalCluster, jobs: Jobs
) -> None:
    assert cluster.tokens is not None
    env = {**os.environ, **cluster.cli_env()}
    # Three machines on two nodes: it waits, and says why.
    with subprocess.Popen(
        [sys.executable, "-m", "cli", "submit", "--wait", "--machines", "3"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as waiting:
        try:
            assert waiting.stdout is not None
            first = waiting.stdout.readline()
            job_id = int(re.match(r"submitted job (\d+)", first).group(1))  # type: ignore[union-attr]
            waiting_line = waiting.stdout.readline()
            waiting.send_signal(signal.SIGINT)
            _, err = waiting.communicate(timeout=30)
        finally:
            waiting.kill()
    assert waiting.returncode == 130, err
    assert "Traceback" not in err, err
    assert f"`ddpo cancel {job_id}`" in err and "goes on" in err, err
    assert "needs 3 live node(s)" in waiting_line and "2 of 2 live" in waiting_line, waiting_line
    job = jobs.get(job_id)
    assert job["status"] == "queued" and "queued behind" not in job["pending_reason"], job


def test_cancel_takes_several_ids_and_cancels_those_it_can(
    cluster: LocalCluster, jobs: Jobs
) -> None:
    first, second = (jobs.submit(machines=3, name=f"never-{i}") for i in (1, 2))
    done = ddpo(cluster, "cancel", str(first), "999999", str(second))
    assert done.returncode == 1, done.stderr
    assert f"job {first} cancelled" in done.stdout and f"job {second} cancelled" in done.stdout
    assert "ddpo cancel job 999999: job 999999 not found" in done.stderr, done.stderr
    assert "1 of 3 job(s) not cancelled" in done.stderr
    assert {jobs.get(first)["status"], jobs.get(second)["status"]} == {"cancelled"}


def test_keys_alone_lists_them(cluster: LocalCluster) -> None:
    made = ddpo(cluster, "keys", "create", "papercut-alice", role="admin")
    assert made.returncode == 0, made.stderr
    listed = ddpo(cluster, "keys", role="admin")
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"papercut-alice\s+user", listed.stdout), listed.stdout


def test_an_error_names_its_command_once_and_a_slip_gets_a_suggestion(
    cluster: LocalCluster,
) -> None:
    done = ddpo(cluster, "submit", "--performance", '{"channel_last": true}')
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("ddpo submit: performance.channel_last: "), line
    assert "submit: submit" not in line and "(did you mean channels_last?)" in line, line


def test_model_downloads_a_jobs_model_that_loads(
    cluster: LocalCluster, jobs: Jobs, tmp_path: Path
) -> None:
    job_id = jobs.submit(name="model", max_steps_per_epoch=20)
    assert jobs.wait_done(job_id)["status"] == "succeeded"
    target = tmp_path / "m.pt"
    done = ddpo(cluster, "model", str(job_id), "-o", str(target))
    assert done.returncode == 0, done.stderr
    assert f"job {job_id}'s model: {target}" in done.stdout
    state = torch.load(target, weights_only=False)["model"]
    assert "conv1.weight" in state
    here = ddpo(cluster, "model", "999999")
    assert here.returncode == 1 and "job 999999 not found" in here.stderr
    assert not list(REPO.glob("*job-999999.pt*")), "a refused download leaves no file"
