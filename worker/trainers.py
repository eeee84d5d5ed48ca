"""Trainers a node can run, by name. Jobs name a trainer; they never carry
code. Installed packages declare trainers in the ``ddpo.trainers``
entry-point group (``name = "module:attribute"``, as this project declares
its MNIST trainer); operators add local modules with ``--trainer
name=module:attribute``, which wins over a package's trainer of that name."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from api.schemas import JobSpec, TrainResult
    from worker.context import TrainContext

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


def preload(data_dir: Path) -> None:
    """Import the built-in trainers (and with them torch) and warm them."""
    for name in BUILTIN:
        trainer = resolve(name, {})
        if trainer.warm is not None:
            trainer.warm(data_dir)
