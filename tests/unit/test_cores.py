"""The cores a node's ranks may use: affinity, cgroup quota, --cpus."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.conftest import REPO
from worker import cores
from worker.settings import WorkerSettings


def test_a_cfs_quota_is_rounded_up_to_whole_cpus() -> None:
    assert cores.quota_cpus(200_000, 100_000) == 2
    assert cores.quota_cpus(150_000, 100_000) == 2
    assert cores.quota_cpus(50_000, 100_000) == 1
    assert cores.quota_cpus(-1, 100_000) is None


def test_cgroup_v2_cpu_max() -> None:
    assert cores.parse_cpu_max("max 100000\n") is None
    assert cores.parse_cpu_max("200000 100000\n") == 2


def test_a_v2_quota_anywhere_up_the_tree_limits(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu\n")
    leaf = tmp_path / "machine.slice" / "box"
    leaf.mkdir(parents=True)
    (leaf / "cpu.max").write_text("max 100000\n")
    (leaf.parent / "cpu.max").write_text("300000 100000\n")
    assert cores.cgroup_cpus(tmp_path, "0::/machine.slice/box\n") == 3


def test_a_v1_quota_limits(tmp_path: Path) -> None:
    folder = tmp_path / "cpu,cpuacct" / "docker" / "abc"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("200000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    assert cores.cgroup_cpus(tmp_path, "2:cpu,cpuacct:/docker/abc\n1:memory:/x\n") == 2


def test_no_quota_is_no_limit(tmp_path: Path) -> None:
    folder = tmp_path / "cpu"
    folder.mkdir()
    (folder / "cpu.cfs_quota_us").write_text("-1\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    assert cores.cgroup_cpus(tmp_path, "1:cpu:/\n") is None


def test_declared_cpus_win_and_otherwise_the_affinity_caps() -> None:
    assert cores.usable_cpus(3) == 3
    assert 1 <= cores.usable_cpus() <= cores.affinity_cpus()


def test_a_cpu_list_reads_and_writes_as_taskset_does() -> None:
    assert cores.parse_cpu_set("0-3,6") == frozenset({0, 1, 2, 3, 6})
    assert cores.format_cpu_set(frozenset({6, 0, 1, 2, 3})) == "0-3,6"
    assert cores.format_cpu_set([5]) == "5"
    for bad in ("", "a", "3-1", "1-", "0-5000"):
        with pytest.raises(ValueError):
            cores.parse_cpu_set(bad)


def test_workers_sharing_a_host_get_disjoint_even_shares() -> None:
    assert cores.split([0, 1, 2, 3, 4], 2) == [[0, 1, 2], [3, 4]]
    assert cores.split([0, 1], 2) == [[0], [1]]
    # More workers than CPUs: one each, shared round-robin.
    assert cores.split([0, 1], 3) == [[0], [1], [0]]


def test_a_worker_told_a_cpu_set_runs_its_ranks_on_it() -> None:
    """The mask is inherited: a process the worker starts after pinning
    runs on those CPUs only, and counts them as its cores."""
    mine = cores.cpu_list()
    probe = (
        "import os, sys; from worker import cores; "
        f"cores.pin(frozenset({{{mine[-1]}}})); "
        "import subprocess; "
        "sys.exit(subprocess.call([sys.executable, '-c', "
        "'import os; print(sorted(os.sched_getaffinity(0)))']))"
    )
    shown = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert shown.stdout.strip() == f"[{mine[-1]}]"
    with pytest.raises(ValueError, match="none of CPUs 4000 is available"):
        cores.pin(frozenset({4000}))


def test_worker_settings_name_a_bad_cpu_set() -> None:
    with pytest.raises(ValidationError, match="cpu_set"):
        WorkerSettings(cpu_set="two")
    assert WorkerSettings(cpu_set="0").cpus_pinned == frozenset({0})
