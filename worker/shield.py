"""A part's processes outlive a SIGTERM sent to every process at once.

Slurm signals every process of a job step (``scancel``, and ``--signal``
before the walltime), systemd every process of a unit (``systemctl stop``
with its default ``KillMode=control-group``). The worker gets that SIGTERM
too and leaves: its jobs stop at an agreed step, checkpoint and go back to
the queue (README, "On Slurm"). That needs the ranks alive, so they must
not die of the same signal first (which would fail their jobs as killed by
SIGTERM).

So the fork server, each launcher and each rank (and what a rank forks)
take SIGTERM as meant for them only when it is:
- their worker's: the daemon marks the part's run directory
  (``runfiles.request_termination``) before it signals the part's group;
- or their supervisor is gone (the kernel's parent-death signal is SIGTERM
  for the fork server and the launchers): nobody is left to stop them well.
Then they die of it as before (the default action, exit status -SIGTERM).
Any other SIGTERM is written to their output once and left to the worker.

A Python handler runs between bytecodes: a rank blocked in a collective
dies of its worker's SIGTERM when the collective returns, or of the SIGKILL
that follows DDPO_WORKER_STOP_GRACE_S later. A script that installs its own
SIGTERM handler replaces this one and sees every SIGTERM (its choice).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from worker import runfiles
from worker._process import pid_exists


def install(supervisor: int, meant: Callable[[], bool] = lambda: False) -> None:
    """From now on in this process (and what it forks): SIGTERM kills it only
    if ``meant()`` or ``supervisor`` (a pid) is gone."""
    told = False
    installed_in, parent = os.getpid(), os.getppid()

    def supervisor_gone() -> bool:
        # Reparented: its parent died (perhaps still a zombie, which
        # signal 0 cannot tell from the living). What it forked (a
        # script's DataLoader workers) has another parent and asks by pid.
        if os.getpid() == installed_in and os.getppid() != parent:
            return True
        return not pid_exists(supervisor)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        nonlocal told
        if meant() or supervisor_gone():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if not told:
            told = True
            print(
                f"pid {os.getpid()}: SIGTERM sent to every process here (Slurm, systemd): "
                "left to the worker, which stops this job at a step",
                file=sys.stderr,
                flush=True,
            )

    signal.signal(signal.SIGTERM, on_sigterm)


def install_for_part(run_dir: Path, supervisor: int) -> None:
    """A launcher's or a rank's: its worker's SIGTERM is marked in ``run_dir``."""
    install(supervisor, lambda: runfiles.termination_requested(run_dir))
