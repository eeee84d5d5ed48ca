"""Gradient averaging through shared memory, for the ranks of a job that
all run on one host.

gloo averages over TCP even between processes of one machine: on two busy
cores that cost about 5 ms a step here, a fifth of the step. Ranks on one host
can instead write their gradients into one shared array and each sum it: the
same average (every rank sums the slots in the same order, so all end with the
same bits), one memory copy and one barrier per bucket.

Registered as a DDP communication hook, so DDP still does everything else
(buckets, broadcasting the initial parameters, keeping replicas in step).
"""

from __future__ import annotations

import multiprocessing.synchronize
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


@dataclass
class LocalGroup:
    """What the launcher gives each rank of a single-machine job: a barrier
    shared by its processes and where to map the shared gradients."""

    barrier: multiprocessing.synchronize.Barrier
    path: Path
    timeout_s: float


class SharedMemoryAllreduce:
    def __init__(self, group: LocalGroup, rank: int, world_size: int, numel: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = world_size
        # Two sets of slots, used in turn: a rank can write the next bucket
        # while a slower one still reads this one, so one barrier per bucket
        # is enough.
        mapped = torch.from_file(
            str(group.path), shared=True, size=2 * world_size * numel, dtype=torch.float32
        )
        self.slots = mapped.view(2, world_size, numel)
        self.calls = 0
        self._wait()  # every rank has mapped the file...
        if rank == 0:
            os.unlink(group.path)  # ...so it can go: the mappings stay

    def _wait(self) -> None:
        # A timeout, so a rank whose peer died fails instead of hanging.
        self.group.barrier.wait(self.group.timeout_s)

    def reduce(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        gradients = bucket.buffer()
        slots = self.slots[self.calls % 2, :, : gradients.numel()]
        self.calls += 1
        slots[self.rank].copy_(gradients)
        self._wait()
        torch.sum(slots, dim=0, out=gradients)
        gradients.div_(self.world_size)
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(gradients)
        return done


def attach(
    ddp: DistributedDataParallel, group: LocalGroup, rank: int, world_size: int
) -> SharedMemoryAllreduce:
    numel = sum(p.numel() for p in ddp.parameters() if p.requires_grad)
    state = SharedMemoryAllreduce(group, rank, world_size, numel)
    ddp.register_comm_hook(state, _hook)
    return state


def _hook(state, bucket):  # type: ignore[no-untyped-def]
    # Unannotated on purpose: DDP compares the annotations to dist.GradBucket
    # and, with postponed evaluation, ours would be strings.
    return state.reduce(bucket)
