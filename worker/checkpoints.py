"""Checkpoints: a plain dict (model, optimizer, epoch, step, spec, RNG state)
written by rank 0 at the end of each epoch, to a temporary file then renamed,
so a crash never leaves half of one. Files are named by epoch and never
rewritten (see runfiles.checkpoint_path).

A job asked to stop (issue 28's cooperative stop), or one that checkpoints
every few steps (``checkpoint_every_steps``), saves one in the middle
of an epoch: the same dict with ``batches_done``, the batches of ``epoch``
already trained, and ``epoch_loss``, their summed loss, so that a run
resumed from it trains the rest of that epoch and ends with the model a run
never stopped ends with, tensor for tensor. Its file is named by its
epoch and step (runfiles.stop_checkpoint_path)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn, optim

from ddpo.schemas import JobSpec
from worker import runfiles


def save(
    run_dir: Path,
    *,
    model: nn.Module,
    optimizer: optim.Optimizer,
    epoch: int,
    step: int,
    spec: JobSpec,
    batches_done: int | None = None,
    epoch_loss: float | None = None,
) -> Path:
    """Rank 0's checkpoint at the end of ``epoch``, or with ``batches_done``
    of its batches trained (a stop in the middle of it)."""
    state: dict[str, Any] = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": epoch,
        "step": step,
        "spec": spec.model_dump(mode="json"),
        # The ranks that trained it (the process group's, where there is
        # one): a run resumed on another number of machines (an elastic
        # job) maps its position in the epoch.
        "world_size": dist.get_world_size() if dist.is_initialized() else spec.topology.world_size,
        # Every rank draws the same dropout numbers (same seed, same shapes),
        # so rank 0's generator state is every rank's.
        "rng": torch.get_rng_state(),
    }
    if torch.cuda.is_initialized():
        state["cuda_rng"] = torch.cuda.get_rng_state()
    if batches_done is not None:
        state["batches_done"] = batches_done
        state["epoch_loss"] = epoch_loss
        path = runfiles.stop_checkpoint_path(run_dir, epoch, step)
    else:
        path = runfiles.checkpoint_path(run_dir, epoch)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    runfiles.drop_older_checkpoints(run_dir, path)
    return path


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run starts: ``batches_done`` batches into ``epoch``
    (0: at its start), with their summed loss so far."""

    epoch: int
    batches_done: int
    epoch_loss: float


def resume(
    path: Path, model: nn.Module, optimizer: optim.Optimizer, world_size: int | None = None
) -> ResumePoint:
    """Load a checkpoint, of a whole epoch or from a stop within one. Taken
    by another number of ranks than ``world_size`` (an elastic job resized),
    its position in the epoch is counted again in this world's batches, so
    that no sample of the epoch is skipped."""
    state = _load(path, model, optimizer)
    if "batches_done" not in state:
        return ResumePoint(state["epoch"] + 1, 0, 0.0)
    done, loss = state["batches_done"], state["epoch_loss"] or 0.0
    taken_by = state.get("world_size")
    if world_size is not None and taken_by is not None and taken_by != world_size and done > 0:
        mapped = resumed_batches(done, taken_by, world_size)
        # The epoch's mean loss stays a mean over its batches.
        loss, done = loss * mapped / done, mapped
    return ResumePoint(state["epoch"], done, loss)


def restore(path: Path, model: nn.Module, optimizer: optim.Optimizer) -> int:
    """Load a checkpoint into this rank's model and optimizer; return its
    epoch (the last whole one: a stop's checkpoint is within the next)."""
    state = _load(path, model, optimizer)
    epoch: int = state["epoch"]
    return epoch - 1 if "batches_done" in state else epoch


def _load(path: Path, model: nn.Module, optimizer: optim.Optimizer) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda_rng"])
    return state


def resumed_batches(batches_done: int, old_world: int, new_world: int) -> int:
    """The batches of an epoch already trained, in a new world size's
    batches: the samples seen (``batches_done`` global batches of the old
    world) over the new global batch, rounded down, so that no sample of
    the epoch is skipped (a few may be trained twice)."""
    if batches_done < 0 or old_world < 1 or new_world < 1:
        raise ValueError("batches and world sizes count from 0 and 1")
    return batches_done * old_world // new_world
