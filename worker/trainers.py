"""Trainers a node can run, by name. Jobs name a trainer; they never carry
code. Operators add their own with ``--trainer name=module:attribute``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from api.schemas import TrainResult
    from worker.context import TrainContext

BUILTIN: dict[str, str] = {"mnist": "worker.mnist:TRAINER"}


@dataclass(frozen=True)
class Trainer:
    """``train`` runs in every rank; ``prepare`` runs once per machine before
    the ranks start (fetch or check data, so ranks never race to download)."""

    train: Callable[[TrainContext], TrainResult | None]
    prepare: Callable[[Path], None] | None = None


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


def preload() -> None:
    """Import the built-in trainers' modules (and with them torch)."""
    for target in BUILTIN.values():
        importlib.import_module(target.partition(":")[0])
