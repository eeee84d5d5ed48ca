"""A torchrun-style script written as many are, its group destroyed in a
``finally``: its last rank raises, leaves the group (its peer notices at
once), then its process lingers (a thread of its own, as a data loader's or
a logger's may). The peer's symptom reaches the server, which stops this
part before its launcher can judge the rank: the job must still fail with
this rank's rank_failed, not the peer's peer_failure."""

from __future__ import annotations

import os
import threading
import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        dist.all_reduce(torch.ones(1))  # every rank got this far
        if rank == world - 1:
            threading.Thread(target=time.sleep, args=(60,), name="lingers").start()
            raise ValueError(f"shard {rank} of {world} has no labels")
        dist.barrier()  # the others wait here for the rank that raised
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    assert "RANK" in os.environ, "run me under torchrun or ddpo"
    main()
