"""``python -m worker.script_rank SCRIPT [ARGS]``: one rank of a script job.

The script runs as ``python SCRIPT ARGS`` would run it (``__main__``, its
directory first on the path, ``sys.argv``), with the worker's SIGTERM shield
installed first (worker/shield.py): a SIGTERM sent to every process of a
Slurm step or a systemd unit leaves it to the worker to stop the job at a
step. A script that installs its own SIGTERM handler replaces the shield.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import ddpo
from worker import shield


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m worker.script_rank SCRIPT [ARGS]")
    script = os.path.abspath(sys.argv[1])
    shield.install_for_part(Path(os.environ[ddpo.RUN_DIR_ENV]), os.getppid())
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
