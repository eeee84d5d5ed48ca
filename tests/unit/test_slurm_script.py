"""deploy/slurm/ddpo-workers.sbatch against the real entry points (the
script itself runs on a real Slurm in tests/e2e/test_slurm.py): it is valid
bash, runs a console script this package installs, exports only variables
the worker's settings read, signals the workers before the walltime with
time to leave, and gives them less than Slurm's KillWait to do it. And the
worker takes its name, cores and GPUs from what srun sets."""

from __future__ import annotations

import re
import subprocess
from importlib.metadata import entry_points

import pytest

from tests.conftest import REPO
from tests.unit.test_compose import environment_names
from worker.settings import WorkerSettings

SCRIPT = REPO / "deploy" / "slurm" / "ddpo-workers.sbatch"
# Slurm's default KillWait: SIGTERM to SIGKILL at scancel and at the walltime.
KILL_WAIT_S = 30


def text() -> str:
    return SCRIPT.read_text()


def sbatch_options() -> dict[str, str]:
    found = re.findall(r"^#SBATCH --([a-z-]+)(?:=(\S+))?$", text(), re.M)
    return {name: value for name, value in found}


def exported_defaults() -> dict[str, float]:
    found = re.findall(r'^export (DDPO_[A-Z_]+)="\$\{\1:-([0-9.]+)\}"$', text(), re.M)
    return {name: float(value) for name, value in found}


def test_it_is_valid_bash_and_executable() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], check=False).returncode == 0
    assert SCRIPT.stat().st_mode & 0o111


def test_it_starts_one_installed_ddpo_worker_per_node_with_srun() -> None:
    (line,) = [line for line in text().splitlines() if line.startswith("srun ")]
    assert "--ntasks-per-node=1" in line
    scripts = {ep.name for ep in entry_points(group="console_scripts")}
    assert "ddpo-worker" in scripts and " ddpo-worker " in line
    assert sbatch_options()["ntasks-per-node"] == "1"
    # Whole nodes: one worker, one name per node.
    assert "exclusive" in sbatch_options()


def test_every_variable_it_sets_or_needs_is_one_the_worker_reads() -> None:
    used = set(re.findall(r"\b(DDPO_[A-Z_]+)\b", text()))
    unread = used - environment_names(WorkerSettings)
    assert not unread, unread


def test_the_workers_are_told_before_the_walltime_and_leave_before_slurm_kills() -> None:
    signal = sbatch_options()["signal"]
    match = re.fullmatch(r"TERM@(\d+)", signal)
    assert match, signal  # SIGTERM to the steps (not B:, the batch shell)
    defaults = exported_defaults()
    leaving_s = defaults["DDPO_WORKER_LEAVE_GRACE_S"] + defaults["DDPO_WORKER_STOP_GRACE_S"]
    assert leaving_s < KILL_WAIT_S  # at scancel
    assert leaving_s < int(match[1])  # before the walltime


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        (
            {"SLURMD_NODENAME": "gpu-07", "SLURM_CPUS_ON_NODE": "48", "SLURM_GPUS_ON_NODE": "4"},
            ("gpu-07", 48, 4),
        ),
        (
            {
                "SLURMD_NODENAME": "gpu-07",
                "SLURM_CPUS_ON_NODE": "48",
                "DDPO_WORKER_NAME": "mine",
                "DDPO_WORKER_CPUS": "8",
            },
            ("mine", 8, None),
        ),
    ],
)
def test_the_worker_takes_its_name_cores_and_gpus_from_srun_unless_told(
    monkeypatch: pytest.MonkeyPatch,
    environment: dict[str, str],
    expected: tuple[str, int, int | None],
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    settings = WorkerSettings()
    assert (settings.name, settings.cpus, settings.gpus) == expected
    assert settings.work_dir.name == expected[0]  # runs/<node>: its credential beside it
