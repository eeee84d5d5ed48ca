"""What a trainer is given: who it is in the job, where the data is, and how
to report progress. Trainers know nothing of HTTP or of the server."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from api.schemas import JobSpec

Report = Callable[..., None]


def _no_report(**_: object) -> None:
    return None


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
    # report(epoch=, batch=, batches_per_epoch=, loss=, samples_per_sec=);
    # a no-op on every rank but 0.
    report: Report = _no_report

    @property
    def is_master(self) -> bool:
        return self.rank == 0
