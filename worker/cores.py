"""How many cores this node's ranks may really use.

``os.cpu_count()`` is the host's; a container limited to 2 CPUs on a 64-core
host sees 64 there, and 64 threads per rank on 2 CPUs' worth of quota spend
their time waiting for the scheduler. The answer is the smallest of the CPU
affinity mask and the cgroup's CPU quota (v2 ``cpu.max``, v1
``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``), rounded up.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def affinity_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def quota_cpus(quota_us: int, period_us: int) -> int | None:
    """CPUs' worth of a CFS quota; None when unlimited (a quota < 0)."""
    if quota_us < 0 or period_us <= 0:
        return None
    return max(1, math.ceil(quota_us / period_us))


def parse_cpu_max(text: str) -> int | None:
    """cgroup v2 ``cpu.max``: ``"max 100000"`` or ``"200000 100000"``."""
    words = text.split()
    if len(words) != 2 or words[0] == "max":
        return None
    return quota_cpus(int(words[0]), int(words[1]))


def _own_cgroups(proc_cgroup: str) -> dict[str, str]:
    """controller -> this process's cgroup path ("" is v2's unified one)."""
    found: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            found[controller] = path
    return found


def cgroup_cpus(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> int | None:
    """The CPU quota of this process's cgroup and its ancestors (the
    tightest), None if none is set or cgroups cannot be read."""
    try:
        own = _own_cgroups(proc_cgroup or Path("/proc/self/cgroup").read_text())
    except (OSError, ValueError):
        return None
    if "" in own and (root / "cgroup.controllers").exists():
        limits = _v2_limits(root, root / own[""].lstrip("/"))
    elif "cpu" in own:
        limits = _v1_limits(root, own["cpu"])
    else:
        limits = []
    return min(limits) if limits else None


def _v2_limits(root: Path, folder: Path) -> list[int]:
    """cgroup v2: ``cpu.max`` of the process's cgroup and each one above it."""
    limits: list[int] = []
    while True:
        try:
            limit = parse_cpu_max((folder / "cpu.max").read_text())
        except (OSError, ValueError):
            limit = None
        if limit is not None:
            limits.append(limit)
        if folder == root or root not in folder.parents:
            return limits
        folder = folder.parent


def _v1_limits(root: Path, own: str) -> list[int]:
    """cgroup v1: the cpu controller's CFS quota over its period."""
    base = next((root / n for n in ("cpu", "cpu,cpuacct") if (root / n).is_dir()), None)
    if base is None:
        return []
    limits: list[int] = []
    # Inside a container the controller's root is its own cgroup.
    for folder in dict.fromkeys([base / own.lstrip("/"), base]):
        try:
            quota = int((folder / "cpu.cfs_quota_us").read_text())
            period = int((folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        if (limit := quota_cpus(quota, period)) is not None:
            limits.append(limit)
    return limits


def usable_cpus(declared: int | None = None) -> int:
    """``declared`` (the worker's --cpus) if given, else what the affinity
    mask and the cgroup quota leave."""
    if declared is not None:
        return declared
    quota = cgroup_cpus()
    affinity = affinity_cpus()
    return min(affinity, quota) if quota is not None else affinity


# --- a CPU set of its own -----------------------------------------------------
# Workers sharing a host (``ddpo local-cluster --workers 2``) each get a
# disjoint set of its cores: without one, every worker's ranks run a thread
# per core of the whole host, and two jobs at once oversubscribe it (in
# BENCHMARKS.md, two 1 x 1 jobs at once ran 4 x slower than one alone).


def parse_cpu_set(text: str) -> frozenset[int]:
    """``0-3,6`` (as taskset and cgroups write them) -> {0, 1, 2, 3, 6}."""
    found: set[int] = set()
    for piece in text.replace(" ", "").split(","):
        low, dash, high = piece.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"{text!r} is not a CPU list like 0-3,6")
        first, last = int(low), int(high) if dash else int(low)
        if last < first or last >= 4096:
            raise ValueError(f"{piece!r}: a range low-high of CPUs 0 to 4095")
        found.update(range(first, last + 1))
    return frozenset(found)


def format_cpu_set(cpus: frozenset[int] | list[int]) -> str:
    """The shortest CPU list for ``cpus`` (``0-3,6``)."""
    ordered = sorted(cpus)
    pieces: list[str] = []
    start = previous = ordered[0]
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == previous + 1:
            previous = cpu
            continue
        pieces.append(str(start) if start == previous else f"{start}-{previous}")
        if cpu is not None:
            start = previous = cpu
    return ",".join(pieces)


def can_pin() -> bool:
    return hasattr(os, "sched_setaffinity")


def cpu_list() -> list[int]:
    """The CPUs this process may run on, in order."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def pin(cpus: frozenset[int]) -> None:
    """This process and every process it starts from now on run on ``cpus``
    (ranks inherit the mask). ValueError if none of them may be used here."""
    if not can_pin():
        return
    allowed = set(os.sched_getaffinity(0))
    if not cpus & allowed:
        raise ValueError(
            f"none of CPUs {format_cpu_set(cpus)} is available here "
            f"(this process may use {format_cpu_set(frozenset(allowed))})"
        )
    os.sched_setaffinity(0, cpus & allowed)


def split(cpus: list[int], ways: int) -> list[list[int]]:
    """``cpus`` in ``ways`` disjoint runs as even as possible; with fewer
    CPUs than ways, one CPU each, shared round-robin (nothing better exists)."""
    if ways <= len(cpus):
        size, extra = divmod(len(cpus), ways)
        shares, at = [], 0
        for index in range(ways):
            take = size + (1 if index < extra else 0)
            shares.append(cpus[at : at + take])
            at += take
        return shares
    return [[cpus[index % len(cpus)]] for index in range(ways)]
