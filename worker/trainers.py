"""Trainers a node can run, by name. Jobs name a trainer; they never carry
code. Operators add their own with ``--trainer name=module:attribute``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from api.schemas import JobSpec, TrainResult
    from worker.context import TrainContext

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


def available(extra: dict[str, str]) -> dict[str, str]:
    return {**BUILTIN, **extra}


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
