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

import pytest

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


def test_a_node_describes_each_trainer_it_can_load_with_its_params_schema(tmp_path: Path) -> None:
    """What ``python -m worker.trainers`` prints is what a worker without a
    fork server registers with; a trainer that fails to import is left out."""
    installed_package(tmp_path)
    (tmp_path / "typed.py").write_text(
        textwrap.dedent(
            """
            from pydantic import BaseModel, Field
            from worker.trainers import Trainer

            class Params(BaseModel):
                width: int = Field(8, ge=1)

            TRAINER = Trainer(train=lambda ctx: None, params=Params, version="2.1")
            """
        )
    )
    extra = {"typed": "typed:TRAINER", "broken": "no_such_module:TRAINER"}
    done = subprocess.run(
        [sys.executable, "-m", "worker.trainers", json.dumps(extra)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    offers = {o["name"]: o for o in json.loads(done.stdout)}
    assert sorted(offers) == ["echo", "mnist", "typed"]
    assert offers["typed"]["version"] == "2.1"
    assert offers["typed"]["params_schema"]["properties"]["width"] == {
        "default": 8,
        "minimum": 1,
        "title": "Width",
        "type": "integer",
    }
    assert offers["echo"]["params_schema"] is None  # it declares none
    assert offers["mnist"]["params_schema"]["additionalProperties"] is False
    assert "trainer 'broken' is not offered, it does not load" in done.stderr
    assert "No module named 'no_such_module'" in done.stderr


def test_a_trainer_checks_a_jobs_params_against_its_model() -> None:
    from ddpo.schemas import JobSpec
    from worker.mnist import TRAINER

    assert TRAINER.params_of(JobSpec()) is not None
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        TRAINER.params_of(JobSpec(params={"hidden": 3}))
