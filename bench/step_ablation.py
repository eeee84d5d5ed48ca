"""Performance options one step at a time: the built-in trainer's step with
every option at its default, and with each named change, in one process,
alternating blocks of steps for many rounds (so every variant sees the same
machine minute by minute). Finer than bench/ablation.py, which times whole
runs through the launcher: a change of a few percent a step is lost in the
noise between runs there.

    python -m bench.step_ablation --change flat_optimizer=false --change inplace_relu=false

With the fused max-pool kernel built (``python -m worker.fused_pool DIR``, as
a worker does; DIR is DDPO_WORKER_EXTENSIONS_DIR's default unless set), the
defaults use it and ``--change fused_pool=false`` compares aten's ops.

Prints each variant's median step and its median ratio to the defaults'
over the rounds, and in how many rounds it was the faster.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ddpo.schemas import JobSpec, Performance
from worker import fused_pool
from worker._process import keep_freed_memory
from worker.settings import WorkerSettings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--change",
        action="append",
        default=[],
        metavar="OPTION=VALUE[,OPTION=VALUE]",
        help="a variant: performance options changed from the defaults (JSON values)",
    )
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--steps", type=int, default=30, help="steps a variant runs per round")
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args(argv)
    keep_freed_memory()  # as the launcher does for the default job
    from bench.floor import step_runner  # torch's allocator settings first

    # The kernel a worker on this machine built, as its ranks load it.
    fused_pool.load(WorkerSettings().extensions_dir)
    print(fused_pool.status())

    variants = {"defaults": Performance()}
    for change in args.change:
        update = {}
        for pair in change.split(","):
            name, _, value = pair.partition("=")
            update[name] = json.loads(value) if value[:1] in '0123456789-[{"tfn' else value
        variants[change] = Performance.model_validate({**Performance().model_dump(), **update})
    steps = {
        name: step_runner(JobSpec(batch_size=args.batch_size, performance=perf), args.batch_size)
        for name, perf in variants.items()
    }
    for step in steps.values():
        for _ in range(10):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for index in range(args.rounds):
        order = list(steps) if index % 2 == 0 else list(steps)[::-1]
        for name in order:
            started = time.perf_counter()
            for _ in range(args.steps):
                steps[name]()
            times[name].append((time.perf_counter() - started) / args.steps)
    base = times["defaults"]
    print(f"threads {torch.get_num_threads()}, batch {args.batch_size}, {args.rounds} rounds")
    print(f"{'variant':<44} {'median ms':>9} {'vs defaults':>11} {'faster in':>9}")
    for name, values in times.items():
        ratios = [v / b for v, b in zip(values, base, strict=True)]
        faster = sum(r < 1 for r in ratios)
        print(
            f"{name:<44} {1e3 * statistics.median(values):9.2f} "
            f"{statistics.median(ratios):11.3f} {faster:>5}/{args.rounds}"
        )


if __name__ == "__main__":
    main()
