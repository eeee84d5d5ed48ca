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
    try:
        runpy.run_path(script, run_name="__main__")
    except Exception:
        _record_failure()
        raise


def _record_failure() -> None:
    """The script's exception, on disk before this process exits (its
    sockets close then, and its peers notice): if their symptom reaches the
    server first and the part is stopped before the launcher has judged this
    rank, the daemon still reports the cause (worker/part.py). Imported
    here: a script that does not raise pays nothing for it."""
    import contextlib
    import traceback

    from worker import runfiles

    with contextlib.suppress(OSError, KeyError, ValueError):
        run_dir = Path(os.environ[ddpo.RUN_DIR_ENV])
        runfiles.write_rank_failure(run_dir, int(os.environ["RANK"]), traceback.format_exc())


if __name__ == "__main__":
    main()
