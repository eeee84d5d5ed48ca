"""A trainer an installed package declares in the ``ddpo.trainers``
entry-point group is offered by the worker and resolves to its object;
``--trainer`` still wins for its name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import REPO

PROBE = textwrap.dedent(
    """
    import json, sys
    from worker import trainers
    found = trainers.available({})
    resolved = trainers.resolve("echo", {})
    print(json.dumps({
        "found": found,
        "resolved": type(resolved).__name__,
        "overridden": trainers.available({"echo": "mine:T"})["echo"],
    }))
    """
)


def installed_package(site: Path) -> None:
    """What pip leaves on a path for a package declaring one trainer."""
    (site / "echo_trainer.py").write_text(
        "from worker.trainers import Trainer\nTRAINER = Trainer(train=lambda ctx: None)\n"
    )
    dist = site / "echo_trainer-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-trainer\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[ddpo.trainers]\necho = echo_trainer:TRAINER\n")


def test_an_installed_packages_trainer_is_offered_beside_the_built_in(tmp_path: Path) -> None:
    installed_package(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["found"]["echo"] == "echo_trainer:TRAINER"
    assert seen["found"]["mnist"] == "worker.mnist:TRAINER"
    assert seen["resolved"] == "Trainer"
    assert seen["overridden"] == "mine:T"
