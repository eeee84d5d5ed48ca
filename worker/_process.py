"""Process-group helpers shared by the daemon and the launcher (Linux first,
degrading to no-ops elsewhere)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies, so
    ranks never outlive the processes that supervise them."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    # The parent may have died before prctl took effect.
    if os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)


# unshare(2) and mount(2) flags (linux/sched.h, linux/mount.h).
_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18


def hide_files(paths: list[Path]) -> str | None:
    """Make ``paths`` read as empty for this process and every process it
    starts from now on: a mount namespace of its own, /dev/null bound over
    each. None once done; else why not (not Linux, not root or without
    CAP_SYS_ADMIN: then the files stay as readable as their modes make them).
    Call before starting threads: a namespace is per thread until exec."""
    present = [p for p in paths if p.exists()]
    if not present:
        return None
    if not sys.platform.startswith("linux"):
        return "not Linux"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        return f"no mount namespace: {os.strerror(ctypes.get_errno())}"
    # Private: the masks must not propagate back to the host's namespace.
    if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return f"mounts not private: {os.strerror(ctypes.get_errno())}"
    for path in present:
        if libc.mount(b"/dev/null", os.fsencode(path), None, _MS_BIND, None) != 0:
            return f"{path} not masked: {os.strerror(ctypes.get_errno())}"
    return None


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is left in the process group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc"):
        return True
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the parenthesised command: state, ppid, pgrp, ...
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def pid_exists(pid: int) -> bool:
    """Whether a process of this pid exists (a zombie counts: signal 0 cannot
    tell it from the living)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_MALLOC_TUNING = {
    # Tensors up to 32 MiB come from the heap, not from fresh mmaps...
    _M_MMAP_THRESHOLD: ("MALLOC_MMAP_THRESHOLD_", 32 * 2**20),
    # ...and freed heap memory is kept for the next step rather than handed
    # back to the kernel, so its pages need not be faulted in and zeroed again.
    _M_TRIM_THRESHOLD: ("MALLOC_TRIM_THRESHOLD_", 2**30),
    _M_TOP_PAD: ("MALLOC_TOP_PAD_", 64 * 2**20),
}


def keep_freed_memory() -> None:
    """Stop glibc from returning each training step's large blocks to the
    kernel. Applies to this process and the ranks it forks (mallopt) and to
    those it spawns (the environment, read when they start)."""
    for _, (variable, value) in _MALLOC_TUNING.items():
        os.environ[variable] = str(value)
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # not glibc (musl, ...): nothing to tune
    for parameter, (_, value) in _MALLOC_TUNING.items():
        libc.mallopt(parameter, value)
