"""Trainers a node can run, by name. Jobs name a trainer; they never carry
code. Installed packages declare trainers in the ``ddpo.trainers``
entry-point group (``name = "module:attribute"``, as this project declares
its MNIST trainer); operators add local modules with ``--trainer
name=module:attribute``, which wins over a package's trainer of that name.

A trainer declares its parameters as a pydantic model: the node reports its
JSON schema when it registers, the server checks each job's ``params``
against it at submit, and the ranks get them as an instance of the model.

``python -m worker.trainers [EXTRA_JSON]`` prints what this node offers, as
JSON (the daemon asks its fork server, which has the imports already, and
this only when it has none)."""

from __future__ import annotations

import importlib
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from traceback import format_exc
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ddpo.schemas.protocol import TrainerOffer

if TYPE_CHECKING:
    from ddpo.schemas import JobSpec, TrainResult
    from worker.context import TrainContext

log = logging.getLogger(__name__)

# The entry-point group installed packages declare their trainers in.
ENTRY_POINTS = "ddpo.trainers"
# This project's own, also declared in its pyproject.toml: here too, so that
# a checkout run without being installed still has it.
BUILTIN: dict[str, str] = {"mnist": "worker.mnist:TRAINER"}


@dataclass(frozen=True)
class Trainer:
    """``train`` runs in every rank; ``prepare(data_dir, spec)`` runs once per
    machine before the ranks start: fetch or check data, so ranks never race
    to download, and load what every rank reads (ranks forked from the
    launcher share it instead of each loading a copy)."""

    train: Callable[[TrainContext], TrainResult | None]
    prepare: Callable[[Path, JobSpec], None] | None = None
    # warm(data_dir) runs once in the worker's fork server, before any job:
    # load what jobs read (if it is there), to be shared by every launcher
    # and rank forked from it. No OpenMP work in it (one thread).
    warm: Callable[[Path], None] | None = None
    # What a job may set in its ``params``; None: nothing (any params refused
    # at the node, none checked at submit).
    params: type[BaseModel] | None = None
    version: str = "0"

    def params_of(self, spec: JobSpec) -> BaseModel | None:
        """The job's ``params`` as this trainer's model (ValueError if it refuses them)."""
        if self.params is None:
            if spec.params:
                raise ValueError(f"params: this trainer takes none (got {sorted(spec.params)})")
            return None
        return self.params.model_validate(spec.params)

    def offer(self, name: str) -> TrainerOffer:
        schema: dict[str, Any] | None = (
            self.params.model_json_schema() if self.params is not None else None
        )
        return TrainerOffer(name=name, version=self.version, params_schema=schema)


def installed() -> dict[str, str]:
    """name -> "module:attribute" of every trainer installed packages declare."""
    return {point.name: point.value for point in entry_points(group=ENTRY_POINTS)}


def available(extra: dict[str, str]) -> dict[str, str]:
    return {**BUILTIN, **installed(), **extra}


def resolve(name: str, extra: dict[str, str]) -> Trainer:
    targets = available(extra)
    if name not in targets:
        raise LookupError(f"trainer {name!r} is not installed on this node ({sorted(targets)})")
    module_name, _, attribute = targets[name].partition(":")
    trainer = getattr(importlib.import_module(module_name), attribute)
    if not isinstance(trainer, Trainer):
        raise TypeError(f"{targets[name]} is not a worker.trainers.Trainer")
    return trainer


def load_all(extra: dict[str, str]) -> dict[str, Trainer]:
    """Every trainer this node can load, by name; one that fails to import
    is left out (and said why), never offered."""
    loaded = {}
    for name in sorted(available(extra)):
        try:
            loaded[name] = resolve(name, extra)
        except Exception:
            log.error("trainer %r is not offered, it does not load:\n%s", name, format_exc())
    return loaded


def describe(extra: dict[str, str]) -> list[TrainerOffer]:
    return [trainer.offer(name) for name, trainer in load_all(extra).items()]


def preload(data_dir: Path, extra: dict[str, str]) -> list[TrainerOffer]:
    """Import every trainer (and with them torch) and warm them: what the
    fork server does once for all its launchers. What it loaded, described."""
    loaded = load_all(extra)
    for trainer in loaded.values():
        if trainer.warm is not None:
            trainer.warm(data_dir)
    return [trainer.offer(name) for name, trainer in loaded.items()]


def offers_json(offers: list[TrainerOffer]) -> str:
    return json.dumps([o.model_dump(mode="json") for o in offers])


def parse_offers(text: str) -> list[TrainerOffer]:
    return [TrainerOffer.model_validate(o) for o in json.loads(text)]


if __name__ == "__main__":
    # This file runs as __main__: the Trainer class trainers are made of is
    # the one in worker.trainers.
    from worker import trainers

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    print(trainers.offers_json(trainers.describe(json.loads(sys.argv[1]) if sys.argv[1:] else {})))
