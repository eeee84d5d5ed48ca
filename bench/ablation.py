"""Which performance options pay, here: each run trains the same steps
through our launcher (real DDP, real process group) with every option at its
default but one, alternating, and reports the training loop's time per step.

    python -m bench.ablation --data-dir ../shared/data --steps 150 --rounds 2

An option is on by default only where this shows a gain.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench._runs import alternate, bench_parser, run_direct
from ddpo.schemas import JobSpec, Performance, Topology

DEFAULTS = Performance()
# The recipe's way of running: each variant switches one option to it.
RECIPE: dict[str, Any] = {
    "data_pipeline": "torchvision",
    "channels_last": False,
    "pool_before_relu": False,
    "dropout_masks": "bernoulli",
    "keep_freed_memory": False,
    "start_method": "spawn",
    "same_host_allreduce": "gloo",
    "ddp_with_one_rank": True,
    "inplace_relu": False,
    "flat_optimizer": False,
    "fused_pool": False,
}
# Options that are off by default, switched on, and earlier defaults.
OTHERS: list[tuple[str, Any]] = [("gradient_as_bucket_view", True), ("dropout_masks", "uniform")]


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    batch = 128 // args.processes

    def spec(**change: Any) -> JobSpec:
        return JobSpec(
            topology=Topology(num_processes=args.processes),
            batch_size=batch,
            max_steps_per_epoch=args.steps,
            performance=DEFAULTS.model_copy(update=change),
        )

    variants = {"all defaults": spec()}
    for name, value in [*RECIPE.items(), *OTHERS]:
        variants[f"{name}={value}"] = spec(**{name: value})
    variants["recipe's way (all of the above)"] = spec(**RECIPE)

    with tempfile.TemporaryDirectory(prefix="ddpo-bench-") as tmp:
        work = Path(tmp)

        def runner(name: str, job: JobSpec) -> Any:
            def run() -> Any:
                result = run_direct(job, args.data_dir, work)
                result.way = name
                return result

            return run

        runs = alternate(args.rounds, {name: runner(name, job) for name, job in variants.items()})

    print(f"\n1 machine x {args.processes} process(es), batch {batch}, {args.steps} steps")
    base = statistics.mean(r.train_s or 0 for r in runs if r.way == "all defaults") / args.steps
    print(f"{'variant':<32} {'ms/step':>8} {'vs defaults':>12} {'wall s':>8}")
    for name in variants:
        step = statistics.mean(r.train_s or 0 for r in runs if r.way == name) / args.steps
        wall = statistics.mean(r.wall_s for r in runs if r.way == name)
        print(f"{name:<32} {1000 * step:8.1f} {step / base:11.2f}x {wall:8.1f}")


if __name__ == "__main__":
    main()
