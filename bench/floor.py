"""The training loop's floor on this machine, and where a step's time goes.

The floor is the model's arithmetic over the machine's sustained matrix
multiply rate: the FLOPs of one training step (forward and backward,
counted by torch's FlopCounterMode on the built-in trainer's own step) times
the steps of an epoch, over the FLOP/s of large fp32 matrix products on all
of this process's threads. No loop of these shapes beats it: every
convolution and linear layer is a matrix product at best.

    python -m bench.floor --steps 60 --batch-size 128

Prints the floor of one epoch, the measured step against it, and the ops
that take the step's time (torch.profiler, self CPU time).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from ddpo import amp
from ddpo.schemas import JobSpec
from worker import fused_pool, mnist
from worker.settings import WorkerSettings

MNIST_TRAIN = 60_000


def step_runner(spec: JobSpec, batch_size: int) -> Callable[[], None]:
    """One training step of the built-in trainer with ``spec``'s options, on
    one synthetic batch (the step's cost does not depend on the pixels)."""
    torch.manual_seed(0)
    model = mnist.build_model(spec, torch.device("cpu"))
    optimizer = mnist.build_optimizer(spec, model)
    data = torch.randn(batch_size, 1, 28, 28)
    if spec.performance.channels_last:
        data = data.contiguous(memory_format=torch.channels_last)
    target = torch.randint(0, 10, (batch_size,))
    precision = spec.performance.precision

    def step() -> None:
        mnist.train_step(model, optimizer, data, target, lambda: amp.autocast(precision, "cpu"))

    return step


def step_flops(spec: JobSpec, batch_size: int) -> int:
    step = step_runner(spec, batch_size)
    with FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())


def matmul_rate(seconds: float = 3.0, size: int = 2048) -> float:
    """Sustained fp32 FLOP/s of square matrix products on this process's threads."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(3):
        torch.mm(a, b)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        torch.mm(a, b)
        done += 1
    return done * 2 * size**3 / (time.perf_counter() - started)


def epoch_floor_s(batch_size: int, world_size: int = 1) -> tuple[float, float, int]:
    """(seconds, FLOP/s, FLOPs a step): one epoch's floor for one process
    of ``world_size`` on this process's threads."""
    spec = JobSpec(batch_size=batch_size)
    flops = step_flops(spec, batch_size)
    rate = matmul_rate()
    steps = -(-MNIST_TRAIN // world_size // batch_size)
    return steps * flops / rate, rate, flops


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16-mixed"])
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    spec = JobSpec(batch_size=args.batch_size, performance={"precision": args.precision})
    fused_pool.load(WorkerSettings().extensions_dir)  # as a rank on this machine would
    print(fused_pool.status())
    floor, rate, flops = epoch_floor_s(args.batch_size)
    steps = -(-MNIST_TRAIN // args.batch_size)
    step = step_runner(spec, args.batch_size)
    for _ in range(10):
        step()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    per_step = (time.perf_counter() - started) / args.steps
    print(f"threads {torch.get_num_threads()}, batch {args.batch_size}, {args.precision}")
    print(f"a step: {flops / 1e9:.2f} GFLOP (fp32 count); matmul rate {rate / 1e9:.0f} GFLOP/s")
    print(
        f"an epoch ({steps} steps): floor {floor:.2f} s, measured {per_step * steps:.2f} s "
        f"({per_step * 1e3:.1f} ms a step): {per_step * steps / floor:.2f}x the floor"
    )
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
