"""Checkpoints: written whole or not at all, and a run killed mid-training
continues from its last one to exactly where an unbroken run ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from ddpo.schemas import Assignment, JobSpec
from worker import runfiles
from worker._process import group_alive

SPEC = JobSpec(epochs=3, max_steps_per_epoch=40, seed=5)


def launch(
    run_dir: Path, data_dir: Path, resume_from: Path | None = None
) -> subprocess.Popen[bytes]:
    """Our launcher for machine 0 of a 1 x 1 job, with no server."""
    config = runfiles.LaunchConfig(
        assignment=Assignment(
            part_id=1, job_id=1, attempt_id=1, machine_id=0, spec=SPEC, master_addr="127.0.0.1"
        ),
        run_dir=run_dir,
        data_dir=data_dir,
        process_group_timeout_s=120,
        parent_pid=os.getpid(),
        resume_from=resume_from,
    )
    runfiles.write_launch(config)
    return subprocess.Popen(
        [sys.executable, "-m", "worker.launcher", str(run_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def final_state(run_dir: Path) -> dict[str, torch.Tensor]:
    latest = runfiles.latest_checkpoint(run_dir)
    assert latest is not None and latest[1] == SPEC.epochs
    state: dict[str, torch.Tensor] = torch.load(latest[0], weights_only=True)["model"]
    return state


def test_a_killed_run_resumes_from_its_last_checkpoint(tmp_path: Path, mnist_dir: Path) -> None:
    unbroken = tmp_path / "unbroken"
    assert launch(unbroken, mnist_dir).wait(120) == 0

    # Kill -9 the whole process group as soon as the first epoch is saved.
    broken = tmp_path / "broken"
    process = launch(broken, mnist_dir)
    deadline = time.monotonic() + 120
    while runfiles.latest_checkpoint(broken) is None:
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.005)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)
    while group_alive(process.pid):
        time.sleep(0.05)
    assert runfiles.read_result(broken) is None, "the run ended before it could be killed"

    # Whatever was on disk at the kill is a whole checkpoint.
    latest = runfiles.latest_checkpoint(broken)
    assert latest is not None
    checkpoint = torch.load(latest[0], weights_only=True)
    assert checkpoint["epoch"] == latest[1] < SPEC.epochs
    assert checkpoint["step"] == latest[1] * 40
    assert checkpoint["spec"] == SPEC.model_dump(mode="json")

    resumed = tmp_path / "resumed"
    assert launch(resumed, mnist_dir, resume_from=latest[0]).wait(120) == 0
    expected, got = final_state(unbroken), final_state(resumed)
    for name in expected:
        # Same data order, same dropout draws (the RNG state is restored): the
        # same numbers, not just close ones.
        assert torch.equal(expected[name], got[name]), name
    result = runfiles.read_result(resumed)
    assert result is not None and len(result.epoch_seconds) == SPEC.epochs - latest[1]
