"""The cores a node's ranks may use: affinity, cgroup quota, --cpus."""

from __future__ import annotations

from pathlib import Path

from worker import cores


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
