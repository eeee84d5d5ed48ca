"""What agreeing on a stop costs a step: two gloo ranks on loopback, one
4-byte all-reduce (worker/stopping.py) against one training step of the
built-in trainer at the default batch size, measured in the same ranks.

    python -m bench.stop_agreement --steps 200 --agreements 2000

Prints microseconds per agreement, milliseconds per step, and the share
of a step one agreement every CHECK_EVERY steps costs.
"""

from __future__ import annotations

import argparse
import os
import socket
from datetime import timedelta
from pathlib import Path
from time import perf_counter

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import optim

from ddpo.schemas import JobSpec
from worker import mnist
from worker.stopping import CHECK_EVERY


def _rank(rank: int, port: int, steps: int, agreements: int, data_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=120),
    )
    try:
        flag = torch.zeros(1, dtype=torch.int32)
        for _ in range(100):  # warm
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        started = perf_counter()
        for _ in range(agreements):
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        agreement_s = (perf_counter() - started) / agreements

        spec = JobSpec()
        cpu = torch.device("cpu")
        data = mnist.train_data(spec, Path(data_dir), rank, 2, cpu)
        ddp = torch.nn.parallel.DistributedDataParallel(mnist.build_model(spec, cpu))
        optimizer = optim.Adadelta(ddp.parameters(), lr=spec.lr)
        batches = data.epoch(1, cpu)
        for _ in range(10):  # warm
            mnist.train_step(ddp, optimizer, *next(batches))
        started = perf_counter()
        for _ in range(steps):
            mnist.train_step(ddp, optimizer, *next(batches))
        step_s = (perf_counter() - started) / steps
        if rank == 0:
            share = agreement_s / CHECK_EVERY / step_s
            print(
                f"agreement {1e6 * agreement_s:.1f} us, step {1e3 * step_s:.2f} ms: "
                f"one agreement a step costs {100 * agreement_s / step_s:.2f}% of it, "
                f"one every {CHECK_EVERY} steps {100 * share:.3f}%",
                flush=True,
            )
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--agreements", type=int, default=2000)
    parser.add_argument("--data-dir", default=os.environ.get("DDPO_DATA_DIR", "./data"))
    args = parser.parse_args(argv)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_rank, args=(port, args.steps, args.agreements, args.data_dir), nprocs=2, join=True)


if __name__ == "__main__":
    main()
