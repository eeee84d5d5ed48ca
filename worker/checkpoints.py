"""Checkpoints: a plain dict (model, optimizer, epoch, step, spec, RNG state)
written by rank 0 at the end of each epoch, to a temporary file then renamed,
so a crash never leaves half of one. Files are named by epoch and never
rewritten (see runfiles.checkpoint_path)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn, optim

from api.schemas import JobSpec
from worker import runfiles


def save(
    run_dir: Path,
    *,
    model: nn.Module,
    optimizer: optim.Optimizer,
    epoch: int,
    step: int,
    spec: JobSpec,
) -> Path:
    state: dict[str, Any] = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": epoch,
        "step": step,
        "spec": spec.model_dump(mode="json"),
        # Every rank draws the same dropout numbers (same seed, same shapes),
        # so rank 0's generator state is every rank's.
        "rng": torch.get_rng_state(),
    }
    if torch.cuda.is_initialized():
        state["cuda_rng"] = torch.cuda.get_rng_state()
    path = runfiles.checkpoint_path(run_dir, epoch)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for older, older_epoch in runfiles.checkpoints(run_dir):
        if older_epoch < epoch:
            older.unlink(missing_ok=True)
    return path


def restore(path: Path, model: nn.Module, optimizer: optim.Optimizer) -> int:
    """Load a checkpoint into this rank's model and optimizer; return its epoch."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda_rng"])
    epoch: int = state["epoch"]
    return epoch
