"""What a trainer is given: who it is in the job, where the data is, and how
to report progress and save checkpoints. Trainers know nothing of HTTP or of
the server."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ddpo import amp
from ddpo.schemas import JobSpec


def _nothing(**_: object) -> None:
    return None


def _never() -> bool:
    return False


@dataclass(frozen=True)
class TrainContext:
    spec: JobSpec
    rank: int
    local_rank: int
    world_size: int
    machine_id: int
    device: torch.device
    data_dir: Path
    # perf_counter() when the rank process started, for setup timing.
    started_at: float
    # report(epoch=, batch=, batches_per_epoch=, loss=, samples_per_sec=,
    # [step=, metrics={name: value}]); a no-op on every rank but 0.
    report: Callable[..., None] = _nothing
    # checkpoint(model=, optimizer=, epoch=, step=) at the end of an epoch,
    # or with batches_done= (the batches of ``epoch`` trained) where the job
    # stopped when asked (should_stop); a no-op on every rank but 0.
    checkpoint: Callable[..., None] = _nothing
    # A checkpoint to continue from, or None to start afresh.
    resume: Path | None = None
    # attach_comm_hook(ddp): a faster gradient average when every rank is on
    # this host; a no-op otherwise.
    attach_comm_hook: Callable[[Any], None] = lambda _ddp: None
    # The job's params as an instance of the trainer's params model (None
    # when it declares none).
    params: Any = None
    # should_stop(): whether the job has been asked to stop (preempted,
    # drained), agreed by every rank (worker/stopping.py): call it at the
    # same point of every step on every rank (it is a collective every few
    # calls); when it says so, checkpoint at this step and return (the
    # part then ends "stopped", and the next attempt resumes from it).
    should_stop: Callable[[], bool] = _never

    @property
    def is_master(self) -> bool:
        return self.rank == 0

    def autocast(self) -> Any:
        """A context for the forward pass and loss in the job's
        performance.precision (nothing for fp32)."""
        return amp.autocast(self.spec.performance.precision, self.device.type)

    def grad_scaler(self) -> torch.amp.GradScaler:
        """fp16-mixed's loss scaler; disabled (its calls pass through) for
        the other precisions: ``scaler.scale(loss).backward()``,
        ``scaler.step(optimizer)``, ``scaler.update()``."""
        return amp.grad_scaler(self.spec.performance.precision, self.device.type)
