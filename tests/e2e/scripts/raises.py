"""A torchrun-style script whose last rank raises once the group has met
(its data "is not what it expects"): the job must fail with rank_failed and
this traceback, and never be retried."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

import ddpo


def check_shard(rank: int, world: int) -> None:
    if rank == world - 1:
        raise ValueError(f"shard {rank} of {world} has no labels")


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.ones(1)
    dist.all_reduce(total)  # every rank got this far
    ddpo.report(step=1, loss=1.0, ranks_met=total.item())
    check_shard(rank, world)
    dist.barrier()  # the others wait here for the rank that raised
    print(f"rank {rank}: no rank raised", flush=True)


if __name__ == "__main__":
    assert "RANK" in os.environ, "run me under torchrun or ddpo"
    main()
