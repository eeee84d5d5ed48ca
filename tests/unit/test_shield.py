"""worker/shield.py on real processes: a SIGTERM sent to every process (a
Slurm step's, a systemd unit's) is left to the worker; the worker's own
(marked in the run directory first) and the supervisor's death still kill."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker import runfiles

CHILD = """
import os, sys, time
from pathlib import Path
from worker import shield
shield.install_for_part(Path(sys.argv[1]), int(sys.argv[2]))
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""


def shielded(run_dir: Path, supervisor: int) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(run_dir), str(supervisor)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    return child


@pytest.fixture
def supervisor() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "600"])
    yield process
    process.kill()
    process.wait()


def exited_within(child: subprocess.Popen[str], timeout_s: float) -> int | None:
    try:
        return child.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return None


@pytest.mark.timeout(60)
def test_a_sigterm_to_everyone_is_left_to_the_worker_and_said_once(
    tmp_path: Path, supervisor: subprocess.Popen[bytes]
) -> None:
    child = shielded(tmp_path, supervisor.pid)
    try:
        for _ in range(3):
            child.send_signal(signal.SIGTERM)
        # Alive a while later (it would die at once without the shield).
        assert exited_within(child, 1.0) is None
        # Its worker's SIGTERM, said in the run directory first, kills it as before.
        runfiles.request_termination(tmp_path)
        child.send_signal(signal.SIGTERM)
        assert exited_within(child, 20) == -signal.SIGTERM
    finally:
        child.kill()
        _, err = child.communicate()
    assert err.count("left to the worker, which stops this job at a step") == 1, err


@pytest.mark.timeout(60)
def test_with_its_supervisor_gone_a_sigterm_kills(
    tmp_path: Path, supervisor: subprocess.Popen[bytes]
) -> None:
    child = shielded(tmp_path, supervisor.pid)
    try:
        supervisor.kill()
        supervisor.wait()
        child.send_signal(signal.SIGTERM)
        assert exited_within(child, 20) == -signal.SIGTERM
    finally:
        child.kill()
        child.communicate()
